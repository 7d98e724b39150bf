"""Is a checkpoint's content what gptlib wrote? Checksums, field checks and refused pickles.

:mod:`gptlib.checkpoint` reads a file with ``weights_only=True`` and then asks this module three
questions before it builds anything from it:

* :func:`tensor_digest`: the SHA-256 of every tensor the file holds (names, dtypes, shapes and
  bytes). It is stored in the checkpoint when saved and compared when loaded, so bytes damaged on
  disk or in a copy are caught instead of surfacing later as a NaN loss.
* :func:`first_problem`: the first field whose type or range is wrong (an edited or damaged file),
  as one sentence that names the field; ``None`` when every field is fine.
* :func:`refused_pickle`: when ``torch.load`` refused a file because it carries pickled Python
  objects (code that unpickling would run), what it tried to load.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickletools
import re
from collections.abc import Iterator
from dataclasses import MISSING, fields
from typing import Any

import torch

from gptlib.config import GPTConfig, TrainConfig
from gptlib.tokenizer import ENCODING_SIZES

DIGEST_KEY = "checksum"  # {"sha256": hex digest of the tensors}; absent in older files


# --------------------------------------------------------------------------------------------
# Checksum
# --------------------------------------------------------------------------------------------


def _tensors(value: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside ``value`` with its path, in the (stored) order of the containers."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            if not (where == "" and k == DIGEST_KEY):
                yield from _tensors(v, f"{where}/{k!r}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{where}/{i}")


def tensor_digest(payload: dict) -> str:
    """SHA-256 over every tensor in a checkpoint's payload: path, dtype, shape, then the bytes."""
    h = hashlib.sha256()
    for where, t in _tensors(payload, ""):
        t = t.detach()
        if t.is_sparse:
            t = t.to_dense()
        h.update(f"{where}|{t.dtype}|{tuple(t.shape)}|".encode())
        flat = t.cpu().contiguous().reshape(-1).view(torch.uint8)
        h.update(memoryview(flat.numpy()))
    return h.hexdigest()


def tensor_bytes(payload: dict) -> int:
    """How many bytes the tensors of a checkpoint's payload take."""
    return sum(t.numel() * t.element_size() for _, t in _tensors(payload, ""))


def digest_problem(raw: dict) -> str | None:
    """Why the stored checksum does not match the tensors (None: it matches, or none is stored)."""
    stored = raw.get(DIGEST_KEY)
    if stored is None:
        return None  # written before checksums existed
    expected = stored.get("sha256") if isinstance(stored, dict) else None
    if not isinstance(expected, str):
        return f"its {DIGEST_KEY} field is malformed ({stored!r:.80})"
    got = tensor_digest(raw)
    if got != expected:
        return (
            f"its tensors do not match the checksum stored with them (sha256 {got[:16]}..., "
            f"expected {expected[:16]}...): the file was damaged on disk or in a copy"
        )
    return None


