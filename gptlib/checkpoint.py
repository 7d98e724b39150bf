"""Saving and loading trained models: "where is the trained model stored?"

A checkpoint is one file written by :func:`torch.save` that holds everything needed to use or to
keep training a model: the weights, the optimizer's state, the model and training configurations,
the compact vocabulary (if any), the step reached and the random-number states.

Two promises:

* **Atomic writes.** :func:`save_checkpoint` writes to a temporary file in the same folder, flushes
  it to disk and then renames it over the real name. A crash mid-save leaves the previous
  checkpoint untouched (and no half-written file under the real name).
* **Safe loads.** :func:`load_checkpoint` reads with ``torch.load(..., weights_only=True)``, which
  only rebuilds tensors and plain containers (dict, list, tuple, str, numbers). A file that carries
  arbitrary pickled Python objects, which could run code when unpickled, is refused with a
  :class:`CheckpointError`, and so are truncated files and files whose weights do not match their
  configuration. For that reason configs and the vocabulary are stored as plain dicts and lists,
  never as pickled objects.
"""

from __future__ import annotations

import os
import pickle
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptlib.config import GPTConfig, TrainConfig
from gptlib.distributed import unwrap
from gptlib.files import atomic_write
from gptlib.integrity import (
    DIGEST_KEY,
    digest_problem,
    first_problem,
    refused_pickle,
    tensor_bytes,
    tensor_digest,
)
from gptlib.model import GPT
from gptlib.rundir import disk_full_error
from gptlib.tokenizer import Vocabulary

FORMAT = "gptlib-checkpoint"
VERSION = 1
DEFAULT_NAME = "checkpoint.pt"  # the file name used inside an output folder
BEST_NAME = "best.pt"  # beside it: the evaluation with the lowest validation loss
REQUIRED_KEYS = ("format", "version", "model_state", "model_config", "step")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unsafe, truncated, corrupt or does not fit the model."""


@dataclass
class Checkpoint:
    """Everything a checkpoint holds, rebuilt into live objects."""

    model: GPT  # rebuilt from the saved config, weights loaded, in eval mode
    model_config: GPTConfig
    train_config: TrainConfig | None
    vocab: Vocabulary | None
    step: int
    optimizer_state: dict | None
    extra: dict = field(default_factory=dict)  # RNG states, history, encoding name, ...


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.Size)


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is made of types that ``weights_only`` loading accepts."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, f"{where} key")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}; a checkpoint may only hold tensors, numbers, "
        "strings, None, and lists/tuples/dicts of them (so that it loads with weights_only=True)"
    )


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    train_config: TrainConfig | None = None,
    vocab: Vocabulary | None = None,
    step: int = 0,
    extra: dict | None = None,
) -> Path:
    """Write a checkpoint atomically and return its path.

    ``model`` is a :class:`~gptlib.model.GPT` (a DistributedDataParallel wrapper is unwrapped).
    ``extra`` may hold tensors, numbers, strings and containers of them (checked before writing).
    The bytes go to a hidden temporary file next to ``path``, are flushed with ``fsync``, and the
    file is renamed over ``path`` with :func:`os.replace`; on any error the temporary file is
    removed and an existing checkpoint under ``path`` is left as it was.
    """
    path = Path(path)
    model = unwrap(model)
    if not isinstance(model, GPT):
        raise TypeError(f"save_checkpoint expects a gptlib GPT model, got {type(model).__name__}")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_state": model.state_dict(),
        "model_config": model.config.to_dict(),
        "train_config": asdict(train_config) if train_config is not None else None,
        "vocab": list(vocab.ids) if vocab is not None else None,
        "step": int(step),
        "optimizer_state": optimizer.state_dict() if optimizer is not None else None,
        "extra": dict(extra or {}),
    }
    _check_plain(payload["extra"], "extra")
    _check_plain(payload["train_config"], "train_config")
    payload[DIGEST_KEY] = {"sha256": tensor_digest(payload)}  # checked again by read_checkpoint
    try:
        return atomic_write(path, lambda f: torch.save(payload, f))
    except (OSError, RuntimeError) as err:  # a full disk shows up as either
        full = disk_full_error(err, path, tensor_bytes(payload) + (1 << 16))
        if full is None:
            raise
        raise full from None


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def resolve_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``path/checkpoint.pt`` when ``path`` is a folder."""
    path = Path(path)
    return path / DEFAULT_NAME if path.is_dir() else path


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """The raw, validated contents of a checkpoint file (dicts, lists and tensors only).

    Raises :class:`CheckpointError` for a missing, unsafe, truncated or foreign file.
    """
    path = resolve_path(path)
    if not path.exists():
        raise CheckpointError(
            f"no checkpoint at {path}: check the path, or train a model first "
            "(python -m gptlib.train CORPUS --out DIR writes DIR/checkpoint.pt)"
        )
    if not path.is_file():
        raise CheckpointError(f"{path} is not a file; pass the path of a checkpoint file")
    raw = _torch_load(path, map_location)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        hint = ""
        if isinstance(raw, dict) and raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
            hint = " (it looks like a bare state_dict: load it with model.load_state_dict)"
        raise CheckpointError(f"{path} is a PyTorch file but not a gptlib checkpoint{hint}")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise CheckpointError(f"{path} is an incomplete gptlib checkpoint: missing {missing}")
    if isinstance(raw["version"], int) and raw["version"] > VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {raw['version']!r}, newer than this gptlib "
            f"understands ({VERSION}); upgrade gptlib"
        )
    damage = digest_problem(raw)
    if damage:
        raise CheckpointError(
            f"{path} is damaged: {damage}. It was not loaded; restore it from a backup or "
            "re-create it"
        )
    problem = first_problem(raw)
    if problem:
        raise CheckpointError(
            f"{path} is not a valid gptlib checkpoint: {problem}. Was it edited by hand or "
            "damaged? Restore it from a backup or re-create it"
        )
    return raw


