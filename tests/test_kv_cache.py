"""The KV cache: the same logits and tokens as running the whole window, its buffers, its errors."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, peaked_model, random_ids, tiny_model

from gptlib.generate import KVCache, generate, next_token_logits
from gptlib.model import MultiHeadAttention, split_heads

# tiny models: one torch thread (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("single_thread")


def randomise_norms(module: torch.nn.Module, seed: int) -> None:
    """Give every LayerNorm a non-trivial scale and shift, so that a swapped one would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_kv_cache_gives_the_full_forward_logits(fused, norm, positions):
    model = tiny_model(
        0, torch.float64, fused_attention=fused, norm_placement=norm, positions=positions
    )
    randomise_norms(model, 1)
    # rtol=0, atol=1e-10 in float64 here and below: the cached and the full pass compute the
    # same sums in different shapes (different kernels), so they agree to rounding, not bits
    idx = random_ids(1, 2, 12)
    with torch.no_grad():
        full, _ = model(idx)
        # a prefix, then one token through the cache
        cache = KVCache()
        model(idx[:, :7], cache=cache)
        assert cache.length == 7 and len(cache.layers) == TINY["n_blocks"]
        step, _ = model(idx[:, 7:8], cache=cache)
        assert cache.length == 8
        torch.testing.assert_close(step[:, 0], full[:, 7], rtol=0, atol=1e-10)
        # then the rest as a chunk of several tokens
        rest, _ = model(idx[:, 8:], cache=cache)
        torch.testing.assert_close(rest, full[:, 8:], rtol=0, atol=1e-10)
        # and token by token from an empty cache
        cache.reset()
        assert cache.length == 0
        steps = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


def test_cache_overflow_raises():
    model = tiny_model()
    cache = KVCache()
    with torch.no_grad():
        model(random_ids(0, 1, 10), cache=cache)
        with pytest.raises(ValueError, match=r"3 tokens after 10 cached positions.*last 2 tokens"):
            model(random_ids(1, 1, 3), cache=cache)
        model(random_ids(1, 1, 2), cache=cache)  # exactly filling the context is fine
        with pytest.raises(ValueError, match="KV cache is full: it holds 12 positions.*new cache"):
            model(random_ids(2, 1, 1), cache=cache)


@pytest.mark.parametrize(("max_length", "capacities"), [(None, [16, 32, 64]), (40, [16, 32, 40])])
def test_kv_cache_grows_its_buffers_and_keeps_every_position(max_length, capacities):
    # 40 tokens one at a time: the buffers fill up and grow twice on the way
    model = tiny_model(2, torch.float64, context_length=40)
    idx = random_ids(3, 2, 40)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(max_length=max_length)
        seen, addresses = [], {}  # capacity -> where the keys of block 0 were
        for t in range(40):
            step, _ = model(idx[:, t : t + 1], cache=cache)
            torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-10)
            if cache.capacity not in seen:
                seen.append(cache.capacity)
            addresses.setdefault(cache.capacity, set()).add(cache.layers[0][0].data_ptr())
        assert seen == capacities
        assert all(len(a) == 1 for a in addresses.values())  # in place until the buffer grows
        # the cached keys and values are those of a single pass over all 40 tokens
        attn, x = model.blocks[0].attn, model.blocks[0].ln1(model.embed(idx))
        k_full, v_full = split_heads(attn.W_k(x), 4), split_heads(attn.W_v(x), 4)
        k_cached, v_cached = cache.layers[0]
        assert k_cached.shape == (2, 4, 40, 4) and len(cache.layers) == 2
        torch.testing.assert_close(k_cached, k_full, rtol=0, atol=1e-12)
        torch.testing.assert_close(v_cached, v_full, rtol=0, atol=1e-12)


def test_kv_cache_errors_say_what_to_do():
    model = tiny_model()
    cache = KVCache()
    with torch.no_grad():
        model(random_ids(0, 2, 3), cache=cache)
        with pytest.raises(ValueError, match=r"holds \(batch, heads\) = \(2, 4\), got keys for "):
            model(random_ids(1, 3, 1), cache=cache)
        k = torch.zeros(1, 4, 1, 4)
        with pytest.raises(ValueError, match="blocks write in order: block 1 came before 0"):
            KVCache().layer(1).update(k, k)
    cache.reset()
    assert cache.length == 0 and cache.capacity == 0 and cache.layers == []


