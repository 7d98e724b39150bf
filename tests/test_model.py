"""The GPT model: LayerNorm, blocks against nn.TransformerEncoderLayer, explicit vs fused paths,
the KV cache, causality, clear errors, parameter counts, attention maps, and that it can learn."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import random_ids, tiny_config, tiny_model
from torch import nn

import gptlib.model as gm
from gptlib.data import get_batch
from gptlib.model import (
    GPT,
    FeedForward,
    GPTConfig,
    TransformerBlock,
    causal_mask,
    layer_norm,
)

pytestmark = pytest.mark.usefixtures("single_thread")

SEEDS = [0, 1, 2]

SMALL = tiny_config()
small_model = tiny_model


def randomise_norms(module: nn.Module, seed: int) -> None:
    """Give every LayerNorm a non-trivial scale and shift, so that a swapped one would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                if m.bias is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))


# ---- LayerNorm -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("shape", "eps"), [((3, 8), 1e-5), ((2, 5, 16), 1e-5), ((4, 7, 10), 1e-3)])
def test_layer_norm_by_hand_matches_nn_layer_norm(seed, shape, eps):
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(shape, generator=g, dtype=torch.float64) + 2
    ref = nn.LayerNorm(shape[-1], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(shape[-1], generator=g))
        ref.bias.copy_(torch.randn(shape[-1], generator=g))
    ours = layer_norm(x, ref.weight, ref.bias, eps)
    torch.testing.assert_close(ours, ref(x), rtol=0, atol=1e-12)
    # without scale and shift: mean 0 and (biased) variance 1 per vector
    plain = layer_norm(x, eps=eps)
    torch.testing.assert_close(plain, F.layer_norm(x, shape[-1:], eps=eps), rtol=0, atol=1e-12)
    torch.testing.assert_close(plain.mean(-1), torch.zeros(shape[:-1], dtype=torch.float64))
    var = plain.var(-1, unbiased=False)
    torch.testing.assert_close(var, torch.ones(shape[:-1], dtype=torch.float64), atol=1e-2, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_the_blocks_layer_norms_match_nn_layer_norm(bias):
    config = replace(SMALL, bias=bias, norm_eps=1e-4)
    block = TransformerBlock(config).double()
    randomise_norms(block, seed=3)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    for ln in (block.ln1, block.ln2):
        assert (ln.bias is not None) == bias
        ref = nn.LayerNorm(16, eps=1e-4, bias=bias, dtype=torch.float64)
        ref.load_state_dict(ln.state_dict())
        torch.testing.assert_close(ln(x), ref(x), rtol=0, atol=1e-12)
        by_hand = layer_norm(x, ln.weight, ln.bias, 1e-4)
        torch.testing.assert_close(ln(x), by_hand, rtol=0, atol=1e-12)


# ---- a block against nn.TransformerEncoderLayer -------------------------------------------


def block_and_reference(norm: str, seed: int, d_model=16, n_heads=4, d_ff=32, fused=True):
    config = GPTConfig(
        vocab_size=10,
        context_length=16,
        d_model=d_model,
        n_heads=n_heads,
        n_blocks=1,
        d_ff=d_ff,
        dropout=0.0,
        norm_placement=norm,
        fused_attention=fused,
    )
    torch.manual_seed(seed)
    block = TransformerBlock(config).double().eval()
    with torch.no_grad():  # non-zero biases everywhere
        for m in block.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0, 0.2)
                m.bias.normal_(0, 0.2)
    randomise_norms(block, seed)
    ref = nn.TransformerEncoderLayer(
        d_model,
        n_heads,
        dim_feedforward=config.d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=(norm == "pre"),
        dtype=torch.float64,
    ).eval()
    a = block.attn
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
        ref.self_attn.out_proj.load_state_dict(a.W_o.state_dict())
    ref.linear1.load_state_dict(block.ffn.linear1.state_dict())
    ref.linear2.load_state_dict(block.ffn.linear2.state_dict())
    ref.norm1.load_state_dict(block.ln1.state_dict())
    ref.norm2.load_state_dict(block.ln2.state_dict())
    return block, ref


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mask_kind", ["float", "bool"])
def test_block_matches_transformer_encoder_layer(norm, seed, fused, mask_kind):
    B, T = 3, [5, 9, 16][seed]
    block, ref = block_and_reference(norm, seed, fused=fused)
    x = torch.randn(B, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if mask_kind == "float":  # -inf above the diagonal
            mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
            expected = ref(x, src_mask=mask)
        else:  # torch's boolean masks say True = NOT allowed
            expected = ref(x, src_mask=~causal_mask(T), is_causal=True)
        out = block(x)
    assert out.shape == (B, T, 16)
    # float64, atol 1e-10: torch's layer runs other kernels (packed in_proj, its own attention)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


def test_pre_and_post_norm_blocks_really_differ():
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    pre, _ = block_and_reference("pre", 0)
    post, _ = block_and_reference("post", 0)
    post.load_state_dict(pre.state_dict())
    with torch.no_grad():
        assert not torch.allclose(pre(x), post(x), atol=1e-3)
        # post-LN output is normalised (before ln2's scale/shift); pre-LN output is not
        y = post(x)
        normed = (y - post.ln2.bias) / post.ln2.weight
        torch.testing.assert_close(normed.mean(-1), torch.zeros(2, 5, dtype=torch.float64))


@pytest.mark.parametrize(
    ("activation", "fn"),
    [
        ("relu", F.relu),
        ("gelu", F.gelu),
        ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh")),
    ],
)
def test_feed_forward_by_hand(activation, fn):
    torch.manual_seed(0)
    ffn = FeedForward(8, 32, activation=activation).double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    l1, l2 = ffn.linear1, ffn.linear2
    expected = fn(x @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-12)


def test_feed_forward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation must be one of .*got 'swish'"):
        FeedForward(8, 32, activation="swish")


# ---- explicit vs fused, and the KV cache, for the whole model ------------------------------


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
@pytest.mark.parametrize("seed", [0, 1])
def test_explicit_and_fused_models_agree(norm, positions, seed):
    # dropout > 0 in the config, but eval mode turns it off on both paths
    model = small_model(
        seed, norm_placement=norm, positions=positions, dropout=0.2, fused_attention=True
    )
    idx = random_ids(seed, 3, 12)
    with torch.no_grad():
        fused, _ = model(idx)
        for block in model.blocks:
            block.attn.fused = False
        explicit, _ = model(idx)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)


