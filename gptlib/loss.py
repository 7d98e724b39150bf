"""The next-token loss: mean cross-entropy, computed so that a CPU step stays fast (chapter 9).

``cross_entropy(logits, targets)`` is the mean of ``logsumexp(logits) - logits[target]`` over all
positions, the value of :func:`torch.nn.functional.cross_entropy` (up to float rounding). On a
CPU it is computed a few rows at a time, with the gradient ``softmax(logits) - one_hot(target)``
written in one pass: PyTorch's own version materialises ``log_softmax`` and a zero-filled gradient
of the full (N, V) size, which dominates a CPU training step when V is large (100,070 for the
book's full vocabulary); this one runs about twice as fast there. Other devices use PyTorch's.
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


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T`` against ``targets``.

    hidden: (..., C), weight: (V, C), targets: (...).
    """
    return cross_entropy(F.linear(hidden, weight), targets)
