"""What the two commands (``python -m gptlib.train`` and ``python -m gptlib.generate``) share.

* :class:`OneLineParser`: argparse that reports a bad argument in one line (rank 0 only).
* Option types that only *parse* (``int``, ``float``); checking a value is the job of the
  configuration's ``__post_init__``, and :func:`config_from_args` turns its ``ValueError`` into a
  one-line usage error.
* :func:`add_config_options`: one option per field of a configuration dataclass, its help text,
  allowed values and flag name read from the field's metadata (:func:`gptlib.config.option`), so
  that a new field of :class:`~gptlib.config.GPTConfig` or :class:`~gptlib.config.TrainConfig`
  becomes an option with no change here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any, NoReturn, TypeVar

from gptlib import distributed

Config = TypeVar("Config")


class UsageError(Exception):
    """A bad command-line value found after parsing (exit status 2)."""


def usage_error(prog: str, message: str) -> int:
    """Print ``prog: error: message`` as one line on stderr (rank 0 only); returns 2."""
    if distributed.is_main_process():
        sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (and only on rank 0 under torchrun)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        usage_error(self.prog, f"{message} (see --help)")
        raise SystemExit(2)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults, keep the examples' line breaks."""


def int_arg(text: str) -> int:
    """An integer (any sign); the configuration checks its range."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def float_arg(text: str) -> float:
    """A finite number; the configuration checks its range."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _flag(field: dataclasses.Field) -> str:
    """``batch_size`` -> ``--batch-size``; a bool that defaults to True -> ``--no-NAME``; or the
    ``flag`` the field's metadata names."""
    if "flag" in field.metadata:
        return field.metadata["flag"]
    name = field.name.replace("_", "-")
    return f"--no-{name}" if field.default is True else f"--{name}"


def add_config_options(
    group: argparse._ActionsContainer, cls: type, skip: tuple[str, ...] = ()
) -> None:
    """One option per field of the dataclass ``cls`` (in its order), except those in ``skip``.

    The help text and allowed values come from the field's metadata; ints and floats parse as
    such (an ``int | None`` field too: its default None means "derived"), and a bool field is a
    switch: ``--no-NAME`` when it defaults to True, ``--NAME`` when False.
    """
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        default, help_text = field.default, field.metadata["help"]
        kw: dict[str, Any] = {"dest": field.name, "default": default, "help": help_text}
        if isinstance(default, bool):
            kw["action"] = "store_false" if default else "store_true"
            kw["help"] = f"off: {help_text}" if default else help_text
        elif "choices" in field.metadata:
            kw["choices"] = field.metadata["choices"]
        elif isinstance(default, float) or str(field.type).startswith("float"):
            kw["type"] = float_arg
        elif isinstance(default, int) or str(field.type).startswith("int"):
            kw["type"] = int_arg
        group.add_argument(_flag(field), **kw)


def config_from_args(
    parser: argparse.ArgumentParser, cls: type[Config], args: argparse.Namespace, **values: Any
) -> Config:
    """``cls(...)`` from the parsed options named like its fields (``values`` override them); a
    value the configuration rejects exits with a one-line usage error (status 2)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {k: v for k, v in vars(args).items() if k in names}
    try:
        return cls(**{**kwargs, **values})
    except ValueError as err:
        message = str(err).removeprefix(f"invalid {cls.__name__}: ")
        parser.error(message)
