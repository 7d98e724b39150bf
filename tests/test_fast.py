"""gptlib.fast against the book's code it replaces: each fast path gives the same values and
gradients as the function its docstring names (the output layer and loss together, the loss alone,
the CPU attention with dropout, the sparse tied lookup, clipping inside fused AdamW, and whole
training steps)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import random_ids, tiny_model

from gptlib import fast as loss
from gptlib.fast import (
    FastLoss,
    causal_attention_with_dropout,
    clip_factor,
    clipped_step,
    cross_entropy,
    grad_norm,
    linear_cross_entropy,
)
from gptlib.fast import attention as fast_attention
from gptlib.train import TrainConfig, make_optimizer, train_step

pytestmark = pytest.mark.usefixtures("single_thread")

# float32 sums of a few thousand terms, taken in another order: equal to ~1e-6 relative
TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture
def always_fused(monkeypatch):
    """Take the fused path at every vocabulary size, with small blocks (256 columns each)."""
    monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", 1)
    monkeypatch.setattr(loss, "_CHUNK_FLOATS", 1)


def reference(h: torch.Tensor, W: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, W).reshape(-1, W.shape[0]), t.reshape(-1))


def value_and_grads(fn, h: torch.Tensor, W: torch.Tensor, t: torch.Tensor):
    h, W = h.detach().requires_grad_(), W.detach().requires_grad_()
    value = fn(h, W, t)
    value.backward()
    return value.detach(), h.grad, W.grad


def make(N: int, C: int, V: int, seed: int = 0, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, C, generator=g)
    W = torch.randn(V, C, generator=g) * scale / C**0.5
    return h, W, torch.randint(V, (N,), generator=g)


@pytest.mark.parametrize(
    "N, C, V",
    [(1, 4, 3), (5, 8, 256), (7, 16, 1000), (64, 64, 777), (3, 32, 2049), (300, 8, 600)],
)
@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: logits in the hundreds (no overflow)
def test_fused_matches_linear_then_cross_entropy(always_fused, N, C, V, scale):
    h, W, t = make(N, C, V, scale=scale)
    mine = value_and_grads(linear_cross_entropy, h, W, t)
    assert mine[0].grad_fn is None  # detached copy; the op itself is checked below
    theirs = value_and_grads(reference, h, W, t)
    # softmax - one_hot cancels when the target is near-certain: the rounding then follows the
    # size of the terms (W's entries grow with ``scale``), not the size of the result
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * scale)


def test_fused_path_is_the_autograd_function(always_fused):
    h, W, t = make(4, 8, 600)
    out = linear_cross_entropy(h.requires_grad_(), W, t)
    assert type(out.grad_fn).__name__ == "_LinearCrossEntropyBackward"


def test_the_cross_over_picks_the_path(monkeypatch):
    monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", 700)
    for V, fused in [(699, False), (700, True)]:
        h, W, t = make(6, 8, V)
        out = linear_cross_entropy(h.requires_grad_(), W, t)
        assert (type(out.grad_fn).__name__ == "_LinearCrossEntropyBackward") == fused
        if not fused:  # exactly the plain expression, not merely close to it
            assert torch.equal(out, cross_entropy(F.linear(h, W), t))
        torch.testing.assert_close(out, reference(h, W, t), **TOL)


def test_the_book_vocabulary_takes_the_fused_path_and_the_compact_one_the_plain_one():
    h = torch.empty(4, 16, 64)  # the book's batch of hidden states
    assert loss._fused_applies(h, torch.empty(100_070, 64))  # the full cl100k output layer
    assert not loss._fused_applies(h, torch.empty(3_771, 64))  # the corpus's compact vocabulary
    assert not loss._fused_applies(h.double(), torch.empty(100_070, 64))  # mixed dtypes


def test_fused_takes_3d_hidden_and_non_contiguous_inputs(always_fused):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(3, 16, 5, generator=g).transpose(1, 2)  # (B, T, C) = (3, 5, 16), strided
    W = torch.randn(16, 700, generator=g).T / 4  # (V, C) = (700, 16), a transposed view
    t = torch.randint(700, (5, 3), generator=g).T  # (B, T), strided
    assert not (h.is_contiguous() or W.is_contiguous() or t.is_contiguous())
    mine = value_and_grads(linear_cross_entropy, h, W, t)
    theirs = value_and_grads(reference, h, W, t)
    assert mine[1].shape == (3, 5, 16) and mine[2].shape == (700, 16)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_fused_gradcheck_float64(always_fused):
    h, W, t = make(5, 3, 300)  # 300 columns: two blocks of 256 and 44
    h, W = h.double().requires_grad_(), W.double().requires_grad_()
    assert torch.autograd.gradcheck(linear_cross_entropy, (h, W, t))
    assert torch.autograd.gradcheck(lambda h: linear_cross_entropy(h, W.detach(), t), (h,))


def test_fused_gradient_scales_with_the_incoming_gradient(always_fused):
    h, W, t = make(4, 8, 500)
    h.requires_grad_()
    (3.0 * linear_cross_entropy(h, W, t)).backward()
    expected = torch.autograd.grad(3.0 * reference(h, W, t), h)[0]
    torch.testing.assert_close(h.grad, expected, **TOL)


def test_fused_tied_embedding_gets_both_gradients(always_fused):
    """W is the input embedding too: its gradient is the embedding's plus the output layer's."""
    torch.manual_seed(0)
    V, C = 600, 8
    ids, t = random_ids(2, 3, 6, V), random_ids(3, 3, 6, V)  # (B, T) each

    def tied_loss(fn):
        emb = torch.nn.Embedding(V, C)
        emb.weight.data.copy_(make(1, C, V)[1])
        h = torch.tanh(emb(ids))  # (B, T, C), any function of the embedding
        fn(h, emb.weight, t).backward()
        return emb.weight.grad

    torch.testing.assert_close(tied_loss(linear_cross_entropy), tied_loss(reference), **TOL)


def test_fused_skips_gradients_nobody_asked_for(always_fused):
    h, W, t = make(4, 8, 500)
    h.requires_grad_()
    linear_cross_entropy(h, W, t).backward()  # W needs no gradient
    assert W.grad is None and h.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, W, t), reference(h, W, t), **TOL)


def test_bf16_autocast_uses_the_plain_path(always_fused):
    h, W, t = make(6, 16, 700)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(h.requires_grad_(), W, t)
        expected = cross_entropy(F.linear(h, W), t)  # bf16 logits, fp32 loss
    assert out.dtype == torch.float32
    assert type(out.grad_fn).__name__ != "_LinearCrossEntropyBackward"
    assert torch.equal(out, expected)
    # bf16 logits carry ~3 significant digits: close to the fp32 value, not equal
    torch.testing.assert_close(out, reference(h, W, t), rtol=2e-2, atol=2e-2)


def test_other_dtypes_use_the_plain_path(always_fused):
    h, W, t = make(6, 16, 700)
    out = linear_cross_entropy(h.bfloat16(), W.bfloat16(), t)
    assert torch.equal(out, cross_entropy(F.linear(h.bfloat16(), W.bfloat16()), t))


@pytest.mark.parametrize("bad", [-1, 700])
def test_fused_rejects_targets_outside_the_vocabulary(always_fused, bad):
    h, W, t = make(6, 16, 700)
    t[2] = bad
    with pytest.raises(
        ValueError, match=r"outside the model's vocabulary \(valid ids are 0\.\.699\)"
    ):
        linear_cross_entropy(h, W, t)


def test_mismatched_shapes_are_explained():
    h, W, t = make(6, 16, 700)
    with pytest.raises(ValueError, match="leading shape"):
        linear_cross_entropy(h, W, t[:5])
    with pytest.raises(ValueError, match=r"weight \(V, C\)"):
        linear_cross_entropy(h, W[:, :8], t)


@pytest.mark.parametrize("vocab_size", [50, 700])  # the plain and the fused path
def test_fast_loss_matches_the_model(monkeypatch, vocab_size):
    monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", 600)
    for tie in (False, True):
        model = tiny_model(vocab_size=vocab_size, tie_embeddings=tie)
        x, y = random_ids(4, 2, 12, vocab_size), random_ids(5, 2, 12, vocab_size)
        grads = []
        for run in (model, FastLoss(model)):
            model.zero_grad(set_to_none=True)
            logits, value = run(x, y)
            assert (logits is None) == (run is not model)  # FastLoss never builds the logits
            value.backward()
            grads.append((value.detach(), [p.grad for p in model.parameters()]))
        torch.testing.assert_close(grads[0][0], grads[1][0], **TOL)
        for a, b in zip(grads[0][1], grads[1][1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_fast_loss_checks_like_the_model(monkeypatch):
    monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", 1)
    model = tiny_model()
    x = random_ids(6, 2, 12)
    for run in (model, FastLoss(model)):
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            run(x, torch.full_like(x, 50))
        with pytest.raises(ValueError, match="same shape as the input"):
            run(x, x[:, :5])
        with pytest.raises(ValueError, match="context_length"):
            run(random_ids(6, 2, 40), random_ids(7, 2, 40))


# ---- the loss alone ----------------------------------------------------------------------------


@pytest.mark.parametrize("V", [7, 5000])  # one chunk of rows, and several
def test_cross_entropy_matches_pytorch(V):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 40, V, generator=g) * 3).requires_grad_()
    targets = torch.randint(V, (3, 40), generator=g)
    ours = cross_entropy(logits, targets)
    ours.backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(logits.view(-1, V), targets.view(-1))
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad, logits.grad)
    bad = logits.detach().clone()
    bad[1, 2, 3] = float("nan")
    assert torch.isnan(cross_entropy(bad, targets))  # a non-finite logit is not hidden


# ---- the two ways of summing the exponentials ----------------------------------------------


@pytest.fixture
def safe_path_calls(monkeypatch):
    """Count the calls of the max-shifted (safe) path; the fast one shifts by the target's logit."""
    calls = []
    safe = loss._logsumexp_blocks

    def counted(*args):
        calls.append(1)
        return safe(*args)

    monkeypatch.setattr(loss, "_logsumexp_blocks", counted)
    return calls


