"""How much memory a model needs, estimated from its configuration before anything is allocated.

A run that cannot fit should stop at once with the numbers, not after tens of seconds of
swapping and a traceback from deep inside PyTorch. :func:`training_bytes` and
:func:`generation_bytes` count what a step keeps alive (the training loop of chapter 10 and the
generation loop of chapter 11); :func:`available_bytes` asks the machine what is free, and
:func:`check_fits` compares the two.

The counts are deliberately simple: every tensor that lives through a training step, at 4 bytes a
float. Training keeps four numbers per parameter (the weight, its gradient and AdamW's two
moving averages) plus the activations that back-propagation needs: per token and block a few
vectors of width ``d_model``, the feed-forward hidden layer, the attention weights of every head
(unless the fused kernel is used), and the (B, T, V) logits with their gradient.
tests/test_memory.py measures a real step against the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gptlib.config import GPTConfig
from gptlib.fast import FUSED_MIN_VOCAB

FLOAT_BYTES = 4  # float32 weights, gradients, optimizer state and activations


class NotEnoughMemoryError(ValueError):
    """A configuration needs more memory than the machine has free (nothing was allocated)."""


def _norm_params(c: GPTConfig) -> int:
    bias = c.bias and c.norm_type == "layernorm"  # RMSNorm has a gain only
    return c.d_model * (2 if bias else 1)


def parameter_count(c: GPTConfig) -> int:
    """The number of parameters :class:`~gptlib.model.GPT` builds for ``c`` (a tied output layer
    counted once), computed from the sizes alone."""
    C, F, kv = c.d_model, c.d_ff, c.n_kv_heads * c.head_size
    attention = 2 * C * C + 2 * C * kv + (2 * C + 2 * kv if c.bias else 0)
    if c.activation == "swiglu":
        ffn = 3 * C * F + (2 * F + C if c.bias else 0)
    else:
        ffn = 2 * C * F + (F + C if c.bias else 0)
    block = 2 * _norm_params(c) + attention + ffn
    total = c.vocab_size * C + c.n_blocks * block
    total += c.context_length * C if c.positions == "learned" else 0
    total += _norm_params(c) if c.final_norm else 0
    total += 0 if c.tie_embeddings else c.vocab_size * C
    return total


def _activation_floats_per_token(c: GPTConfig, T: int, dropout: bool, device_type: str) -> int:
    """Floats a training step keeps per token for back-propagation (all blocks, no logits)."""
    C, F, H, kv = c.d_model, c.d_ff, c.n_heads, c.n_kv_heads * c.head_size
    per_block = 10 * C + 2 * kv  # norms in/out, q k v, heads joined, projections, residuals
    per_block += (4 if c.activation == "swiglu" else 2) * F  # hidden layer before/after
    if c.n_kv_heads != H:
        per_block += 2 * C  # keys and values repeated for every query head
    if not c.fused_attention or (dropout and device_type == "cpu"):  # weights materialised
        per_block += (3 if dropout else 2) * H * T  # scores, softmax, dropped weights
    return c.n_blocks * per_block + 4 * C  # + embeddings and the final norm


@dataclass(frozen=True)
class Estimate:
    """Bytes by what holds them; ``total`` is what :func:`check_fits` compares."""

    weights: int
    training_state: int  # gradients and AdamW's two averages (0 for generation)
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.training_state + self.activations + self.logits


def training_bytes(c: GPTConfig, batch_size: int, device_type: str = "cpu") -> Estimate:
    """Memory one training step of ``batch_size`` windows of ``c.context_length`` tokens needs
    on a device of type ``device_type`` (on a CPU a large vocabulary's logits are never held
    whole: :func:`gptlib.fast.linear_cross_entropy` goes a block of columns at a time)."""
    P, N = parameter_count(c), batch_size * c.context_length
    per_token = _activation_floats_per_token(c, c.context_length, c.dropout > 0, device_type)
    logits = N * c.vocab_size  # (B, T, V)
    if device_type == "cpu" and c.vocab_size >= FUSED_MIN_VOCAB:
        logits = min(logits, max(N * 256, 1 << 18))  # one block of columns
    return Estimate(
        weights=P * FLOAT_BYTES,
        training_state=3 * P * FLOAT_BYTES,
        activations=N * per_token * FLOAT_BYTES,
        logits=2 * logits * FLOAT_BYTES,  # the logits and their gradient
    )


def generation_bytes(c: GPTConfig, batch_size: int, prompt_length: int, new_tokens: int) -> int:
    """Memory :func:`~gptlib.generate.generate` needs: the weights, the KV cache (two (B, H, T,
    hs) buffers per block), one forward pass over a window, and every token id (8 bytes each,
    and the text they decode to, a few bytes each)."""
    T = min(c.context_length, prompt_length + new_tokens)
    B = batch_size
    cache = 2 * c.n_blocks * B * T * c.n_kv_heads * c.head_size
    one_block = _activation_floats_per_token(c, T, False, "cpu") // c.n_blocks
    window = B * T * (one_block + c.d_ff)  # a forward pass frees each block's tensors
    floats = parameter_count(c) + cache + window + B * T * c.vocab_size
    ids = B * (prompt_length + new_tokens) * (8 + 8)  # the (B, T0 + n) ids, decoded text
    return floats * FLOAT_BYTES + ids


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Free memory on ``device``: the GPU's free memory for CUDA, otherwise the machine's
    available memory (capped by a container's limit); None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = _meminfo_available()
    limit = _cgroup_room()
    if free is None or limit is None:
        return free if limit is None else limit
    return min(free, limit)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux: psutil, when it is installed
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _cgroup_room(root: str = "/sys/fs/cgroup") -> int | None:
    """What a cgroup v2 memory limit still allows (None: no limit)."""
    try:
        limit = Path(root, "memory.max").read_text().strip()
        used = int(Path(root, "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def human(n: int | float) -> str:
    """Bytes as a short string: 1.5 GB, 320 MB, 12 kB (powers of 1000)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} bytes"


def check_fits(
    needed: int, what: str, hint: str, device: torch.device | str = "cpu", free: int | None = None
) -> None:
    """Raise :class:`NotEnoughMemoryError` when ``needed`` bytes exceed what is free on
    ``device`` (``free`` overrides the measurement). ``what`` names the job, ``hint`` how to
    shrink it; nothing happens when the free memory cannot be told."""
    free = available_bytes(device) if free is None else free
    if free is not None and needed > free:
        where = "on the GPU" if torch.device(device).type == "cuda" else "in memory"
        raise NotEnoughMemoryError(
            f"{what} needs about {human(needed)}, but only {human(free)} is available {where}; "
            f"{hint}"
        )
