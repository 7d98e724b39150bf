"""Generation: greedy/top-k/temperature behaviour, cropping, errors (the cache: test_kv_cache)."""

from __future__ import annotations

import pytest
import torch
from conftest import peaked_model

from gptlib.generate import generate, next_token_logits, sample_next

# tiny models: one torch thread (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("single_thread")


def test_next_token_logits_is_the_last_position_of_forward():
    model = peaked_model()
    idx = torch.randint(50, (3, 8), generator=torch.Generator().manual_seed(0))
    logits = next_token_logits(model, idx)
    assert logits.shape == (3, 50) and logits.dtype == torch.float32
    # a tolerance, not torch.equal: next_token_logits applies the output layer to the last
    # position alone, a (B, C) @ (C, V) product, while forward multiplies all positions at once;
    # BLAS may sum in another order for the two shapes, so the last bits differ on some CPUs
    torch.testing.assert_close(logits, model(idx)[0][:, -1], rtol=1e-5, atol=1e-4)


# ---- sampling --------------------------------------------------------------------------------


def test_temperature_zero_is_greedy_and_ignores_the_seed():
    model = peaked_model()
    a = generate(model, [4, 8], 12, temperature=0, seed=1)
    b = generate(model, [4, 8], 12, temperature=0, seed=2)
    assert torch.equal(a, b)
    # greedy by hand
    ids = [4, 8]
    for _ in range(12):
        ids.append(int(model(torch.tensor([ids[-8:]]))[0][0, -1].argmax()))
    assert a.tolist() == ids


def test_top_k_one_is_greedy():
    model = peaked_model()
    greedy = generate(model, [4, 8], 10, temperature=0)
    assert torch.equal(generate(model, [4, 8], 10, temperature=1.5, top_k=1, seed=3), greedy)


def test_top_k_samples_only_among_the_k_most_likely():
    model = peaked_model()
    prompt = torch.tensor([[4, 8, 15]]).repeat(400, 1)  # 400 independent samples of one step
    first = generate(model, prompt, 1, temperature=5.0, top_k=3, seed=0)[:, -1]
    allowed = set(model(prompt[:1])[0][0, -1].topk(3).indices.tolist())
    assert set(first.tolist()) == allowed  # all three appear, nothing else does
    unrestricted = generate(model, prompt, 1, temperature=5.0, seed=0)[:, -1]
    assert len(set(unrestricted.tolist())) > 10


def test_temperature_sharpens_or_flattens_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    cold = sample_next(logits, 0.2, None, g)
    hot = sample_next(logits, 5.0, None, g)
    share_cold = (cold == 0).float().mean().item()
    share_hot = (hot == 0).float().mean().item()
    assert share_cold > 0.95  # nearly always the best token
    assert 0.15 < share_hot < 0.4  # close to uniform (0.2) with a slight preference
    assert len(set(hot.tolist())) == 5
    tiny = sample_next(logits[:10], 1e-30, None, g)  # no overflow to nan for a tiny temperature
    assert tiny.tolist() == [0] * 10


def test_seed_makes_sampling_reproducible_without_touching_global_rng():
    model = peaked_model()
    state = torch.get_rng_state()
    a = generate(model, [1, 2], 20, temperature=1.0, seed=42)
    b = generate(model, [1, 2], 20, temperature=1.0, seed=42)
    c = generate(model, [1, 2], 20, temperature=1.0, seed=43)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state)


# ---- prompts and shapes ----------------------------------------------------------------------


def test_long_prompts_are_cropped_to_the_context():
    model = peaked_model()
    prompt = list(range(20))  # longer than the context of 8
    out = generate(model, prompt, 5, temperature=0)
    assert out.shape == (25,) and out[:20].tolist() == prompt  # the whole prompt is kept
    cropped = generate(model, prompt[-8:], 5, temperature=0)
    assert out[20:].tolist() == cropped[8:].tolist()  # only the last 8 tokens mattered


def test_shapes_and_mode():
    model = peaked_model().train()
    assert generate(model, [1, 2, 3], 4).shape == (7,)
    assert generate(model, torch.tensor([1, 2, 3]), 4).shape == (7,)
    assert generate(model, torch.tensor([[1, 2], [3, 4]]), 4).shape == (2, 6)
    assert generate(model, [5], 0).tolist() == [5]
    assert model.training  # put back in the mode it had


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": -0.5}, ValueError, "temperature must be >= 0"),
        ({"temperature": float("inf")}, ValueError, "temperature must be a finite number"),
        ({"top_k": 0}, ValueError, "top_k must be a positive integer"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be an integer >= 0"),
        ({"prompt_ids": []}, ValueError, "the prompt is empty"),
        ({"prompt_ids": [1, 50]}, ValueError, "token id 50 is outside the model.s vocab"),
        ({"prompt_ids": torch.zeros(2, 2, 2, dtype=torch.long)}, ValueError, "1-D"),
        ({"prompt_ids": torch.tensor([0.5])}, TypeError, "integer token ids"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error, message):
    args = {"prompt_ids": [1, 2], "max_new_tokens": 3, **kwargs}
    with pytest.raises(error, match=message):
        generate(peaked_model(), **args)


def test_output_can_feed_a_training_step():
    model = peaked_model()
    out = generate(model, [1, 2, 3], 6, temperature=0)
    assert not out.is_inference()
    model.train()
    _, loss = model(out[None, :8], out[None, 1:9])
    loss.backward()  # would fail for an inference-mode tensor saved for backward
    assert model.token_embedding.weight.grad is not None
