"""The two configurations: the model's (:class:`GPTConfig`) and a run's (:class:`TrainConfig`).

This is the one place that defines each of them. ``GPTConfig()`` with its defaults *is* the
book's running example (chapters 2-8 build it piece by piece); every allowed value of a switch is
written once, here, and so is every field's help text (in the field's ``metadata``): the command
lines (:mod:`gptlib.commands`) build their options from these fields. :func:`resolve_device` turns
a device name such as ``"auto"`` into a ``torch.device``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

NORM_PLACEMENTS = ("pre", "post")  # where the norm sits relative to the residual add (chapter 8)
NORM_TYPES = ("layernorm", "rmsnorm")  # LayerNorm (chapter 8) or RMSNorm (chapter 13)
# a fixed sin/cos table added to the tokens (chapter 3), a trained table, or rotary position
# embeddings that turn queries and keys inside attention (chapter 13)
POSITIONS = ("sinusoidal", "learned", "rope")
# the feed-forward non-linearity (chapter 8); "swiglu" is the gated network of chapter 13
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
LR_SCHEDULES = ("constant", "cosine")  # chapter 10


def _positive_ints(obj: object, names: tuple[str, ...], minimum: int = 1) -> list[str]:
    """One problem per field of ``names`` that is not an integer >= ``minimum``."""
    problems = []
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            problems.append(f"{name} must be {what}, got {value!r}")
    return problems


def _choices(obj: object) -> list[str]:
    """One problem per field whose value is not among its ``choices`` (see :func:`option`)."""
    return [
        f"{f.name} must be one of {f.metadata['choices']}, got {getattr(obj, f.name)!r}"
        for f in fields(obj)  # type: ignore[arg-type]
        if "choices" in f.metadata and getattr(obj, f.name) not in f.metadata["choices"]
    ]


def option(default: Any, help: str, **more: Any) -> Any:
    """A dataclass field with its description, the one place a field is described: its help
    text, and in ``more`` its allowed values (``choices``) or a command-line ``flag`` name that
    differs from the field's."""
    return field(default=default, metadata={"help": help, **more})


