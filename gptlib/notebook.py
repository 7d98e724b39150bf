"""Helpers for the book's notebooks: numbers for the prose that read the same on every machine.

The chapters quote numbers they compute (myst-nb's ``glue``). A float's full ``repr`` changes in
its last digits with the CPU, the thread count or the math library, so a stored notebook would
stop matching a reader's re-run. :func:`glue` keeps only the significant digits the prose needs;
:func:`portable` is the rounding on its own, for numbers a cell prints.
"""

from __future__ import annotations

import math
import numbers

import torch

DIGITS = 4  # significant digits kept by default: far above float32 noise, enough for any prose


def portable(value: object, digits: int = DIGITS) -> object:
    """``value`` rounded to ``digits`` significant digits if it is a float (or a one-element tensor
    or NumPy number); integers, booleans and strings come back unchanged."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"glue one number at a time, got a tensor of shape {tuple(value.shape)}"
            )
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalars
        value = value.item()
    if isinstance(value, (bool, str, numbers.Integral)):
        return value
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value) or value == 0.0:
            return value
        return float(f"{value:.{digits}g}")
    raise TypeError(f"can only glue numbers and strings, got {type(value).__name__}")


def glue(name: str, value: object, digits: int = DIGITS) -> None:
    """Store ``value`` under ``name`` for the prose (``{glue:text}`name:.2f```), rounded to
    ``digits`` significant digits so that the stored notebook matches a re-run on any CPU.

    Needs ``myst-nb`` (installed with the book's requirements).
    """
    from myst_nb import glue as myst_glue

    myst_glue(name, portable(value, digits), display=False)
