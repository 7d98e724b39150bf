"""The next-token loss: mean cross-entropy, computed so that a CPU step stays fast (chapter 9).

``cross_entropy(logits, targets)`` is the mean of ``logsumexp(logits) - logits[target]`` over all
positions, the value of :func:`torch.nn.functional.cross_entropy` (up to float rounding). On a
CPU it is computed a few rows at a time, with the gradient ``softmax(logits) - one_hot(target)``
written in one pass: PyTorch's own version materialises ``log_softmax`` and a zero-filled gradient
of the full (N, V) size, which dominates a CPU training step when V is large (100,070 for the
book's full vocabulary); this one runs about twice as fast there. Other devices use PyTorch's.

``linear_cross_entropy(hidden, weight, targets)`` is the output layer and that loss in one step,
``cross_entropy(F.linear(hidden, weight), targets)``: the model's training forward pass calls it.
With a large vocabulary on a CPU it goes a block of vocabulary columns at a time and never holds
the (N, V) logits or their gradient, which makes a step of the book's model faster; chapter 9's
optional section builds it by hand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose softmax work stays in the CPU cache, ~1 MB of logits at a time."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        N, V = logits.shape
        rows = max(1, (1 << 18) // V)  # ~1 MB of float32 logits per chunk
        lse = torch.empty(N, dtype=logits.dtype, device=logits.device)  # (N,)
        for i in range(0, N, rows):
            lse[i : i + rows] = torch.logsumexp(logits[i : i + rows], dim=-1)
        ctx.save_for_backward(logits, lse, targets)
        ctx.rows = rows
        picked = logits.gather(1, targets[:, None]).squeeze(1)  # (N,) the targets' logits
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, targets = ctx.saved_tensors
        N = logits.shape[0]
        scale = grad_out / N
        grad = torch.empty_like(logits)  # (N, V): (softmax - one_hot) * scale
        for i in range(0, N, ctx.rows):
            chunk = grad[i : i + ctx.rows]
            torch.sub(logits[i : i + ctx.rows], lse[i : i + ctx.rows, None], out=chunk)
            chunk.exp_().mul_(scale)
        grad[torch.arange(N, device=grad.device), targets] -= scale
        return grad, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` (..., V) against integer ``targets`` (...)."""
    V = logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, V), targets.reshape(-1).long()  # (N, V), (N,)
    if logits.device.type != "cpu":
        return F.cross_entropy(flat_logits, flat_targets)
    if flat_logits.dtype != torch.float64:
        flat_logits = flat_logits.float()  # bf16/fp16 logits: sum the exponentials in fp32
    return _ChunkedCrossEntropy.apply(flat_logits, flat_targets)


# ---- the output layer and the loss together (chapters 9-10) ----------------------------------

# From which vocabulary size the fused path pays off on a CPU (benchmarks/crossover.py,
# interleaved rounds). It recomputes the logits in the backward pass (one more matrix multiply) and
# saves writing and reading the (N, V) logits and their gradient. A whole training step, book
# shape (N = 64, C = 64, tied embeddings), plain / fused time:
# - a 2-core AMD EPYC, 32 MB L3, busy with other jobs (the first version of the fused path):
#   V = 8,192: 0.77-0.96x; 16,384: 0.75-1.04x; 32,768: 1.01-1.13x; 100,070: 1.11-1.40x; the output
#   layer and loss alone at N = 256 and 768: 1.06-1.85x from 32,768;
# - a 2-core Intel Xeon with AVX-512 and a 480 MB L3 (this version, `--step --rounds 3`):
#   V = 8,192 to 65,536: 1.00-1.03x; 100,070: 1.18x; the layer and loss alone at N = 256 and 768:
#   1.83-2.24x from 16,384-32,768, and at N = 64 about even (0.95-1.06x at 65,536 and 100,070).
FUSED_MIN_VOCAB = 32_768
# ... and up to which width: recomputing a logit in the backward pass costs C multiply-adds, so a
# wide model pays more for it than it saves. SmolLM2's LoRA step (C = 576, V = 49,152, N = 256,
# frozen output layer, one thread, interleaved rounds on a busy 2-core machine): the plain path
# was 3-10% faster. The book's C = 64 is where the fused path wins; widths between 64 and 576
# are not measured, 256 is a guess between the two.
FUSED_MAX_WIDTH = 256
_CHUNK_FLOATS = 1 << 18  # ~1 MB of float32 logits per chunk: it stays in the CPU's L2 cache


