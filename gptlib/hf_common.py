"""What the two Hugging Face bridges share (GPT-2 in :mod:`gptlib.hf`, Llama in
:mod:`gptlib.hf_llama`): importing ``transformers`` only when needed, checking a converted state
dict against gptlib's shapes, building the model from it, and the messages for missing weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gptlib.model import GPT, GPTConfig

# What a local folder must hold: the configuration and the weights (one of the weight files).
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
# GPTConfig fields that do not change any tensor's shape, so they may differ from the checkpoint
RUNTIME_FIELDS = ("dropout", "fused_attention")


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights are neither on disk nor downloadable (for instance offline)."""


def import_transformers():
    """The ``transformers`` module, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "gptlib.hf needs the Hugging Face 'transformers' package, which is not installed: "
            "pip install 'gptlib[hf]' (or pip install transformers)"
        ) from err
    return transformers


def check_runtime_overrides(overrides: Mapping[str, Any], what: str = "from_hf") -> None:
    """Only :data:`RUNTIME_FIELDS` may be overridden when weights come from a checkpoint."""
    bad = sorted(set(overrides) - set(RUNTIME_FIELDS))
    if bad:
        raise ValueError(
            f"{what} can only override {RUNTIME_FIELDS}, got {bad}: the other fields are fixed "
            "by the checkpoint's tensor shapes"
        )


def _expected_shapes(config: GPTConfig) -> dict[str, torch.Size]:
    """Every tensor gptlib's GPT has for ``config``, built on the meta device (no memory)."""
    with torch.device("meta"):
        reference = GPT(config)
    return {k: v.shape for k, v in reference.state_dict().items()}


def _listed(names: list[str]) -> str:
    return f"{names[:6]}{' ...' if len(names) > 6 else ''}"


def check_state_dict(sd: Mapping[str, torch.Tensor], config: GPTConfig, what: str) -> None:
    """Raise ValueError naming every missing, unexpected or mis-shaped tensor of ``sd``."""
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    wrong = [
        f"{k}: {tuple(sd[k].shape)} instead of {tuple(s)}"
        for k, s in expected.items()
        if k in sd and sd[k].shape != s
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected {_listed(unexpected)}")
        if wrong:
            parts.append("wrong shapes: " + "; ".join(wrong[:6]))
        raise ValueError(
            f"{what} does not match the configuration ({config.n_blocks} blocks, d_model "
            f"{config.d_model}, vocab {config.vocab_size}, context {config.context_length}): "
            + "; ".join(parts)
            + ". Build the configuration from the checkpoint with config_from_hf(...)."
        )


def build_model(config: GPTConfig, sd: dict[str, torch.Tensor], training: bool) -> GPT:
    """A gptlib ``GPT`` holding copies of the tensors of ``sd`` (gptlib's names), a tied tensor
    copied once, in the given train/eval mode."""
    copies: dict[int, torch.Tensor] = {}
    for key, value in sd.items():
        if id(value) not in copies:
            copies[id(value)] = value.detach().clone()
        sd[key] = copies[id(value)]
    with torch.device("meta"):  # no time spent on a random initialisation we would overwrite
        model = GPT(config)
    model.load_state_dict(sd, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True made two Parameters; share one again
        model.lm_head.weight = model.token_embedding.weight
    model.make_position_tables(model.token_embedding.weight.device)  # were made on 'meta'
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"internal error: tensors left uninitialised after loading: {left[:6]}")
    return model.train(training)


def looks_like_path(name: str) -> bool:
    """A Hub id is 'name' or 'owner/name'; anything else we read as a (missing) folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def check_local_dir(path: Path, example_repo: str) -> None:
    """Raise PretrainedUnavailableError unless ``path`` holds a config and a weights file."""
    missing = []
    if not (path / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES[:2]))
    if missing:
        raise PretrainedUnavailableError(
            f"the folder {path} does not hold a Hugging Face checkpoint: missing "
            f"{', '.join(missing)}. It needs {CONFIG_FILE} and model.safetensors, for example "
            f"from https://huggingface.co/{example_repo}/tree/main or from "
            "model.save_pretrained(folder)."
        )


def unavailable_message(
    name: str, repo_id: str, cache_dir: str | os.PathLike | None, size_note: str = ""
) -> str:
    """Why the weights ``name`` (the Hub repository ``repo_id``) could not be had, and the three
    ways to get them."""
    from huggingface_hub import constants

    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    offline = " (offline mode: HF_HUB_OFFLINE=1)" if constants.is_offline_mode() else ""
    asked = f"'{name}', that is '{repo_id}'" if name != repo_id else f"'{repo_id}'"
    url = f"https://huggingface.co/{repo_id}"
    files = f"{CONFIG_FILE} model.safetensors"
    cache_opt = f" --cache-dir {cache}" if cache_dir is not None else ""
    folder = repo_id.rsplit("/", 1)[-1] + "-weights"
    return (
        f"could not load the pretrained weights {asked}: they are not in the Hugging Face cache "
        f"({cache}) and could not be downloaded{offline}.\n"
        f"Two files from {url} are needed: {CONFIG_FILE} and model.safetensors{size_note}. "
        "Any one of these works:\n"
        f"  1. with internet access, call from_pretrained({name!r}) again, or fill the cache "
        f"first with\n       hf download {repo_id} {files}{cache_opt}\n"
        "     (older huggingface_hub: huggingface-cli download ...); offline runs then find them;\n"
        "  2. on another machine with internet access, run\n"
        f"       hf download {repo_id} {files} --local-dir {folder}\n"
        f"     copy the {folder} folder here and call from_pretrained('{folder}');\n"
        f"  3. download {url}/resolve/main/{CONFIG_FILE} and {url}/resolve/main/model.safetensors "
        "into one folder yourself and pass that folder's path."
    )
