"""Attention against PyTorch's own implementations: the causal mask, scaled dot-product attention,
head splitting, and MultiHeadAttention (explicit and fused paths, attention maps)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gptlib.model import (
    MultiHeadAttention,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)

pytestmark = pytest.mark.usefixtures("single_thread")

SEEDS = [0, 1, 2]
# (B, H, T, head size)
QKV_SHAPES = [(1, 1, 1, 4), (2, 3, 5, 8), (3, 2, 7, 16), (2, 4, 12, 6)]
# (B, T, d_model, n_heads)
MHA_SHAPES = [(1, 1, 8, 2), (2, 5, 12, 3), (3, 9, 16, 4), (2, 16, 32, 8)]


def random_qkv(seed: int, shape: tuple[int, int, int, int]):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))


# ---- the causal mask -----------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 5, 16])
def test_causal_mask_allows_exactly_the_past_and_present(T):
    mask = causal_mask(T)
    assert mask.dtype == torch.bool and mask.shape == (T, T)
    for i in range(T):
        for j in range(T):
            assert bool(mask[i, j]) == (j <= i)


# ---- scaled dot-product attention ----------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", QKV_SHAPES)
def test_causal_attention_matches_torch(seed, shape):
    q, k, v = random_qkv(seed, shape)
    T = shape[2]
    mask = causal_mask(T)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert weights.shape == (*shape[:3], T)
    # masked (future) weights are exactly zero, not merely small
    assert torch.all(weights[..., ~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(shape[:3], dtype=torch.float64))
    # the allowed weights are the softmax of the scaled scores over the visible keys only
    scores = q @ k.transpose(-2, -1) / math.sqrt(shape[-1])
    for i in range(T):
        row = torch.softmax(scores[..., i, : i + 1], dim=-1)
        torch.testing.assert_close(weights[..., i, : i + 1], row, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_without_mask_and_with_any_bool_mask_matches_torch(seed):
    B, H, Tq, Tk, d = 2, 3, 4, 6, 8
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, Tk, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Tk, 5, generator=g, dtype=torch.float64)  # d_v may differ from d_k
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-12)
    assert out.shape == (B, H, Tq, 5) and weights.shape == (B, H, Tq, Tk)
    # a random mask (keeping key 0 so no row is empty), True = may attend, as in torch
    mask = torch.rand(Tq, Tk, generator=g) < 0.5
    mask[:, 0] = True
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert torch.all(weights[..., ~mask] == 0)


def test_attention_dropout_zeroes_or_rescales_weights_reproducibly():
    q, k, v = random_qkv(0, (2, 2, 6, 4))
    mask = causal_mask(6)
    _, clean = scaled_dot_product_attention(q, k, v, mask=mask)
    p = 0.5
    _, w1 = scaled_dot_product_attention(
        q, k, v, mask=mask, dropout_p=p, generator=torch.Generator().manual_seed(3)
    )
    _, w2 = scaled_dot_product_attention(
        q, k, v, mask=mask, dropout_p=p, generator=torch.Generator().manual_seed(3)
    )
    torch.testing.assert_close(w1, w2, rtol=0, atol=0)
    dropped = w1 == 0
    assert dropped[..., mask].any() and (~dropped[..., mask]).any()
    torch.testing.assert_close(w1[~dropped], clean[~dropped] / (1 - p))


def test_attention_shape_errors():
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="same last dimension"):
        scaled_dot_product_attention(q, torch.randn(1, 3, 5), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="same length"):
        scaled_dot_product_attention(q, torch.randn(1, 3, 4), torch.randn(1, 2, 4))


# ---- heads ---------------------------------------------------------------------------------


def test_split_and_merge_heads():
    B, T, C, H = 2, 5, 12, 3
    x = torch.randn(B, T, C)
    heads = split_heads(x, H)
    assert heads.shape == (B, H, T, C // H)
    for h in range(H):  # head h owns channels h*hs .. (h+1)*hs - 1
        torch.testing.assert_close(heads[:, h], x[:, :, h * 4 : (h + 1) * 4], rtol=0, atol=0)
    torch.testing.assert_close(merge_heads(heads), x, rtol=0, atol=0)


# ---- MultiHeadAttention vs nn.MultiheadAttention ------------------------------------------


def make_pair(d_model: int, n_heads: int, seed: int, bias: bool = True):
    """Our MultiHeadAttention and nn.MultiheadAttention with the same (random) weights."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(d_model, n_heads, dropout=0.0, bias=bias).double().eval()
    with torch.no_grad():  # non-zero biases, so a misplaced bias would show
        for lin in (ours.W_q, ours.W_k, ours.W_v, ours.W_o):
            lin.weight.normal_(0, 0.3)
            if bias:
                lin.bias.normal_(0, 0.3)
    ref = nn.MultiheadAttention(
        d_model, n_heads, dropout=0.0, bias=bias, batch_first=True, dtype=torch.float64
    ).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            ref.out_proj.bias.copy_(ours.W_o.bias)
    return ours, ref


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", MHA_SHAPES)
def test_multi_head_attention_matches_torch(shape, seed, fused):
    B, T, C, H = shape
    ours, ref = make_pair(C, H, seed)
    ours.fused = fused
    x = torch.randn(B, T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    # nn.MultiheadAttention's boolean mask means the opposite of ours: True = NOT allowed
    expected, expected_w = ref(
        x, x, x, attn_mask=~causal_mask(T), need_weights=True, average_attn_weights=False
    )
    with torch.no_grad():
        out = ours(x)
    # float64, atol 1e-10: torch computes the same sums with other kernels (packed in_proj)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    w = ours.attention_weights(x)  # the explicit steps, whichever path forward uses
    assert w.shape == (B, H, T, T) and not w.requires_grad
    torch.testing.assert_close(w, expected_w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("fused", [False, True])
def test_multi_head_attention_without_bias_matches_torch(fused):
    ours, ref = make_pair(16, 4, seed=5, bias=False)
    ours.fused = fused
    assert ours.W_q.bias is None
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    expected, _ = ref(x, x, x, attn_mask=~causal_mask(7), need_weights=False)
    with torch.no_grad():
        out = ours(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
def test_explicit_and_fused_paths_agree_in_float32(seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(32, 4, dropout=0.1).eval()  # eval: dropout off on both paths
    x = torch.randn(3, 11, 32)
    with torch.no_grad():
        mha.fused = True
        fused = mha(x)
        mha.fused = False
        explicit = mha(x)
    # two kernels for the same maths: float32 rounding differs, hence atol 1e-6
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)


def test_multi_head_attention_errors():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(4\)"):
        MultiHeadAttention(10, 4)
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\), got \(2, 5, 8\)"):
        mha(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\), got \(5, 16\)"):
        mha(torch.randn(5, 16))
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\)"):
        mha.attention_weights(torch.randn(5, 16))


def test_attention_weights_follow_the_train_and_eval_modes():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.5).train()
    x = torch.randn(2, 6, 16)
    dropped = mha.attention_weights(x)
    assert (dropped == 0).sum() > (causal_mask(6) == 0).sum() * 8  # more zeros than the mask's
    kept = mha.eval().attention_weights(x)
    torch.testing.assert_close(kept.sum(-1), torch.ones(2, 4, 6))