def _torch_load(path: Path, map_location: Any) -> Any:
    """``torch.load(weights_only=True)`` with every failure turned into one CheckpointError."""
    try:
        with warnings.catch_warnings():  # torch's note on unusual pickle protocols: noise here
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        code = refused_pickle(str(err), path)
        if code:  # the file asks to import and call Python objects: never do that
            raise CheckpointError(
                f"refusing to load {path}: {code}. It was refused for safety: unpickling it could "
                "run arbitrary code. gptlib checkpoints only hold tensors and plain data, so only "
                "use such a file if it comes from a source you trust"
            ) from None
        raise CheckpointError(
            f"{path} is corrupt or was not written by torch.save ({_first_line(err)[:200]}); "
            "it was not loaded. Re-create it, or restore it from a backup"
        ) from None
    except Exception as err:  # a damaged zip or pickle fails in many ways, all of them here
        raise CheckpointError(
            f"{path} is truncated or corrupt ({type(err).__name__}: {_first_line(err)[:200]}); "
            "was the save interrupted or the copy incomplete? Re-create it or restore a backup"
        ) from None


# older field names -> today's
_RENAMED = {"norm": "norm_placement", "layer_norm_eps": "norm_eps"}


def migrate_model_config(data: dict) -> dict:
    """A model_config dict written by an older gptlib, in today's fields.

    - A config from before ``scale_embeddings`` existed did not scale the token embeddings.
    - ``norm`` is now ``norm_placement``, and ``layer_norm_eps`` is ``norm_eps``.
    - The feed-forward width had two fields, ``ffn_mult`` and ``ffn_hidden`` (0: from
      ``ffn_mult``); it is now ``d_ff`` alone.
    - ``n_kv_heads=0`` meant "as many as n_heads"; that is now ``None``.
    """
    data = {"scale_embeddings": False, **data}
    data = {_RENAMED.get(key, key): value for key, value in data.items()}
    if "ffn_mult" in data or "ffn_hidden" in data:
        mult, hidden = data.pop("ffn_mult", 4), data.pop("ffn_hidden", 0)
        d_model = data.get("d_model")
        if hidden or not (isinstance(mult, int) and isinstance(d_model, int)):
            data.setdefault("d_ff", hidden or mult)  # a bad value fails GPTConfig's checks
        else:
            width = mult * d_model
            swiglu = data.get("activation") == "swiglu"
            data.setdefault("d_ff", round(2 * width / 3) if swiglu else width)
    if data.get("n_kv_heads") == 0:
        data["n_kv_heads"] = None
    return data


def config_from_dict(data: Any, path: Path | str = "the checkpoint") -> GPTConfig:
    """Rebuild a :class:`GPTConfig` (migrated from older names, see
    :func:`migrate_model_config`), turning bad or unknown fields into a CheckpointError."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: model_config is not a dict, got {type(data).__name__}")
    data = migrate_model_config(data)
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CheckpointError(
            f"{path}: model_config has fields this gptlib does not know: {unknown}; "
            "it was probably written by a newer gptlib"
        )
    try:
        return GPTConfig(**data)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its model_config is invalid ({err})") from None


def train_config_from_dict(data: Any) -> TrainConfig | None:
    """Rebuild a TrainConfig (fields this version does not know are ignored)."""
    if data is None:
        return None
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in data.items() if k in known})


def vocab_from_checkpoint(raw: dict, path: Path | str = "the checkpoint") -> Vocabulary | None:
    """The compact vocabulary a checkpoint stores (None for a model of all the encoding's ids),
    checked against the model's ``vocab_size``."""
    ids = raw.get("vocab")
    if ids is None:
        return None
    try:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        vocab = Vocabulary(tuple(int(i) for i in ids))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its vocabulary is invalid ({err})") from None
    size = (raw.get("model_config") or {}).get("vocab_size")
    if len(vocab) != size:
        raise CheckpointError(
            f"{path}: the vocabulary has {len(vocab)} tokens but the model has "
            f"vocab_size={size}; the checkpoint is inconsistent"
        )
    return vocab


def load_state_into(model: GPT, state: dict, path: Path | str = "the checkpoint") -> None:
    """``model.load_state_dict(state)`` with a CheckpointError that says what does not match."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        details = " ".join(str(err).split())
        if len(details) > 300:
            details = details[:300] + "..."
        raise CheckpointError(
            f"the weights in {path} do not match the model configuration ({details}); the "
            "checkpoint was edited or belongs to a different model: rebuild the model from the "
            "checkpoint's own config (load_checkpoint does this)"
        ) from None


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> Checkpoint:
    """Load a checkpoint safely (``weights_only=True``) and rebuild the model in eval mode.

    ``path`` may be the file or the folder that holds ``checkpoint.pt``. ``map_location`` is
    passed to :func:`torch.load`; when it is a device (string or ``torch.device``) the model is
    moved there. Raises :class:`CheckpointError` with a message that says what is wrong.
    """
    file = resolve_path(path)
    raw = read_checkpoint(file, map_location)
    config = config_from_dict(raw["model_config"], file)
    model = GPT(config)
    load_state_into(model, raw["model_state"], file)
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)
    vocab = vocab_from_checkpoint(raw, file)
    try:
        train_config = train_config_from_dict(raw.get("train_config"))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{file}: its train_config is invalid ({err})") from None
    return Checkpoint(
        model=model.eval(),
        model_config=config,
        train_config=train_config,
        vocab=vocab,
        step=int(raw["step"]),
        optimizer_state=raw.get("optimizer_state"),
        extra=dict(raw.get("extra") or {}),
    )