# ---- causality -----------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_future_tokens_never_change_earlier_logits(fused, norm):
    model = small_model(0, torch.float64, fused_attention=fused, norm_placement=norm)
    idx = random_ids(0, 2, 12)
    with torch.no_grad():
        base, _ = model(idx)
        for t in [0, 3, 7, 10]:
            changed = idx.clone()
            changed[:, t + 1 :] = (idx[:, t + 1 :] + 1 + random_ids(t, 2, 11 - t, 40)) % 50
            assert torch.all(changed[:, t + 1 :] != idx[:, t + 1 :])
            logits, _ = model(changed)
            torch.testing.assert_close(logits[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-12)
            # the change does show after t, so the comparison above could have failed
            assert (logits[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 1e-6


def test_without_the_mask_the_future_would_leak(monkeypatch):
    """The causality check above can fail: drop the mask and earlier logits change."""
    original = gm.scaled_dot_product_attention

    def unmasked(q, k, v, mask=None, **kwargs):
        return original(q, k, v, None, **kwargs)

    monkeypatch.setattr(gm, "scaled_dot_product_attention", unmasked)
    model = small_model(0, torch.float64, fused_attention=False)
    idx = random_ids(0, 2, 12)
    changed = idx.clone()
    changed[:, 11] = (idx[:, 11] + 1) % 50
    with torch.no_grad():
        diff = (model(changed)[0][:, :11] - model(idx)[0][:, :11]).abs().max()
    assert diff > 1e-6


# ---- clear errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 10, "n_heads": 4}, r"d_model \(10\) must be divisible by n_heads \(4\)"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
        ({"context_length": -3}, "context_length must be a positive integer, got -3"),
        ({"d_model": 0}, "d_model must be a positive integer, got 0"),
        ({"n_heads": 0}, "n_heads must be a positive integer, got 0"),
        ({"n_blocks": 0}, "n_blocks must be a positive integer, got 0"),
        ({"d_ff": -1}, "d_ff must be a positive integer, got -1"),
        ({"n_kv_heads": 0}, "n_kv_heads must be a positive integer, got 0"),
        ({"d_model": 16.0}, "d_model must be a positive integer, got 16.0"),
        ({"n_blocks": True}, "n_blocks must be a positive integer, got True"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, r"dropout must be in \[0, 1\), got -0.1"),
        (
            {"norm_placement": "middle"},
            r"norm_placement must be one of \('pre', 'post'\), got 'middle'",
        ),
        ({"positions": "rotary"}, r"positions must be one of .*got 'rotary'"),
        ({"activation": "tanh"}, r"activation must be one of .*got 'tanh'"),
        (
            {"d_model": 9, "n_heads": 3, "n_kv_heads": None},
            "sinusoidal positions need an even d_model, got 9",
        ),
        ({"norm_eps": -1.0}, "norm_eps must be a small positive number, got -1.0"),
        ({"norm_eps": 0.0}, "norm_eps must be a small positive number, got 0.0"),
        ({"norm_eps": float("nan")}, "norm_eps must be a small positive .*got nan"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match="invalid GPTConfig: .*" + message):
        replace(SMALL, **overrides)


def test_config_reports_every_problem_at_once():
    with pytest.raises(
        ValueError, match="vocab_size must .*; norm_placement must .*; dropout must"
    ):
        replace(SMALL, vocab_size=0, dropout=2.0, norm_placement="x")


def test_config_derived_sizes():
    config = GPTConfig()
    assert (config.vocab_size, config.context_length, config.d_model) == (100_070, 16, 64)
    assert config.head_size == 16 and config.d_ff == 256
    assert config.to_dict()["n_blocks"] == 8 and GPTConfig(**config.to_dict()) == config


TOO_LONG = "the input has 13 tokens, but the model's context_length is 12; crop it to the last 12"
OUTSIDE = r"token id 50 is outside the model's vocabulary \(valid ids are 0..49\)"


@pytest.mark.parametrize(
    ("idx", "error", "message"),
    [
        (torch.zeros(1, 13, dtype=torch.long), ValueError, TOO_LONG),
        (torch.tensor([[1, 50]]), ValueError, OUTSIDE),
        (torch.tensor([[3, -1]]), ValueError, "token id -1 is outside the model's vocabulary"),
        (torch.zeros(5, dtype=torch.long), ValueError, r"shape \(batch, time\), got \(5,\)"),
        (torch.zeros(1, 2, 3), ValueError, r"shape \(batch, time\), got \(1, 2, 3\)"),
        ([[1, 2]], ValueError, r"expected token ids of shape \(batch, time\), got list"),
        (torch.zeros(1, 3), TypeError, "token ids must be an integer tensor, got torch.float32"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "the input is empty"),
    ],
)
def test_forward_errors(idx, error, message):
    model = small_model()
    with pytest.raises(error, match=message):
        model(idx)


def test_target_errors():
    model = small_model()
    idx = random_ids(0, 2, 5)
    with pytest.raises(ValueError, match=r"same shape as the input \(2, 5\), got \(2, 4\)"):
        model(idx, idx[:, :4])
    with pytest.raises(TypeError, match="targets must be an integer tensor, got torch.float32"):
        model(idx, idx.float())
    with pytest.raises(ValueError, match="targets: token id 50 is outside the model's vocab"):
        model(idx, torch.full_like(idx, 50))


def test_any_integer_dtype_gives_the_same_logits_and_loss():
    model = small_model()
    idx = random_ids(0, 2, 6)
    logits, loss = model(idx, idx)
    for dtype in (torch.int32, torch.int16, torch.uint8, torch.int8):
        other, other_loss = model(idx.to(dtype), idx.to(dtype))
        torch.testing.assert_close(other, logits, rtol=0, atol=0)
        torch.testing.assert_close(other_loss, loss, rtol=0, atol=0)


# ---- outputs, loss, dropout ---------------------------------------------------------------


def test_logits_shape_and_loss_is_mean_cross_entropy():
    model = small_model(0)
    idx, targets = random_ids(0, 3, 8), random_ids(1, 3, 8)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 8, 50)
    assert model(idx)[1] is None
    log_probs = torch.log_softmax(logits, dim=-1)
    by_hand = -log_probs.gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(loss, by_hand)
    # freshly initialised (small weights): about the loss of guessing uniformly
    assert abs(loss.item() - math.log(50)) < 0.1


def test_dropout_only_in_training_mode():
    model = small_model(0, dropout=0.3)
    idx = random_ids(0, 2, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], model(idx)[0], rtol=0, atol=0)
        model.train()
        assert not torch.allclose(model(idx)[0], model(idx)[0])


# ---- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_num_parameters_by_hand(bias, positions):
    V, T, C, L, d_ff = 50, 12, 16, 2, 64
    model = small_model(0, bias=bias, positions=positions)
    b = int(bias)
    attention = 4 * (C * C + b * C)
    ffn = C * d_ff + b * d_ff + d_ff * C + b * C
    norm = C + b * C
    expected = {
        "token embedding": V * C,
        "position embedding": T * C if positions == "learned" else 0,
        "attention": L * attention,
        "feed-forward": L * ffn,
        "layer norms": L * 2 * norm + norm,
        "output layer": V * C,
    }
    assert model.num_parameters() == sum(expected.values())
    assert model.parameter_counts() == expected
    assert sum(model.parameter_counts().values()) == model.num_parameters()
    without_final_norm = small_model(0, bias=bias, positions=positions, final_norm=False)
    assert without_final_norm.num_parameters() == sum(expected.values()) - norm


def test_tied_embeddings_share_storage_and_count_once():
    untied = small_model(0)
    tied = small_model(0, tie_embeddings=True)
    assert tied.lm_head.weight is tied.token_embedding.weight
    assert tied.lm_head.weight.data_ptr() == tied.token_embedding.weight.data_ptr()
    assert untied.lm_head.weight.data_ptr() != untied.token_embedding.weight.data_ptr()
    assert tied.num_parameters() == untied.num_parameters() - 50 * 16
    counts = tied.parameter_counts()
    assert counts["output layer"] == 0 and counts["token embedding"] == 50 * 16
    assert sum(counts.values()) == tied.num_parameters()
    with torch.no_grad():  # one tensor: changing the embedding changes the output layer
        tied.token_embedding.weight[3, 0] = 7.0
    assert tied.lm_head.weight[3, 0].item() == 7.0


# ---- attention maps -------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("fused", [False, True])
def test_attention_weights(norm, fused):
    model = small_model(0, torch.float64, norm_placement=norm, fused_attention=fused)
    randomise_norms(model, 2)
    with torch.no_grad():  # larger projections, so the maps are far from uniform
        for block in model.blocks:
            block.attn.W_q.weight.mul_(20)
            block.attn.W_k.weight.mul_(20)
    B, T, H = 2, 9, 4
    idx = random_ids(0, B, T)
    w = model.attention_weights(idx)
    assert w.shape == (SMALL.n_blocks, B, H, T, T)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, B, H, T, dtype=torch.float64))
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert torch.all(w[..., future] == 0)
    assert torch.all(w[..., ~future] > 0)
    # block 0 by hand: (LayerNorm of) the embeddings, projections, heads, scores, mask, softmax
    block = model.blocks[0]
    with torch.no_grad():
        x = model.token_embedding.weight[idx] * math.sqrt(SMALL.d_model)  # scale_embeddings
        x = x + model.positional_encoding[:T].double()
        if norm == "pre":
            x = layer_norm(x, block.ln1.weight, block.ln1.bias)
        a = block.attn
        q = (x @ a.W_q.weight.T + a.W_q.bias).reshape(B, T, H, 4).permute(0, 2, 1, 3)
        k = (x @ a.W_k.weight.T + a.W_k.bias).reshape(B, T, H, 4).permute(0, 2, 1, 3)
        scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(future, float("-inf"))
        by_hand = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(w[0], by_hand, rtol=0, atol=1e-12)
    assert by_hand.max() > 0.9  # not a near-uniform map that anything would match
    # the model is left as it was
    assert all(b.attn.fused == fused for b in model.blocks) and not model.training


