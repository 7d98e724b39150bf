"""What the two commands (``python -m gptlib.train`` and ``python -m gptlib.generate``) share.

* :class:`OneLineParser`: argparse that reports a bad argument in one line (rank 0 only).
* Option types that only *parse* (``int``, ``float``); checking a value is the job of the
  configuration's ``__post_init__``, and :func:`config_from_args` turns its ``ValueError`` into a
  one-line usage error.
* :func:`add_config_options`: one option per field of a configuration dataclass, so that a new
  field of :class:`~gptlib.config.GPTConfig` or :class:`~gptlib.config.TrainConfig` needs one line
  (its help text), not three.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any, NoReturn, TypeVar

from gptlib import distributed
from gptlib.config import ACTIVATIONS, LR_SCHEDULES, NORM_TYPES, NORMS, POSITIONS

CHOICES = {
    "norm": NORMS,
    "norm_type": NORM_TYPES,
    "positions": POSITIONS,
    "activation": ACTIVATIONS,
    "lr_schedule": LR_SCHEDULES,
}
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


def flag_name(field: str, renames: dict[str, str]) -> str:
    """``batch_size`` -> ``--batch-size`` (or the option's new name in ``renames``)."""
    return renames.get(field, "--" + field.replace("_", "-"))


def add_config_options(
    group: argparse._ActionsContainer,
    cls: type,
    helps: dict[str, str],
    renames: dict[str, str] | None = None,
) -> None:
    """One option per field of the dataclass ``cls`` named in ``helps`` (in ``cls``'s order).

    ints and floats parse as such, a field with allowed values lists them (``CHOICES``), and a
    bool field that defaults to True becomes ``--no-NAME`` (False: ``--NAME``).
    """
    renames = renames or {}
    for field in dataclasses.fields(cls):
        if field.name not in helps:
            continue
        flag, default = flag_name(field.name, renames), field.default
        kw: dict[str, Any] = {"dest": field.name, "default": default, "help": helps[field.name]}
        if isinstance(default, bool):
            kw["action"] = "store_false" if default else "store_true"
            flag = renames.get(
                field.name, f"--no-{field.name.replace('_', '-')}" if default else flag
            )
        elif field.name in CHOICES:
            kw["choices"] = CHOICES[field.name]
        elif isinstance(default, (int, float)):
            kw["type"] = int_arg if isinstance(default, int) else float_arg
        group.add_argument(flag, **kw)


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
