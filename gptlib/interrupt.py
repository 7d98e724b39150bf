"""Ctrl-C during training: finish the step, save, then stop (chapter 10's loop).

Python turns Ctrl-C (SIGINT) into a ``KeyboardInterrupt`` wherever the program happens to be:
in the middle of an optimizer step, half the weights could be updated and the other half not.
:class:`DeferredInterrupt` instead notes the first Ctrl-C and lets the loop ask, between two
steps, whether it came; the loop then saves a checkpoint of a consistent state and raises
:class:`TrainingInterrupted`. A second Ctrl-C stops at once, as usual.
"""

from __future__ import annotations

import signal
import threading


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped with Ctrl-C; the message says at which step and what was saved."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "interrupted"


class DeferredInterrupt:
    """``with DeferredInterrupt() as interrupt:`` ... ``if interrupt.requested:`` save and stop.

    Only the main thread can catch signals, and only when Ctrl-C still has Python's default
    handler (someone else may have their own plans for it); otherwise ``requested`` stays False
    and Ctrl-C raises ``KeyboardInterrupt`` immediately, as without this class.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:  # the second Ctrl-C: the user does not want to wait
            signal.signal(signal.SIGINT, self._previous)
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> DeferredInterrupt:
        main = threading.current_thread() is threading.main_thread()
        if self.enabled and main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
