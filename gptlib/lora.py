"""LoRA, low-rank adaptation (chapter 14): fine-tune a few small matrices beside frozen weights.

A linear layer computes ``W x``. LoRA freezes ``W`` (d_out, d_in) and learns a change of rank
``r`` written as two thin matrices, ``A`` (r, d_in) and ``B`` (d_out, r):

    y = W x + (alpha / r) * B A x

``B`` starts at zero, so before the first step the adapted model *is* the base model. After
training, :func:`merge_lora` folds ``W + (alpha / r) B A`` back into plain layers, and
:func:`save_adapter` writes only ``A`` and ``B`` (a few MB next to a model of hundreds).
The names ``lora_A`` and ``lora_B`` and the initialisation (``A`` like ``nn.Linear``'s weights,
``B`` zero) are those of the ``peft`` library, so the two compute the same function.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gptlib.files import atomic_write_bytes
from gptlib.model import GPT

FORMAT = "gptlib-lora-adapter"
VERSION = 2  # 2 adds "base_sha256", the fingerprint of the weights the adapter was trained on
DEFAULT_TARGETS = ("attn.W_q", "attn.W_v")  # as in the LoRA paper: queries and values


class AdapterError(ValueError):
    """An adapter file that cannot be read, or that does not fit the model."""


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank change: ``W x + (alpha/r) B A x``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator=None) -> None:
        super().__init__()
        if not isinstance(rank, int) or rank < 1 or rank > min(base.in_features, base.out_features):
            raise ValueError(
                f"rank must be an integer from 1 to {min(base.in_features, base.out_features)} "
                f"for a {base.out_features} x {base.in_features} layer, got {rank!r}"
            )
        self.base = base.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, float(alpha), alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(
            torch.empty(rank, base.in_features, dtype=w.dtype, device=w.device)
        )
        self.lora_B = nn.Parameter(
            torch.zeros(base.out_features, rank, dtype=w.dtype, device=w.device)
        )
        # nn.Linear's (and peft's) initialisation for A: uniform in +-1/sqrt(d_in)
        bound = 1.0 / math.sqrt(base.in_features)
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound, generator=generator)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> (..., d_out)."""
        low = F.linear(F.linear(x, self.lora_A), self.lora_B)  # (..., d_out) through rank r
        return self.base(x) + self.scale * low

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding ``W + (alpha/r) B A`` (and the bias): the same function."""
        out = nn.Linear(
            self.base.in_features, self.base.out_features, bias=self.base.bias is not None
        )
        out = out.to(dtype=self.base.weight.dtype, device=self.base.weight.device)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.scale * (self.lora_B @ self.lora_A))
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias)
        return out.requires_grad_(False)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    return model.get_submodule(".".join(path)) if path else model, leaf


def target_names(model: GPT, targets: tuple[str, ...] = DEFAULT_TARGETS) -> list[str]:
    """The full module names LoRA adapts: each target (``"attn.W_q"``...) in every block."""
    names = [f"blocks.{i}.{t}" for i in range(len(model.blocks)) for t in targets]
    for name in names[: len(targets)]:
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            layer = None
        if not isinstance(layer, (nn.Linear, LoRALinear)):
            raise ValueError(
                f"{name} is not a linear layer of this model; LoRA targets are a block's linear "
                "layers, such as attn.W_q, attn.W_k, attn.W_v, attn.W_o, ffn.gate, ffn.up, ffn.down"
            )
    return names


def apply_lora(
    model: GPT,
    rank: int = 8,
    alpha: float = 16.0,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
    seed: int = 0,
) -> list[str]:
    """Freeze every weight of ``model`` and wrap the ``targets`` of every block in a
    :class:`LoRALinear` (in place). Returns the adapted layers' names."""
    names = target_names(model, tuple(targets))
    if any(isinstance(model.get_submodule(n), LoRALinear) for n in names):
        raise ValueError("the model already has LoRA layers; merge_lora(model) first")
    model.requires_grad_(False)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name in names:
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, LoRALinear(getattr(parent, leaf), rank, alpha, generator))
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every :class:`LoRALinear` in ``model``, by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora(model: nn.Module) -> int:
    """Replace every LoRA layer by the plain layer ``W + (alpha/r) B A`` (in place); returns how
    many were merged. The model then has its original structure and no trainable adapter."""
    layers = lora_layers(model)
    for name, layer in layers.items():
        parent, leaf = _parent(model, name)
        setattr(parent, leaf, layer.merged())
    return len(layers)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter's tensors (``...lora_A``, ``...lora_B``), detached, on the CPU."""
    return {
        k: v.detach().cpu().clone()
        for k, v in model.state_dict().items()
        if k.endswith((".lora_A", ".lora_B"))
    }