# ---- it can learn --------------------------------------------------------------------------


def train(model: GPT, batches, steps: int, lr: float, stop_below: float = 0.0) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("inf"))
    for _ in range(steps):
        x, y = batches()
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < stop_below:
            break
    model.eval()
    return loss.item()


@pytest.mark.parametrize(("norm", "fused"), [("pre", True), ("post", False)])
def test_tiny_model_memorises_a_sequence(norm, fused):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=16,
        context_length=8,
        d_model=32,
        n_heads=2,
        n_blocks=2,
        dropout=0.0,
        norm_placement=norm,
        fused_attention=fused,
    )
    model = GPT(config)
    seq = torch.randint(16, (1, 9), generator=torch.Generator().manual_seed(0))
    x, y = seq[:, :-1], seq[:, 1:]
    with torch.no_grad():
        start = model(x, y)[1].item()
    train(model, lambda: (x, y), steps=300, lr=1e-2, stop_below=0.01)
    with torch.no_grad():
        logits, loss = model(x, y)
    assert start > 2.0 and loss.item() < 0.05
    assert torch.equal(logits.argmax(-1), y)


V_RANDOM = 64


def random_stream_val_loss(fused: bool) -> float:
    """Train a small model on uniformly random tokens; return its validation loss."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train_ids = torch.randint(V_RANDOM, (100_000,), generator=g)
    val_ids = torch.randint(V_RANDOM, (20_000,), generator=g)
    config = GPTConfig(
        vocab_size=V_RANDOM,
        context_length=8,
        d_model=32,
        n_heads=2,
        n_blocks=1,
        dropout=0.0,
        positions="learned",
        fused_attention=fused,
    )
    model = GPT(config)
    train(model, lambda: get_batch(train_ids, 32, 8, generator=g), steps=100, lr=1e-2)
    with torch.no_grad():
        return model(*get_batch(val_ids, 256, 8, seed=123))[1].item()


@pytest.mark.parametrize("fused", [False, True])
def test_random_tokens_stay_unpredictable(fused):
    """Nothing leaks through the mask: the best a causal model can do is guess, ln V."""
    assert abs(random_stream_val_loss(fused) - math.log(V_RANDOM)) < 0.1


def test_an_unmasked_model_would_learn_to_copy_the_next_token(monkeypatch):
    """The same training without the causal mask reads the answer: the test above can fail."""
    original = gm.scaled_dot_product_attention

    def unmasked(q, k, v, mask=None, **kwargs):
        return original(q, k, v, None, **kwargs)

    monkeypatch.setattr(gm, "scaled_dot_product_attention", unmasked)
    assert random_stream_val_loss(fused=False) < math.log(V_RANDOM) - 2.0


# ---- the KV cache's buffers ----------------------------------------------------------------


def test_hidden_states_are_the_input_of_the_final_norm_and_output_layer():
    model = small_model(4)
    randomise_norms(model, 4)
    idx = random_ids(4, 3, 10)
    with torch.no_grad():
        h = model.hidden_states(idx)
        assert h.shape == (3, 10, SMALL.d_model)
        torch.testing.assert_close(model.lm_head(model.final_norm(h)), model(idx)[0])


@pytest.mark.parametrize("scale", [True, False])
def test_embed_scales_tokens_by_sqrt_d_model_only_when_asked(scale):
    # chapter 3: the token vectors (std 0.02) would be ~36 times shorter than the sin/cos rows
    model = small_model(5, scale_embeddings=scale)
    idx = random_ids(5, 2, 8)
    factor = math.sqrt(SMALL.d_model) if scale else 1.0
    expected = model.token_embedding(idx) * factor + model.positional_encoding[:8]
    torch.testing.assert_close(model.embed(idx), expected)


def test_the_book_scales_embeddings_and_gpt2_does_not():
    from gptlib.hf import check_gpt2_compatible, gpt2_config

    assert GPTConfig().scale_embeddings and not gpt2_config().scale_embeddings
    with pytest.raises(ValueError, match="scale_embeddings=True"):
        check_gpt2_compatible(gpt2_config(scale_embeddings=True))