# ---- the CPU training path with attention dropout ------------------------------------------


@pytest.mark.parametrize(("seed", "shape"), [(0, (2, 5, 12, 3)), (1, (3, 16, 32, 4))])
def test_fused_training_attention_drops_weights_like_the_explicit_steps(seed, shape):
    # in training mode on a CPU the fused path computes dropout(softmax(masked QKᵀ/√d)) V itself;
    # replay its dropout draws (same generator state, same shape) and build the result by hand
    B, T, d_model, H = shape
    p = 0.3
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, H, dropout=p, fused=True).double().train()
    mha.resid_dropout.p = 0.0  # only the attention weights are dropped here
    x = torch.randn(B, T, d_model, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(100 + seed)
    out = mha(x)
    q, k, v = (split_heads(W(x), H) for W in (mha.W_q, mha.W_k, mha.W_v))
    _, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(T))  # (B, H, T, T)
    torch.manual_seed(100 + seed)
    keep = F.dropout(torch.ones(B * H, T, T, dtype=torch.float64), p, training=True)
    dropped = weights * keep.view(B, H, T, T)
    expected = mha.W_o(merge_heads(dropped @ v))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert (keep == 0).any() and (keep > 0).any()
    # and the gradients agree too
    r = torch.randn(out.shape, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((out * r).sum(), x, retain_graph=True)
    (g_hand,) = torch.autograd.grad((expected * r).sum(), x)
    torch.testing.assert_close(g_ours, g_hand, rtol=0, atol=1e-10)