def base_fingerprint(model: nn.Module, names: list[str]) -> str:
    """SHA-256 of the frozen weights (and biases) of the layers ``names``, adapted or not: an
    adapter only makes sense on the exact weights it was trained beside."""
    digest = hashlib.sha256()
    for name in names:
        layer = model.get_submodule(name)
        layer = layer.base if isinstance(layer, LoRALinear) else layer
        for tensor in (layer.weight, layer.bias):
            if tensor is not None:
                raw = tensor.detach().cpu().contiguous().flatten().view(torch.uint8)
                digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
                digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def save_adapter(model: GPT, path: str | os.PathLike) -> Path:
    """Write the adapter (A and B of every LoRA layer, with its rank, alpha, targets and a
    fingerprint of the frozen weights beside it) to ``path`` atomically, through a temporary
    file renamed into place: a crash leaves the old file or the new one, never half of one."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers to save; call apply_lora(model) first")
    first = next(iter(layers.values()))
    targets = sorted({n.split(".", 2)[2] for n in layers})
    c = model.config
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "rank": first.rank,
        "alpha": first.alpha,
        "targets": targets,
        "model": {"n_blocks": c.n_blocks, "d_model": c.d_model, "n_heads": c.n_heads},
        "base_sha256": base_fingerprint(model, sorted(layers)),
        "tensors": adapter_state(model),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def _read_adapter(path: Path) -> dict:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise AdapterError(f"no adapter file at {path}") from None
    except Exception as err:  # a truncated file, another format: torch raises many kinds
        raise AdapterError(f"{path} is not a readable adapter file: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise AdapterError(f"{path} is not a gptlib LoRA adapter (written by save_adapter)")
    if payload.get("version") not in (1, VERSION):  # version 1: no fingerprint to check
        raise AdapterError(f"{path} has adapter format version {payload.get('version')!r}")
    return payload


def _check_fits(payload: dict, model: GPT, path: Path) -> None:
    c, saved = model.config, payload["model"]
    ours = {"n_blocks": c.n_blocks, "d_model": c.d_model, "n_heads": c.n_heads}
    if saved != ours:
        raise AdapterError(
            f"the adapter {path} was trained for a model with {saved}, this model has {ours}: "
            "load it into the model it was trained on"
        )


def _check_base(payload: dict, model: GPT, path: Path) -> None:
    names = [f"blocks.{i}.{t}" for i in range(len(model.blocks)) for t in payload["targets"]]
    if (
        "base_sha256" in payload
        and base_fingerprint(model, sorted(names)) != payload["base_sha256"]
    ):
        raise AdapterError(
            f"the adapter {path} was trained beside other weights than this model's (same shape, "
            "different numbers, e.g. the base model instead of the instruct one): load it into "
            "the model it was trained on, or pass check_base=False to load it anyway"
        )


def load_adapter(model: GPT, path: str | os.PathLike, check_base: bool = True) -> list[str]:
    """Add the adapter saved at ``path`` to ``model`` (its base weights frozen, as in training)
    and return the adapted layers' names. Raises :class:`AdapterError`, saying why, for a file
    that is not an adapter, that does not fit the model's shape, or (unless ``check_base`` is
    false) that was trained beside other weights than the model's."""
    path = Path(path)
    payload = _read_adapter(path)
    _check_fits(payload, model, path)
    if check_base:
        _check_base(payload, model, path)
    if not lora_layers(model):
        apply_lora(model, payload["rank"], payload["alpha"], tuple(payload["targets"]))
    expected = {k: v.shape for k, v in adapter_state(model).items()}
    tensors = payload["tensors"]
    wrong = sorted(set(expected) ^ set(tensors))
    wrong += [
        f"{k} {tuple(tensors[k].shape)}"
        for k in expected
        if k in tensors and tensors[k].shape != expected[k]
    ]
    if wrong:
        raise AdapterError(
            f"the adapter {path} does not match the model's LoRA layers (rank "
            f"{payload['rank']}, targets {payload['targets']}): {wrong[:4]}"
        )
    model.load_state_dict(tensors, strict=False)
    return sorted(lora_layers(model))