class ListCache:
    """The smallest object the model accepts as a cache: concatenates, grows without limit. It
    shows that the model relies only on ``length``, ``layer(i).update`` and ``advance``."""

    def __init__(self) -> None:
        self.length, self.kv = 0, {}

    def layer(self, i: int):
        cache = self

        class View:
            def update(self, k, v):
                old = cache.kv.get(i)
                if old is not None:
                    k, v = torch.cat([old[0], k], dim=-2), torch.cat([old[1], v], dim=-2)
                cache.kv[i] = (k, v)
                return k, v

        return View()

    def advance(self, T: int) -> None:
        self.length += T


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("n_past", [1, 4, 9])
@pytest.mark.parametrize("n_new", [1, 3])
def test_attention_with_cached_keys_matches_full_attention(fused, n_past, n_new):
    torch.manual_seed(n_past)
    mha = MultiHeadAttention(24, 3, fused=fused).double().eval()
    x = torch.randn(2, n_past + n_new, 24, dtype=torch.float64)
    view = ListCache().layer(0)
    with torch.no_grad():
        full = mha(x)
        mha(x[:, :n_past], view)
        step = mha(x[:, n_past:], view)
    # float64, atol 1e-10: the same sums in another order (see above)
    torch.testing.assert_close(step, full[:, n_past:], rtol=0, atol=1e-10)


def test_any_object_with_the_cache_methods_works_as_a_cache():
    model = tiny_model(3, torch.float64)
    idx = random_ids(3, 2, 12)
    cache = ListCache()
    with torch.no_grad():
        full, _ = model(idx)
        model(idx[:, :5], cache=cache)
        rest, _ = model(idx[:, 5:], cache=cache)
    assert cache.length == 12 and cache.kv[0][0].shape == (2, 4, 12, 4)
    torch.testing.assert_close(rest, full[:, 5:], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "overrides",
    [{"fused_attention": True}, {}, {"positions": "learned", "norm_placement": "post"}],
    ids=["fused", "explicit", "learned-post"],
)
def test_cache_gives_the_same_greedy_tokens_past_the_context(overrides):
    # the tokens are compared exactly: the logits of the two paths differ only by rounding and
    # the peaked distributions (see peaked_model) leave no near-ties for it to flip
    model = peaked_model(**overrides)
    prompt = torch.tensor([[3, 14, 15], [9, 2, 6]])  # (2, 3)
    cached = generate(model, prompt, 30, temperature=0, use_cache=True)
    plain = generate(model, prompt, 30, temperature=0, use_cache=False)
    assert cached.shape == (2, 33)
    assert torch.equal(cached, plain)
    assert len(set(cached[0].tolist())) > 3  # a varied sequence, not one repeated token


def test_cache_matches_no_cache_with_sampling():
    model = peaked_model(seed=1)
    a = generate(model, [1, 2, 3], 25, temperature=1.0, top_k=10, seed=5, use_cache=True)
    b = generate(model, [1, 2, 3], 25, temperature=1.0, top_k=10, seed=5, use_cache=False)
    assert torch.equal(a, b)


def test_cached_logits_equal_full_forward_logits():
    model = peaked_model()
    idx = torch.tensor([[5, 7, 11, 13, 17, 19]])
    full = model(idx)[0]  # (1, 6, V)
    cache = KVCache()
    first = next_token_logits(model, idx[:, :2], cache)  # prefill two tokens
    torch.testing.assert_close(first, full[:, 1], rtol=1e-5, atol=1e-5)
    for t in range(2, 6):
        step = next_token_logits(model, idx[:, t : t + 1], cache)
        torch.testing.assert_close(step, full[:, t], rtol=1e-5, atol=1e-5)
    assert cache.length == 6
    with pytest.raises(ValueError, match=r"3 tokens after 6 cached positions.*context_length is 8"):
        next_token_logits(model, idx[:, :3], cache)