def test_ordinary_logits_take_the_fast_path(always_fused, safe_path_calls):
    h, W, t = make(16, 8, 700, scale=5.0)
    mine = value_and_grads(linear_cross_entropy, h, W, t)
    assert safe_path_calls == []
    for a, b in zip(mine, value_and_grads(reference, h, W, t), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_logit_far_above_the_target_takes_the_safe_path(always_fused, safe_path_calls, dtype):
    h, W, t = make(6, 8, 700, scale=1.0)
    h, W = h.to(dtype), W.to(dtype)
    W[123] = 60.0 * h[2] / h[2].norm()  # row 2's logit 123 beats its target's by far over 100
    t[2] = 5
    gap = (h[2] @ W[123] - h[2] @ W[5]).item()
    assert gap > 100  # exp(gap) overflows float32
    mine = value_and_grads(linear_cross_entropy, h, W, t)
    assert len(safe_path_calls) == (1 if dtype == torch.float32 else 0)  # float64 holds exp(100)
    theirs = value_and_grads(reference, h.double(), W.double(), t)
    assert mine[0] > 10  # row 2 alone costs over 100 nats
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_a_nan_in_the_hidden_states_gives_a_nan_loss(always_fused):
    h, W, t = make(4, 8, 600)
    h[1, 3] = float("nan")
    assert torch.isnan(linear_cross_entropy(h, W, t))


# ---- a tied embedding's gradient -----------------------------------------------------------------


def test_sparse_tied_lookup_gives_the_dense_gradient(monkeypatch):
    """Tied, the lookup hands back a sparse gradient that lands in the loss's dense one; the total
    is what an untied copy's two tables receive together, on both output-layer paths."""
    for min_vocab in (1, 10**9):  # fused, then plain
        monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", min_vocab)
        tied = tiny_model(tie_embeddings=True, scale_embeddings=False)
        untied = tiny_model(tie_embeddings=False, scale_embeddings=False)
        untied.load_state_dict(tied.state_dict())  # both tables get the shared matrix
        x, y = random_ids(0, 3, 12), random_ids(1, 3, 12)
        for model in (tied, untied):
            FastLoss(model)(x, y)[1].backward()
        grad = tied.token_embedding.weight.grad
        assert grad.layout == torch.strided  # dense: a fused AdamW takes it as it is
        expected = untied.token_embedding.weight.grad + untied.lm_head.weight.grad
        torch.testing.assert_close(grad, expected, **TOL)
        assert untied.token_embedding.weight.grad.layout == torch.strided


# ---- clipping folded into the optimizer's step, and whole steps ------------------------------


def params_with_grads(seed: int = 0) -> list[torch.nn.Parameter]:
    """A large matrix (dot-product path), small tensors (foreach path) and a sparse gradient."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(300, 256), (64,), (7, 5), (20, 8)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in params[:3]:
        p.grad = torch.randn(p.shape, generator=g) * 3
    rows = torch.tensor([1, 4, 4])  # a sparse gradient with a repeated row
    values = torch.randn(3, 8, generator=g)
    params[3].grad = torch.sparse_coo_tensor(rows[None], values, (20, 8), check_invariants=True)
    return params


def test_grad_norm_matches_pytorch():
    params = params_with_grads()
    dense = [p.grad.to_dense() for p in params]
    expected = torch.sqrt(sum((g.double() ** 2).sum() for g in dense))
    assert params[0].grad.numel() >= 1 << 16  # the dot-product path is exercised
    torch.testing.assert_close(grad_norm(params).double(), expected, rtol=1e-6, atol=0)
    assert grad_norm([torch.nn.Parameter(torch.ones(3))]).item() == 0.0  # no gradients at all


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_factor_is_pytorchs(max_norm):
    params = params_with_grads()[:3]  # clip_grad_norm_ wants dense gradients
    factor = clip_factor(params, max_norm)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)  # clips in place
    torch.testing.assert_close(factor, (max_norm / (total + 1e-6)).clamp(max=1.0))
    assert (factor.item() == 1.0) == (max_norm == 1e6)


@pytest.mark.parametrize("fused", [True, False])
def test_clipped_step_matches_clip_grad_norm_then_step(fused):
    ours, theirs = params_with_grads()[:3], params_with_grads()[:3]
    kind = {"fused": True} if fused else {"foreach": True}
    opt_ours = torch.optim.AdamW(ours, lr=1e-2, **kind)
    opt_theirs = torch.optim.AdamW(theirs, lr=1e-2, **kind)
    factor = clip_factor(ours, 0.5)
    assert factor < 0.1  # a real clip
    clipped_step(opt_ours, factor)
    torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    opt_theirs.step()
    assert not hasattr(opt_ours, "grad_scale")  # the hook is removed after the step
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)  # the stored gradients are the clipped ones
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        # Adam's moments see the clipped gradients (they would differ by the factor if not)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt_ours.state[a][key], opt_theirs.state[b][key])


@pytest.mark.parametrize("fused_attention", [False, True])
@pytest.mark.parametrize("tie", [False, True])
def test_fast_train_step_matches_the_book_step(monkeypatch, fused_attention, tie):
    """Three steps of each, in float64 and without dropout (the CPU attention kernel draws its
    dropout masks itself, see the next tests). The same maths in another order (clipping sums
    the squares differently, the fused AdamW scales the gradients inside its own pass, the loss
    is summed block by block): the losses and the weights agree to far below the steps' size.
    Adam divides by the gradients' own scale, so a rounding difference in a tiny gradient moves
    a weight by up to ~1e-10 here."""
    monkeypatch.setattr(loss, "FUSED_MIN_VOCAB", 1)  # the block-wise output layer too
    config = TrainConfig(learning_rate=1e-2, device="cpu")

    def make():
        return tiny_model(
            0, torch.float64, dropout=0.0, fused_attention=fused_attention, tie_embeddings=tie
        )

    ours, theirs = make(), make()
    opt_ours, opt_theirs = make_optimizer(ours, config), make_optimizer(theirs, config)
    x, y = random_ids(1, 4, 12), random_ids(2, 4, 12)
    for _ in range(3):
        got = train_step(ours, opt_ours, x, y, lr=5e-3, grad_clip=0.5, fast=True)
        expected = train_step(theirs, opt_theirs, x, y, lr=5e-3, grad_clip=0.5)
        assert got == pytest.approx(expected, rel=1e-10)
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8, msg=name)
    moved = (ours.lm_head.weight - make().lm_head.weight).abs().max().item()
    assert moved > 1e-3  # the steps moved the weights far more than that tolerance


# ---- attention with dropout on a CPU ---------------------------------------------------------


def test_cpu_dropout_attention_matches_the_fused_kernel():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g) for _ in range(3))  # (B, H, T, hs)
    # without dropout: PyTorch's causal attention, to rounding
    torch.testing.assert_close(
        causal_attention_with_dropout(q, k, v, 0.0),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )
    # with dropout: the book's steps with F.dropout's draw on the (B*H, T, T) weights
    torch.manual_seed(5)
    ours = causal_attention_with_dropout(q, k, v, 0.3)
    torch.manual_seed(5)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    weights = torch.softmax(
        (q @ k.transpose(-2, -1) / 2.0).masked_fill(~mask, float("-inf")), dim=-1
    )
    dropped = F.dropout(weights.reshape(6, 7, 7), 0.3, training=True).view(2, 3, 7, 7)
    torch.testing.assert_close(ours, dropped @ v)
    assert (dropped == 0).float().mean() > 0.5 * 0.3  # dropout did zero some weights


def test_fast_attention_is_used_only_where_pytorch_is_slow(monkeypatch):
    model = tiny_model(0, dropout=0.2, fused_attention=True)
    x = torch.randn(2, 6, model.config.d_model)
    attn = model.blocks[0].attn
    calls = []
    kernel = loss.causal_attention_with_dropout
    monkeypatch.setattr(
        loss, "causal_attention_with_dropout", lambda *a: calls.append(1) or kernel(*a)
    )
    for training in (False, True):
        attn.train(training)
        torch.manual_seed(0)
        fast_out = fast_attention(attn, x, None)
        torch.manual_seed(0)
        plain = attn(x)  # PyTorch's kernel, with its own dropout draws
        torch.testing.assert_close(fast_out, plain)  # (this PyTorch happens to draw the same)
        assert len(calls) == int(training)  # the kernel runs only in training
