"""The sinusoidal positional encoding against its closed formula, and how the model adds it."""

from __future__ import annotations

import math

import pytest
import torch

from gptlib.model import GPT, GPTConfig, sinusoidal_positional_encoding


def reference_table(T: int, d_model: int, base: float = 10_000.0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same), with Python's math."""
    rows = []
    for pos in range(T):
        row = []
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize(("T", "d_model"), [(1, 2), (4, 6), (16, 64), (50, 10), (128, 32)])
def test_matches_the_closed_formula(T, d_model):
    pe = sinusoidal_positional_encoding(T, d_model, dtype=torch.float64)
    assert pe.shape == (T, d_model) and pe.dtype == torch.float64
    torch.testing.assert_close(pe, reference_table(T, d_model), rtol=0, atol=1e-12)


def test_float32_default_and_other_base():
    pe = sinusoidal_positional_encoding(10, 8)
    assert pe.dtype == torch.float32
    torch.testing.assert_close(pe.double(), reference_table(10, 8), rtol=0, atol=1e-6)
    pe100 = sinusoidal_positional_encoding(10, 8, base=100.0, dtype=torch.float64)
    torch.testing.assert_close(pe100, reference_table(10, 8, base=100.0), rtol=0, atol=1e-12)


def test_position_zero_and_value_range():
    pe = sinusoidal_positional_encoding(64, 16, dtype=torch.float64)
    expected0 = torch.tensor([0.0, 1.0] * 8, dtype=torch.float64)  # sin 0 = 0, cos 0 = 1
    torch.testing.assert_close(pe[0], expected0, rtol=0, atol=0)
    assert pe.abs().max() <= 1.0
    # every pair (sin, cos) of one frequency lies on the unit circle
    torch.testing.assert_close(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, torch.ones(64, 8).double())
    # and no two positions get the same vector
    assert len({tuple(r.tolist()) for r in pe}) == 64


@pytest.mark.parametrize(("T", "d_model"), [(4, 5), (4, 1), (4, 0), (0, 4)])
def test_bad_sizes_raise(T, d_model):
    with pytest.raises(ValueError, match="need T >= 1 and an even d_model >= 2"):
        sinusoidal_positional_encoding(T, d_model)


def test_odd_d_model_is_rejected_by_the_config():
    with pytest.raises(ValueError, match="sinusoidal positions need an even d_model, got 7"):
        GPTConfig(d_model=7, n_heads=1)
    GPTConfig(d_model=7, n_heads=1, positions="learned")  # learned positions have no such limit


def test_model_adds_the_table_to_the_token_embeddings():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=20, context_length=12, d_model=8, n_heads=2, n_blocks=1)
    model = GPT(config).eval()
    torch.testing.assert_close(
        model.positional_encoding, sinusoidal_positional_encoding(12, 8), rtol=0, atol=0
    )
    idx = torch.tensor([[3, 1, 4, 1, 5]])
    tok = model.token_embedding.weight[idx[0]] * math.sqrt(8)  # scale_embeddings: times sqrt(C)
    with torch.no_grad():
        torch.testing.assert_close(model.embed(idx)[0], tok + model.positional_encoding[:5])
        # start shifts the positions (used with a KV cache)
        torch.testing.assert_close(
            model.embed(idx, start=4)[0], tok + model.positional_encoding[4:9]
        )
    # a fixed table: not a parameter, and not saved in the state dict
    assert "positional_encoding" not in dict(model.named_parameters())
    assert "positional_encoding" not in model.state_dict()


def test_learned_positions_are_an_embedding_table():
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=20, context_length=12, d_model=8, n_heads=2, n_blocks=1, positions="learned"
    )
    model = GPT(config).eval()
    assert model.position_embedding.weight.shape == (12, 8)
    assert not hasattr(model, "positional_encoding")
    idx = torch.tensor([[2, 7, 7]])
    with torch.no_grad():
        tok = model.token_embedding.weight[idx[0]] * math.sqrt(8)  # scale_embeddings
        expected = tok + model.position_embedding.weight[3:6]
        torch.testing.assert_close(model.embed(idx, start=3)[0], expected)
