"""Chapter 13's switches: rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases.

Each piece is checked against a reference (PyTorch's own module or kernel, or Hugging Face's Llama
functions where PyTorch has none), then the whole model: causal, the KV cache equal to no cache
(storing only the key/value heads), generation, checkpoints and bf16 autocast.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import random_ids, tiny_config, tiny_model

from gptlib.checkpoint import load_checkpoint, save_checkpoint
from gptlib.generate import KVCache, generate
from gptlib.model import (
    GPT,
    MultiHeadAttention,
    SwiGLUFeedForward,
    apply_rope,
    make_norm,
    repeat_kv,
    rms_norm,
    rope_cos_sin,
    sinusoidal_positional_encoding,
    split_heads,
)

pytestmark = pytest.mark.usefixtures("single_thread")

MODERN = dict(positions="rope", norm_type="rmsnorm", activation="swiglu", n_kv_heads=2, bias=False)
# each switch on its own, and all of them together
VARIANTS = [
    {"positions": "rope"},
    {"norm_type": "rmsnorm"},
    {"activation": "swiglu"},
    {"n_kv_heads": 2},
    {"n_kv_heads": 1},  # multi-query attention
    {"bias": False},
    MODERN,
]


# ---- RoPE --------------------------------------------------------------------------------------


def test_rope_angles_are_the_sinusoidal_tables_speeds():
    cos, sin = rope_cos_sin(10, 8)
    assert cos.shape == sin.shape == (10, 8)
    torch.testing.assert_close(cos**2 + sin**2, torch.ones(10, 8))
    # pair i turns at speed base^(-2i/hs): the same angles as the sin/cos table of width hs
    table = sinusoidal_positional_encoding(10, 8)
    torch.testing.assert_close(sin[:, :4], table[:, 0::2])
    torch.testing.assert_close(cos[:, 4:], table[:, 1::2])
    later_cos, _ = rope_cos_sin(4, 8, start=6)
    torch.testing.assert_close(later_cos, cos[6:])
    with pytest.raises(ValueError, match="even head_size"):
        rope_cos_sin(4, 7)


def test_rope_matches_hugging_face_llama():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    cos, sin = rope_cos_sin(9, 16, base=500.0)
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, cos[None], sin[None])
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q)
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k)


def test_rope_keeps_lengths_and_scores_depend_only_on_the_distance():
    q, k = torch.randn(1, 1, 6, 16), torch.randn(1, 1, 6, 16)
    cos, sin = rope_cos_sin(6, 16)
    torch.testing.assert_close(apply_rope(q, cos, sin).norm(dim=-1), q.norm(dim=-1))
    # the same query and key vectors placed at positions (m, n) and (m + 5, n + 5)
    qv, kv = q[0, 0, 0], k[0, 0, 0]
    cos20, sin20 = rope_cos_sin(20, 16)

    def score(m: int, n: int) -> torch.Tensor:
        return apply_rope(qv, cos20[m], sin20[m]) @ apply_rope(kv, cos20[n], sin20[n])

    for m, n in [(3, 1), (7, 7), (10, 2)]:
        torch.testing.assert_close(score(m, n), score(m + 5, n + 5), rtol=1e-5, atol=1e-5)
    assert not torch.isclose(score(3, 1), score(3, 2), rtol=1e-3)


# ---- RMSNorm -----------------------------------------------------------------------------------


def test_rms_norm_by_hand_equals_pytorch():
    x = torch.randn(3, 5, 16) * 4 + 2
    weight = torch.rand(16) + 0.5
    reference = torch.nn.RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        reference.weight.copy_(weight)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), reference(x))
    torch.testing.assert_close(rms_norm(x), F.rms_norm(x, (16,), eps=1e-5))
    # unlike LayerNorm, the mean is kept: a constant vector stays a constant vector
    assert rms_norm(torch.full((1, 16), 3.0)).allclose(torch.ones(1, 16), atol=1e-5)


def test_make_norm_builds_the_named_layer():
    assert isinstance(make_norm(tiny_config()), torch.nn.LayerNorm)
    rms = make_norm(tiny_config(norm_type="rmsnorm"))
    assert isinstance(rms, torch.nn.RMSNorm) and [n for n, _ in rms.named_parameters()] == [
        "weight"
    ]
    assert make_norm(tiny_config(bias=False)).bias is None


# ---- SwiGLU ------------------------------------------------------------------------------------


def test_swiglu_by_hand_and_its_width_keeps_the_parameter_count():
    torch.manual_seed(0)
    ffn = SwiGLUFeedForward(16, 40, bias=False)
    x = torch.randn(2, 3, 16)
    gate, up, down = ffn.gate.weight, ffn.up.weight, ffn.down.weight
    by_hand = ((x @ gate.T) * torch.sigmoid(x @ gate.T) * (x @ up.T)) @ down.T
    torch.testing.assert_close(ffn(x), by_hand)
    config = tiny_config(d_model=64, activation="swiglu", bias=False)
    assert config.d_ff == round(2 * 4 * 64 / 3) == 171
    swiglu = sum(p.numel() for p in SwiGLUFeedForward(64, config.d_ff, bias=False).parameters())
    assert abs(swiglu - 8 * 64 * 64) / (8 * 64 * 64) < 0.01  # vs Linear(64, 256) + Linear(256, 64)
    assert tiny_config(activation="swiglu", d_ff=24).d_ff == 24


def test_swiglu_is_its_own_layer():
    from gptlib.model import FeedForward

    with pytest.raises(ValueError, match="SwiGLUFeedForward"):
        FeedForward(16, 64, activation="swiglu")


# ---- grouped-query attention -------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("fused", [False, True])
def test_grouped_query_attention_matches_pytorchs_gqa_kernel(n_kv_heads, fused):
    torch.manual_seed(n_kv_heads)
    attn = MultiHeadAttention(32, 4, bias=False, fused=fused, n_kv_heads=n_kv_heads).eval()
    assert attn.W_k.weight.shape == attn.W_v.weight.shape == (n_kv_heads * 8, 32)
    x = torch.randn(2, 7, 32)
    q = split_heads(attn.W_q(x), 4)  # (B, 4, T, 8)
    k, v = split_heads(attn.W_k(x), n_kv_heads), split_heads(attn.W_v(x), n_kv_heads)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attn.W_o(out.transpose(1, 2).reshape(2, 7, 32))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)
    # by hand: each key/value head copied for the query heads it serves
    rep = 4 // n_kv_heads
    assert torch.equal(repeat_kv(k, rep)[:, rep - 1], k[:, 0])
    weights = attn.attention_weights(x)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7))


def test_gqa_with_as_many_kv_heads_as_heads_is_standard_attention():
    torch.manual_seed(3)
    mha = MultiHeadAttention(32, 4).eval()
    gqa = MultiHeadAttention(32, 4, n_kv_heads=4).eval()
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 32)
    assert torch.equal(gqa(x), mha(x))
    reference = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        reference.in_proj_bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
        reference.out_proj.weight.copy_(mha.W_o.weight)
        reference.out_proj.bias.copy_(mha.W_o.bias)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)  # True = not allowed, PyTorch's convention
    torch.testing.assert_close(gqa(x), reference(x, x, x, attn_mask=mask)[0], atol=1e-6, rtol=1e-5)


def test_n_kv_heads_must_divide_n_heads():
    with pytest.raises(
        ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\).*\[1, 2, 4\]"
    ):
        tiny_config(n_kv_heads=3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive integer, got -1"):
        tiny_config(n_kv_heads=-1)
    with pytest.raises(ValueError, match="head size 3 must be even"):
        tiny_config(d_model=12, n_heads=4, positions="rope")


# ---- the whole model ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", VARIANTS)
def test_every_variant_is_causal(overrides):
    model = tiny_model(1, **overrides)
    idx = random_ids(2, 2, 12)
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 50
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("fused", [False, True])
def test_every_variant_gives_the_same_logits_with_the_kv_cache(overrides, fused):
    model = tiny_model(0, torch.float64, fused_attention=fused, **overrides)
    idx = random_ids(1, 2, 12)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache()
        first, _ = model(idx[:, :5], cache=cache)
        steps = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 12)]
    cached = torch.cat([first, *steps], dim=1)
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-10)  # same sums, other shapes
    kv_heads = model.config.n_kv_heads
    assert all(k.shape == (2, kv_heads, 12, 4) == v.shape for k, v in cache.layers)


@pytest.mark.parametrize("use_cache", [False, True])
def test_modern_model_generates_past_its_context_the_same_with_and_without_cache(use_cache):
    model = tiny_model(4, **MODERN)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # clear margins between the greedy choices
    prompt = random_ids(5, 1, 4)
    plain = generate(model, prompt, 20, temperature=0.0, use_cache=False)
    assert torch.equal(generate(model, prompt, 20, temperature=0.0, use_cache=use_cache), plain)
    assert plain.shape == (1, 24)


def test_modern_parameter_counts():
    book = GPT(tiny_config(d_model=64, n_heads=4, bias=False))
    modern = GPT(tiny_config(d_model=64, n_heads=4, **MODERN))
    parts_book, parts_modern = book.parameter_counts(), modern.parameter_counts()
    assert parts_modern["position embedding"] == 0  # RoPE has no weights
    # grouped-query attention: W_k and W_v shrink from (64, 64) to (32, 64) in both blocks
    assert parts_book["attention"] - parts_modern["attention"] == 2 * 2 * 32 * 64
    assert abs(parts_modern["feed-forward"] / parts_book["feed-forward"] - 1) < 0.01
    assert "rope_cos" not in modern.state_dict()  # computed, not saved


def test_modern_model_round_trips_through_a_checkpoint(tmp_path):
    model = tiny_model(6, **MODERN)
    save_checkpoint(tmp_path / "m.pt", model)
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert loaded.model_config == model.config
    idx = random_ids(7, 2, 12)
    with torch.no_grad():
        assert torch.equal(loaded.model(idx)[0], model(idx)[0])


def test_modern_model_trains_under_bf16_autocast():
    model = tiny_model(8, **MODERN).train()
    idx, targets = random_ids(9, 2, 12), random_ids(10, 2, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, targets)
    loss.backward()
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(50)) < 0.5
    assert all(p.grad is not None for p in model.parameters())