@dataclass
class GPTConfig:
    """Every size and switch of the model. The defaults are the book's running example."""

    vocab_size: int = option(100_070, "rows of the embedding table (largest id + 1)")
    context_length: int = option(16, "T: the most tokens the model sees")
    d_model: int = option(64, "C: width of every token vector")
    n_heads: int = option(4, "H: attention heads; must divide d_model")
    n_blocks: int = option(8, "transformer blocks stacked on top of each other")
    d_ff: int | None = option(None, "feed-forward hidden width; default 4*d_model (SwiGLU: 2/3)")
    n_kv_heads: int | None = option(None, "heads of keys and values (ch. 13); default n_heads")
    dropout: float = option(0.1, "dropout rate (training only)")
    norm_placement: str = option(
        "pre", "where the norm sits: before or after each sub-layer", choices=NORM_PLACEMENTS
    )
    norm_type: str = option(
        "layernorm", "which norm: LayerNorm or RMSNorm (ch. 13)", choices=NORM_TYPES
    )
    positions: str = option("sinusoidal", "position encoding (rope: chapter 13)", choices=POSITIONS)
    rope_base: float = option(10_000.0, "RoPE base: pair i turns by pos * base^(-2i/head_size)")
    scale_embeddings: bool = option(True, "token embeddings times sqrt(d_model) (chapter 3)")
    activation: str = option(
        "relu", "feed-forward activation (swiglu: ch. 13)", choices=ACTIVATIONS
    )
    bias: bool = option(True, "biases in Linear and LayerNorm layers")
    tie_embeddings: bool = option(False, "share the token embedding with the output layer")
    final_norm: bool = option(True, "a norm after the last block (needed with pre-norm)")
    norm_eps: float = option(1e-5, "the epsilon of LayerNorm or RMSNorm")
    fused_attention: bool = option(False, "F.scaled_dot_product_attention, not the book's steps")

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "context_length", "d_model", "n_heads", "n_blocks")
        problems = _positive_ints(self, sizes)
        optional = tuple(n for n in ("d_ff", "n_kv_heads") if getattr(self, n) is not None)
        problems += [p + " (or None for the default)" for p in _positive_ints(self, optional)]
        problems += _choices(self)
        if not problems:
            self._fill_in_widths()
            problems += self._head_problems()
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positions == "sinusoidal" and not problems and self.d_model % 2:
            problems.append(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.positions == "rope" and not problems and self.head_size % 2:
            problems.append(f"RoPE turns pairs of numbers: head size {self.head_size} must be even")
        if not (math.isfinite(self.rope_base) and self.rope_base > 1.0):
            problems.append(f"rope_base must be a number > 1, got {self.rope_base}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            problems.append(f"norm_eps must be a small positive number, got {self.norm_eps}")
        if problems:
            raise ValueError("invalid GPTConfig: " + "; ".join(problems))

    def _head_problems(self) -> list[str]:
        if self.d_model % self.n_heads != 0:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0][:8]
            return [
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) so that "
                f"every head gets the same size; try n_heads in {divisors}"
            ]
        if self.n_heads % self.n_kv_heads:
            divisors = [g for g in range(1, self.n_heads + 1) if self.n_heads % g == 0]
            return [
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads}) so that "
                f"every key/value head serves the same number of query heads; try {divisors}"
            ]
        return []

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_heads

    def _fill_in_widths(self) -> None:
        """The two sizes left out (None) are worked out from the others, once, here.

        ``n_kv_heads`` defaults to ``n_heads``: every query head has its own keys and values, as in
        chapters 4-7. ``d_ff`` defaults to 4 * d_model (chapter 8). SwiGLU has three matrices
        instead of two, so its default is 2/3 of that, which keeps the parameter count (chapter 13).

        The filled-in numbers are ordinary field values: ``dataclasses.replace(config,
        d_model=128)`` keeps ``d_ff``, so pass ``d_ff=None`` (and ``n_kv_heads=None``) with it to
        have them worked out again.
        """
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_ff is None:
            four = 4 * self.d_model
            self.d_ff = round(2 * four / 3) if self.activation == "swiglu" else four

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainConfig:
    """Every knob of a training run (chapter 10). Defaults suit the book's small model on a CPU."""

    batch_size: int = option(4, "windows per step, per process")
    max_iters: int = option(2000, "optimizer steps in the whole run (the schedule's horizon)")
    learning_rate: float = option(1e-3, "peak learning rate", flag="--lr")
    warmup_iters: int = option(0, "linear warm-up steps")
    lr_schedule: str = option(
        "constant", "cosine decays to min_lr at max_iters", choices=LR_SCHEDULES
    )
    min_lr: float = option(1e-4, "the learning rate at the end of the cosine")
    weight_decay: float = option(0.1, "AdamW decay of weight matrices and embeddings")
    beta1: float = option(0.9, "AdamW beta1")
    beta2: float = option(0.95, "AdamW beta2")
    grad_clip: float = option(1.0, "max global gradient norm; 0 disables clipping")
    eval_interval: int = option(100, "estimate the losses every this many steps (and at the last)")
    eval_iters: int = option(20, "batches per loss estimate")
    seed: int = option(1337, "seeds batches and dropout (on the command line also the weights)")
    device: str = option("auto", "auto (cuda > mps > cpu), cpu, cuda[:N] or mps")
    autocast_bf16: bool = option(
        True,
        "bf16 autocast, used only on CUDA GPUs with native bf16 (Ampere and newer)",
        flag="--no-bf16",
    )
    checkpoint_interval: int = option(0, "also save every this many steps (0: only at the end)")
    fast: bool = option(True, "gptlib.fast's speed paths: the same maths, faster on a CPU")

    def __post_init__(self) -> None:
        problems = _positive_ints(self, ("batch_size", "max_iters", "eval_interval", "eval_iters"))
        problems += _positive_ints(self, ("warmup_iters", "checkpoint_interval"), minimum=0)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            problems.append(f"learning_rate must be a positive number, got {self.learning_rate}")
        problems += _choices(self)
        if not (math.isfinite(self.min_lr) and self.min_lr >= 0):
            problems.append(f"min_lr must be >= 0, got {self.min_lr}")
        elif self.lr_schedule == "cosine" and self.min_lr > self.learning_rate:
            problems.append(
                f"min_lr ({self.min_lr}) must not exceed learning_rate ({self.learning_rate})"
            )
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            problems.append(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if not isinstance(self.device, str) or not self.device:
            problems.append(f"device must be a string such as 'auto' or 'cpu', got {self.device!r}")
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``"auto"`` -> the best available device (cuda > mps > cpu); else the named one, checked.

    Under torchrun, a bare ``"cuda"`` means this process's GPU, ``cuda:LOCAL_RANK``.
    """
    mps = getattr(torch.backends, "mps", None)
    mps_ok = mps is not None and mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("mps") if mps_ok else torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but CUDA is not available; use cpu/auto")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    elif device.type == "mps" and not mps_ok:
        raise ValueError("device 'mps' was requested but MPS is not available; use cpu or auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    return device
