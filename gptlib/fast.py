"""The fast paths: the same maths as the book's code, computed faster on a CPU (chapter 10).

Nothing here is new mathematics. Each function equals a piece of :mod:`gptlib.model` or
:mod:`gptlib.train` up to float rounding, says which one in its docstring, and is checked against
it in ``tests/test_fast.py``. Training uses these paths when ``TrainConfig.fast`` is True (the
default of :func:`gptlib.train.train` and of the command line); :func:`gptlib.train.train_step`
called by hand runs the book's code unless it is given ``fast=True``.

Where the time goes in a CPU step of the book's model (vocabulary 100,070, 64 positions):

* **the output layer and the loss** (:func:`linear_cross_entropy`): the (N, V) logits and their
  gradient are far larger than the rest of the model; computing them a block of vocabulary
  columns at a time keeps each block in the CPU cache and never writes the whole table;
* **the loss alone** (:func:`cross_entropy`): PyTorch's materialises ``log_softmax`` and a
  zero-filled gradient of the full size; this one writes ``softmax - one_hot`` in one pass;
* **attention with dropout** (:func:`causal_attention_with_dropout`):
  ``F.scaled_dot_product_attention`` has no CPU kernel with dropout and falls back to a dozen small
  operations; this takes four;
* **the tied embedding** (:func:`token_lookup`): with a tied output layer the loss already gives
  the shared (V, C) matrix a dense gradient; the lookup then adds only the rows it used;
* **clipping** (:func:`clipped_step`): the global norm from one dot product per large gradient,
  and the clipping factor applied inside fused AdamW's own pass over the weights.

:class:`FastLoss` puts the first four together into the training loss of a :class:`GPT`;
:func:`train_step` is :func:`gptlib.train.train_step` with all five.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from gptlib.checks import check_token_ids
from gptlib.distributed import unwrap
from gptlib.model import GPT, MultiHeadAttention, Rope, TransformerBlock, merge_heads

# From which vocabulary size the block-wise output layer pays off on a CPU (measured with
# benchmarks/crossover.py, interleaved rounds, book shape: N = 64, C = 64, tied embeddings). It
# recomputes the logits in the backward pass (one more matrix multiply) and saves writing and
# reading the (N, V) logits and their gradient. Whole training step, plain / block-wise time:
# - a 2-core AMD EPYC with a 32 MB L3: V = 8,192: 0.77-0.96x; 16,384: 0.75-1.04x; 32,768:
#   1.01-1.13x; 100,070: 1.11-1.40x;
# - a 2-core Intel Xeon with AVX-512 and a 480 MB L3 (`--step --rounds 3`): V = 8,192 to 65,536:
#   1.00-1.03x; 100,070: 1.18x; the layer and loss alone at N = 256 and 768: 1.83-2.24x from
#   16,384-32,768, and at N = 64 about even (0.95-1.06x at 65,536 and 100,070).
FUSED_MIN_VOCAB = 32_768
# ... and up to which width: recomputing a logit in the backward pass costs C multiply-adds, so a
# wide model pays more for it than it saves. SmolLM2's LoRA step (C = 576, V = 49,152, N = 256,
# frozen output layer, one thread): the plain path was 3-10% faster. The book's C = 64 is where
# the fused path wins; widths between 64 and 576 are not measured, so 256 is a guess between them.
FUSED_MAX_WIDTH = 256
_CHUNK_FLOATS = 1 << 18  # ~1 MB of float32 logits per chunk: it stays in the CPU's L2 cache

# ---- the loss (equals F.cross_entropy, chapter 9) -----------------------------------------------


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose softmax work stays in the CPU cache, ~1 MB of logits at a time."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        N, V = logits.shape
        rows = max(1, _CHUNK_FLOATS // V)  # ~1 MB of float32 logits per chunk
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
    """Mean next-token cross-entropy of ``logits`` (..., V) against integer ``targets`` (...).

    Equals ``F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))``, the loss of
    :meth:`gptlib.model.GPT.forward` (test: ``test_cross_entropy_matches_pytorch``). On a CPU it
    goes ~1 MB of logits at a time with the gradient written in one pass; elsewhere it is
    PyTorch's.
    """
    V = logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, V), targets.reshape(-1).long()  # (N, V), (N,)
    if logits.device.type != "cpu":
        return F.cross_entropy(flat_logits, flat_targets)
    if flat_logits.dtype != torch.float64:
        flat_logits = flat_logits.float()  # bf16/fp16 logits: sum the exponentials in fp32
    return _ChunkedCrossEntropy.apply(flat_logits, flat_targets)


# ---- the output layer and the loss together (chapters 9-10) -------------------------------------


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
    beats the target's by more than about 77 to 89 (ln of float32's largest number minus the log of
    how many logits are that large) overflows, and then the whole batch is computed again with
    each block shifted by its maximum. Backward recomputes each block's logits (one
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

    Equals ``F.cross_entropy(F.linear(hidden, weight), targets)``, the output layer and loss of
    :meth:`gptlib.model.GPT.forward`, in value and in the gradients of hidden and weight (tests:
    ``test_fused_matches_linear_then_cross_entropy`` and its neighbours).
    hidden: (..., C), weight: (V, C), targets: (...) with ids in 0..V-1. On a CPU with a large
    vocabulary (``V >= FUSED_MIN_VOCAB``; fp32/fp64, no autocast) the two are computed together a
    block of vocabulary columns at a time, so the (N, V) logits and their gradient never exist in
    memory; chapter 9's optional section builds it by hand. Otherwise it is
    :func:`cross_entropy` of ``F.linear(hidden, weight)``: small logits stay in the cache anyway,
    bf16 autocast keeps PyTorch's bf16 matrix multiply, and on a GPU one large product should beat
    a Python loop of small ones (not measured: no GPU was available for the cross-over).
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
    check_token_ids(targets, weight.shape[0], "targets")
    flat_t = targets.reshape(-1).long()  # (N,)
    return _LinearCrossEntropy.apply(hidden.reshape(-1, C), weight, flat_t)


# ---- attention with dropout on a CPU (chapters 5-7 and 10) --------------------------------------


def causal_attention_with_dropout(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """Causal attention with dropout on the weights: q, k, v (B, H, T, hs) -> (B, H, T, hs).

    Equals ``F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)``, which is
    :func:`gptlib.model.scaled_dot_product_attention` with the causal mask, up to which weights
    dropout zeroes (tests: ``test_cpu_dropout_attention_matches_the_fused_kernel`` and
    ``test_fast_attention_is_used_only_where_pytorch_is_slow``). PyTorch's function has no CPU
    kernel with dropout and falls back to a dozen small operations; this takes four: scale, mask
    and QKᵀ in one ``baddbmm``, softmax, dropout, weighted sum.
    """
    B, H, T, hs = q.shape
    q3, k3, v3 = (t.reshape(B * H, T, hs) for t in (q, k, v))  # (B*H, T, hs) each
    above = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1)  # (T, T)
    scores = torch.baddbmm(above, q3, k3.transpose(1, 2), alpha=1.0 / math.sqrt(hs))  # (B*H, T, T)
    weights = F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=True)
    return torch.bmm(weights, v3).view(B, H, T, hs)  # (B, H, T, hs)


def attention(attn: MultiHeadAttention, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:
    """``attn(x, rope=rope)`` (:meth:`gptlib.model.MultiHeadAttention.forward`, no cache), with
    :func:`causal_attention_with_dropout` where PyTorch's kernel would be slow: fused attention,
    training with dropout, on a CPU. x: (B, T, C) -> (B, T, C)."""
    slow_kernel = attn.fused and attn.training and attn.dropout > 0.0 and x.device.type == "cpu"
    if not slow_kernel or x.shape[1] < 2:
        return attn(x, rope=rope)
    q, k, v = attn.project_qkv(x, rope)  # (B, H, T, hs), (B, G, T, hs), (B, G, T, hs)
    out = causal_attention_with_dropout(q, *attn.share_kv(k, v), attn.dropout)  # (B, H, T, hs)
    return attn.resid_dropout(attn.W_o(merge_heads(out)))  # (B, T, C)


def block(blk: TransformerBlock, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:
    """:meth:`gptlib.model.TransformerBlock.forward` (no cache) with :func:`attention`."""
    if blk.norm_placement == "pre":
        x = x + attention(blk.attn, blk.ln1(x), rope)
        return x + blk.ffn(blk.ln2(x))
    x = blk.ln1(x + attention(blk.attn, x, rope))
    return blk.ln2(x + blk.ffn(x))


# ---- the tied embedding lookup (chapters 2 and 12) ----------------------------------------------


def token_lookup(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """``model.token_embedding(idx)``: (B, T) -> (B, T, C), the rows of the token table.

    With a tied output layer the loss already gives the shared (V, C) matrix a dense gradient;
    the lookup then adds only the rows it used (a sparse gradient) instead of a second, mostly
    zero (V, C) matrix. Untied, the table keeps an ordinary dense gradient. Same values and
    gradients (test: ``test_sparse_tied_lookup_gives_the_dense_gradient``).
    """
    tied = model.config.tie_embeddings
    return F.embedding(idx.long(), model.token_embedding.weight, sparse=tied)  # (B, T, C)


# ---- the training loss of a GPT -----------------------------------------------------------------


class FastLoss(nn.Module):
    """The training loss of ``model`` through the fast paths: ``FastLoss(model)(idx, targets)``
    returns ``(None, loss)``, where ``loss`` equals ``model(idx, targets)[1]`` (test:
    ``test_fast_loss_matches_the_model``; the logits are never built whole).

    A module, so that DistributedDataParallel can wrap it: its only parameters are the model's.
    """

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[None, torch.Tensor]:
        m = self.model
        m.check_input(idx)
        x = m.add_positions(token_lookup(m, idx))  # (B, T, C)
        rope = m.rope(0, idx.shape[1])
        for blk in m.blocks:
            x = block(blk, x, rope)  # (B, T, C)
        m.check_targets(idx, targets)
        return None, linear_cross_entropy(m.final_norm(x), m.lm_head.weight, targets)


def loss_of(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The training loss of a :class:`GPT` (or one inside a wrapper) through :class:`FastLoss`."""
    inner = unwrap(model)
    return (inner if isinstance(inner, FastLoss) else FastLoss(inner))(idx, targets)[1]