def _vocab_chunk(N: int, V: int) -> int:
    """Columns per chunk: ~1 MB of (N, cols) logits, at least 256 columns, at most V."""
    return min(V, max(256, _CHUNK_FLOATS // max(N, 1)))


def _sum_exp_shifted(
    weight: torch.Tensor, hidden_t: torch.Tensor, shift: torch.Tensor, cols: int
) -> torch.Tensor:
    """``sum_v exp(logit[n, v] - shift[n])`` for every row n, a block of vocabulary columns at a
    time: (N,). The column sums of each (cols, N) block are one matrix product with a row of ones,
    cheaper on a CPU than a reduction over the block's rows."""
    N = hidden_t.shape[1]
    ones = torch.ones(1, cols, dtype=hidden_t.dtype)  # (1, cols)
    total = torch.zeros(1, N, dtype=hidden_t.dtype)  # (1, N)
    for i in range(0, weight.shape[0], cols):
        block = weight[i : i + cols] @ hidden_t  # (cols, N): this block's logits, transposed
        block.sub_(shift).exp_()
        total.addmm_(ones[:, : block.shape[0]], block)  # += the block's column sums
    return total.squeeze(0)


def _logsumexp_blocks(weight: torch.Tensor, hidden_t: torch.Tensor, cols: int) -> torch.Tensor:
    """``logsumexp`` of every row of ``(weight @ hidden_t).T`` (N,), each block shifted by its own
    maximum: safe for any logits (the path for a row whose logits overflow the faster one)."""
    starts = range(0, weight.shape[0], cols)
    parts = torch.empty(len(starts), hidden_t.shape[1], dtype=hidden_t.dtype)  # (blocks, N)
    for k, i in enumerate(starts):
        parts[k] = torch.logsumexp(weight[i : i + cols] @ hidden_t, dim=0)  # (N,)
    return torch.logsumexp(parts, dim=0)


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T``, a block of vocabulary columns at a time.

    Forward: each row's loss is ``log(sum_v exp(logit_v - logit_target))``. Shifting by the
    target's own logit (instead of the row's maximum, which would cost one more pass over every
    block) keeps the sum >= 1, since the target contributes exp(0); only a row where some logit
    beats the target's by more than ~88 overflows float32, and then the whole batch is computed
    again with each block shifted by its maximum. Backward recomputes each block's logits (one
    extra matrix multiply, cheaper than writing and reading the (N, V) logits and their gradient),
    turns them into the softmax in place, and adds that block's share to grad_hidden and writes its
    rows of grad_weight; the mean's 1/N and the one-hot part of ``softmax - one_hot`` are applied
    once, to the small (N, C) tensors.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
        N, V = hidden.shape[0], weight.shape[0]  # hidden (N, C), weight (V, C), targets (N,)
        cols = _vocab_chunk(N, V)
        hidden_t = hidden.T.contiguous()  # (C, N): w @ hidden_t is the faster product on a CPU
        picked = (hidden * weight[targets]).sum(dim=1)  # (N,) the targets' logits
        total = _sum_exp_shifted(weight, hidden_t, picked, cols)  # (N,), >= 1 unless overflowed
        if bool(torch.isfinite(total).all()):
            losses = total.log()  # (N,) = logsumexp - picked
        else:  # a logit beyond float32's exp, or a NaN: the safe path (NaN stays NaN)
            losses = _logsumexp_blocks(weight, hidden_t, cols) - picked
        ctx.save_for_backward(hidden, hidden_t, weight, targets, losses + picked)
        ctx.cols = cols
        return losses.mean()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, hidden_t, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        scale = grad_out / hidden.shape[0]  # d(mean)/d(each row's loss)
        scaled_hidden = hidden * scale  # (N, C): grad_weight's block = softmax.T-block @ this
        grad_h = torch.zeros_like(hidden) if need_h else None  # (N, C), times scale at the end
        grad_w = torch.empty(weight.shape, dtype=weight.dtype) if need_w else None  # (V, C)
        for i in range(0, weight.shape[0], ctx.cols):
            w = weight[i : i + ctx.cols]  # (cols, C)
            p = w @ hidden_t  # (cols, N): the block's logits again, transposed
            p.sub_(lse).exp_()  # the block's softmax probabilities
            if need_h:
                grad_h.addmm_(p.T, w)  # (N, C)
            if need_w:
                torch.mm(p, scaled_hidden, out=grad_w[i : i + ctx.cols])  # (cols, C)
        # the one-hot part: each row's target column gets -1 (times scale)
        if need_h:
            grad_h = (grad_h - weight[targets]) * scale
        if need_w:
            grad_w.index_add_(0, targets, scaled_hidden, alpha=-1)
        return grad_h, grad_w, None


def _fused_applies(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """The fused path is for fp32/fp64 on a CPU, without autocast, a large vocabulary and a
    narrow model."""
    return (
        hidden.device.type == "cpu"
        and weight.device.type == "cpu"
        and hidden.dtype == weight.dtype
        and hidden.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled("cpu")
        and weight.shape[0] >= FUSED_MIN_VOCAB
        and hidden.shape[-1] <= FUSED_MAX_WIDTH
    )


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T`` against ``targets`` (chapters 9-10).

    hidden: (..., C), weight: (V, C), targets: (...) with ids in 0..V-1. The value (and the
    gradients of hidden and weight) are those of ``cross_entropy(F.linear(hidden, weight),
    targets)`` up to float rounding. On a CPU with a large vocabulary (``V >= FUSED_MIN_VOCAB``),
    a narrow model (``C <= FUSED_MAX_WIDTH``), fp32/fp64 and no autocast, the two are computed
    together a block of vocabulary columns at a time, so the (N, V) logits and their gradient
    never exist in memory. Otherwise it is exactly that expression: small logits stay in the cache
    anyway; a wide model's logits cost more to recompute than to keep; bf16 autocast keeps
    PyTorch's bf16 matrix multiply; and on a GPU one large cuBLAS product should beat a Python loop
    of small ones (not measured: no GPU was available when the cross-over was measured).
    """
    C = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != C or targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"expected hidden (..., C), weight (V, C) and targets (...) with hidden's leading "
            f"shape, got hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, targets "
            f"{tuple(targets.shape)}"
        )
    if not _fused_applies(hidden, weight):
        return cross_entropy(F.linear(hidden, weight), targets)
    flat_t = targets.reshape(-1).long()  # (N,)
    V = weight.shape[0]
    if flat_t.numel() and (int(flat_t.min()) < 0 or int(flat_t.max()) >= V):
        lo, hi = int(flat_t.min()), int(flat_t.max())
        raise IndexError(f"targets must be token ids in 0..{V - 1}, got ids from {lo} to {hi}")
    return _LinearCrossEntropy.apply(hidden.reshape(-1, C), weight, flat_t)