# --------------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind_problem(value: Any, default: Any, where: str) -> str | None:
    """A field must have the type of its default (an int is fine where a float is expected)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = _is_int(value)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        return None
    return None if ok else f"{where} must be a {type(default).__name__}, got {value!r:.80}"


def dataclass_dict_problem(data: Any, cls: type, where: str) -> str | None:
    """Problems of a config stored as a dict: not a dict, or a field of the wrong type."""
    if not isinstance(data, dict):
        return f"{where} must be a dict, got {type(data).__name__}"
    for f in fields(cls):
        if f.name in data and f.default is not MISSING:
            problem = _kind_problem(data[f.name], f.default, f"{where}[{f.name!r}]")
            if problem:
                return problem
    return None


def _state_problem(state: Any) -> str | None:
    if not isinstance(state, dict):
        return f"model_state must be a dict of tensors, got {type(state).__name__}"
    for name, t in state.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            return f"model_state[{name!r:.60}] must be a tensor under a str name"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return (
                f"model_state[{name!r}] holds {bad:,} non-finite value(s) (NaN or inf): the "
                "weights were saved after training diverged, or the file is damaged"
            )
    return None


def _vocab_problem(ids: Any, size: Any, encoding: str | None) -> str | None:
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not ids.is_floating_point():
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)) or not all(_is_int(i) for i in ids):
        return "vocab must be a list of integer token ids"
    limit = ENCODING_SIZES.get(encoding or "cl100k_base")
    bad = [i for i in ids if i < 0 or (limit is not None and i >= limit)]
    if bad:
        span = f"0..{limit - 1}" if limit is not None else ">= 0"
        return f"vocab holds ids outside {encoding or 'cl100k_base'}'s range {span}: {bad[:5]}"
    if list(ids) != sorted(set(ids)):
        return "vocab ids must be distinct and sorted"
    if len(ids) != size:
        return f"vocab has {len(ids)} ids but model_config['vocab_size'] is {size!r}"
    return None


def _optimizer_problem(state: Any) -> str | None:
    if state is None:
        return None
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        return "optimizer_state must be a dict with 'state' and 'param_groups'"
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups
    ):
        return "optimizer_state['param_groups'] must be a list of dicts with 'params'"
    return None


def _history_problem(history: Any) -> str | None:
    if history is None:
        return None
    ok = isinstance(history, dict) and all(
        isinstance(k, str)
        and isinstance(v, list)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        for k, v in history.items()
    )
    return None if ok else "extra['history'] must map names to lists of numbers"


def _extra_problem(extra: Any) -> str | None:
    if extra is None:
        return None
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        return f"extra must be a dict with str keys, got {type(extra).__name__}"
    encoding = extra.get("encoding")
    if encoding is not None and not (isinstance(encoding, str) and encoding in ENCODING_SIZES):
        known = ", ".join(ENCODING_SIZES)
        return f"extra['encoding'] must be a tiktoken encoding ({known}), got {encoding!r:.60}"
    return _history_problem(extra.get("history"))  # the rest of extra is the caller's own


def first_problem(raw: dict) -> str | None:
    """The first field of a checkpoint's contents with a wrong type or range, as a sentence that
    names it (None when all are fine). Shapes are checked later, against the rebuilt model."""
    version, step = raw.get("version"), raw.get("step")
    if not _is_int(version) or version < 1:
        return f"version must be a positive integer, got {version!r:.60}"
    if not _is_int(step) or step < 0:
        return f"step must be an integer >= 0, got {step!r:.60}"
    extra = raw.get("extra")
    encoding = extra.get("encoding") if isinstance(extra, dict) else None
    config = raw.get("model_config")
    size = config.get("vocab_size") if isinstance(config, dict) else None
    train = raw.get("train_config")
    return (
        dataclass_dict_problem(config, GPTConfig, "model_config")
        or _state_problem(raw.get("model_state"))
        or (None if train is None else dataclass_dict_problem(train, TrainConfig, "train_config"))
        or _extra_problem(extra)
        or _vocab_problem(raw.get("vocab"), size, encoding if isinstance(encoding, str) else None)
        or _optimizer_problem(raw.get("optimizer_state"))
    )


# --------------------------------------------------------------------------------------------
# Pickled code
# --------------------------------------------------------------------------------------------

_CODE = (
    re.compile(r"GLOBAL ([\w.]+)"),  # a function or class the file asks to import and call
    re.compile(r"Trying to call reduce for unrecognized function (\S+)"),
)


def refused_pickle(message: str, path: str | os.PathLike | None = None) -> str | None:
    """Why ``torch.load(weights_only=True)`` refused a file that carries pickled Python objects,
    from its error ``message`` (or, for a bare pickle, from reading its opcodes without running
    them), as a clause; None when the file looks damaged rather than unsafe."""
    if "Weights only load failed" not in message and "WeightsUnpickler" not in message:
        return None
    for pattern in _CODE:
        found = pattern.search(message)
        if found:
            return f"it holds pickled Python code (it asks to import and call {found.group(1)})"
    imports = pickle_imports(path) if path is not None else []
    if imports:
        return f"it is a pickle of Python objects that imports {', '.join(imports[:3])}"
    return None


def pickle_imports(path: str | os.PathLike, max_ops: int = 100_000) -> list[str]:
    """The callables a bare pickle file would import, read with :mod:`pickletools` (which only
    parses the opcodes, never runs them); empty for anything that is not such a pickle."""
    found, strings = [], []
    try:
        with open(path, "rb") as f:
            for n, (op, arg, _) in enumerate(pickletools.genops(f)):
                if op.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(".".join(strings[-2:]))
                elif op.name in ("REDUCE", "INST", "OBJ") and not found:
                    found.append(f"an object ({op.name})")
                if isinstance(arg, str):
                    strings.append(arg)
                if n >= max_ops or op.name == "STOP":
                    break
    except Exception:  # damaged or not a pickle at all: report what was seen before the damage
        pass
    return list(dict.fromkeys(found))