# ---- clipping folded into the optimizer step (chapter 10) ---------------------------------------

_DOT_MIN = 1 << 16  # gradients this large get their sum of squares from one dot product


def grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The global gradient norm: the square root of the sum of every gradient entry squared, as
    a 0-d tensor. Equals ``torch.nn.utils.get_total_norm`` of the gradients, the norm
    ``clip_grad_norm_`` uses (test: ``test_grad_norm_matches_pytorch``); a large float32/64
    gradient's sum of squares is one dot product with itself (one BLAS pass, about twice as fast
    on a CPU as a norm), the small ones go through one ``_foreach_norm``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    big, small = [], []
    for g in grads:
        g = g.coalesce().values() if g.is_sparse else g
        dot_ok = g.numel() >= _DOT_MIN and g.dtype in (torch.float32, torch.float64)
        (big if dot_ok else small).append(g.reshape(-1))
    squares = [torch.dot(g, g).float() for g in big]
    squares += [n.float().square() for n in torch._foreach_norm(small)] if small else []
    return torch.stack([s.to(grads[0].device) for s in squares]).sum().sqrt()


def clip_factor(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """What gradient clipping multiplies every gradient by: ``min(1, max_norm / (norm + 1e-6))``,
    ``clip_grad_norm_``'s formula, as a 0-d tensor (no wait for the GPU; test:
    ``test_clip_factor_is_pytorchs``)."""
    return (max_norm / (grad_norm(parameters) + 1e-6)).clamp(max=1.0)


def clipped_step(optimizer: torch.optim.Optimizer, factor: torch.Tensor | None = None) -> None:
    """``optimizer.step()`` with every gradient multiplied by ``factor`` first: with
    ``factor = clip_factor(...)``, equals ``clip_grad_norm_`` then ``step()`` (test:
    ``test_clipped_step_matches_clip_grad_norm_then_step``).

    A fused Adam/AdamW applies the factor inside its own pass over the weights, through the
    ``grad_scale`` hook that PyTorch's ``GradScaler`` uses (it divides the gradients by it and
    stores the results back): one pass over every gradient saved. Other optimizers get an
    explicit in-place multiply.
    """
    if factor is None:
        optimizer.step()
        return
    adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
    if adam and optimizer.defaults.get("fused"):
        optimizer.grad_scale = 1.0 / factor  # (a 0-d tensor) the gradients are divided by it
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale
        return
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    for grad in grads:
        grad.mul_(factor.to(grad.device))
    optimizer.step()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_clip: float = 0.0,
) -> float:
    """:func:`gptlib.train.train_step` through the fast paths (test:
    ``test_fast_train_step_matches_the_book_step``). ``model``: a :class:`GPT`, a
    :class:`FastLoss`, or either inside DistributedDataParallel (wrap a FastLoss, so that the
    wrapper sees the forward pass)."""
    loss_model = FastLoss(model) if isinstance(model, GPT) else model
    loss_model.train()
    _, loss = loss_model(x, y)  # the mean next-token cross-entropy
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    factor = clip_factor(loss_model.parameters(), grad_clip) if grad_clip > 0 else None
    clipped_step(optimizer, factor)
    return loss.item()
