"""gptlib with GPT-2's switches against Hugging Face's GPT2LMHeadModel, all offline.

Small random GPT-2 models (2 blocks, 4 heads, d_model 64, context 32) are converted both ways;
the logits must agree to 1e-5, greedy generation token for token (with and without gptlib's KV
cache), and a round trip must keep every tensor bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from gptlib.generate import KVCache, generate
from gptlib.hf import (
    GPT2_REPO_ID,
    PretrainedUnavailableError,
    config_from_hf,
    config_to_hf,
    from_hf,
    from_pretrained,
    gpt2_config,
    gpt2_tokenizer,
    state_dict_from_hf,
    state_dict_to_hf,
    to_hf,
)
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import TokenizerUnavailableError

transformers = pytest.importorskip(
    "transformers", reason="the GPT-2 bridge tests need transformers"
)
GPT2Config = transformers.GPT2Config
GPT2LMHeadModel = transformers.GPT2LMHeadModel

TOL = 1e-5
VOCAB = 1000
SMALL = dict(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=VOCAB)
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def small_hf(seed: int = 0, attn: str = "eager", dtype=torch.float32, **extra) -> GPT2LMHeadModel:
    """A randomly initialised small GPT-2 in eval mode, with non-trivial biases and LayerNorms."""
    config = GPT2Config(**{**SMALL, **NO_DROPOUT, **extra}, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2's init zeroes biases and sets LN to 1: make them random too
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def random_ids(seed: int, B: int, T: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Give every parameter random values (biases and LayerNorms included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model


@torch.no_grad()
def greedy_gptlib(model: GPT, prompt: torch.Tensor, n_new: int, use_cache: bool) -> torch.Tensor:
    """Pick the most likely next token n_new times; with the cache, feed only the new token."""
    ids = prompt
    cache = KVCache() if use_cache else None
    step_input = prompt
    for _ in range(n_new):
        logits, _ = model(step_input if use_cache else ids, cache=cache)
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
    return ids


# ---- configuration -------------------------------------------------------------------------


def test_importing_gptlib_does_not_import_transformers():
    code = "import gptlib, gptlib.hf, sys; assert 'transformers' not in sys.modules, 'imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_gpt2_config_has_gpt2_switches_and_124m_parameters():
    c = gpt2_config()
    assert (c.norm_placement, c.positions, c.activation) == ("pre", "learned", "gelu_tanh")
    assert c.bias and c.tie_embeddings and c.final_norm
    assert (c.vocab_size, c.context_length, c.d_model, c.n_heads, c.n_blocks) == (
        50257,
        1024,
        768,
        12,
        12,
    )
    with torch.device("meta"):  # shapes only, no memory
        ours = GPT(c).num_parameters()
        theirs = GPT2LMHeadModel(GPT2Config()).num_parameters()
    assert ours == theirs == 124_439_808  # the published size of the smallest GPT-2


def test_config_from_hf_of_default_gpt2_config_is_gpt2_config():
    assert config_from_hf(GPT2Config()) == gpt2_config()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"d_ff": 128}, {"tie_embeddings": False}, {"activation": "relu", "dropout": 0.0}],
)
def test_config_round_trip(overrides):
    config = gpt2_config(n_blocks=2, n_heads=4, d_model=64, context_length=32, **overrides)
    assert config_from_hf(config_to_hf(config)) == config


def test_config_from_hf_maps_n_inner_and_activation_names():
    c = config_from_hf(
        GPT2Config(n_embd=64, n_head=4, n_inner=192, activation_function="gelu_pytorch_tanh")
    )
    assert c.d_ff == 192 and c.activation == "gelu_tanh"
    odd = config_from_hf(GPT2Config(n_embd=64, n_head=4, n_inner=100))  # any width, not k * C
    assert odd.d_ff == 100 and config_to_hf(odd).n_inner == 100
    assert config_to_hf(replace(odd, d_ff=256)).n_inner is None  # 4 * C: transformers' default


@pytest.mark.parametrize(
    "hf_kwargs, message",
    [
        ({"activation_function": "silu"}, "activation_function='silu'"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({"add_cross_attention": True}, "cross-attention"),
    ],
)
def test_config_from_hf_rejects_what_gptlib_cannot_express(hf_kwargs, message):
    with pytest.raises(ValueError, match="cannot convert this GPT2Config") as err:
        config_from_hf(GPT2Config(**hf_kwargs))
    assert message in str(err.value)


def test_config_from_hf_rejects_other_model_types():
    with pytest.raises(ValueError, match="describes a 'bert' model") as err:
        config_from_hf(transformers.BertConfig())
    assert "GPT-2 ('gpt2') and Llama ('llama')" in str(err.value)


def test_book_config_cannot_become_gpt2():
    book = GPTConfig()  # the book's defaults: sinusoidal positions, ReLU, untied
    with pytest.raises(ValueError, match="cannot be expressed as a GPT-2") as err:
        config_to_hf(replace(book, norm_placement="post"))
    assert "positions='sinusoidal'" in str(err.value) and "norm_placement='post'" in str(err.value)


def test_different_dropout_rates_warn():
    with pytest.warns(UserWarning, match="different dropout rates"):
        c = config_from_hf(GPT2Config(resid_pdrop=0.1, attn_pdrop=0.0))
    assert c.dropout == 0.1


# ---- logits --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("fused", [True, False])
def test_logits_match_transformers(seed, attn, fused):
    hf = small_hf(seed, attn)
    model = from_hf(hf, fused_attention=fused)
    assert not model.training and model.config.fused_attention is fused
    for j, (B, T) in enumerate([(1, 1), (3, 7), (2, 32)]):
        idx = random_ids(100 * seed + j, B, T)
        with torch.no_grad():
            expected = hf(idx).logits  # (B, T, V)
            got, _ = model(idx)
        assert got.shape == expected.shape == (B, T, VOCAB)
        assert max_diff(got, expected) < TOL


@pytest.mark.parametrize(
    "extra",
    [
        {"n_inner": 128},
        {"tie_word_embeddings": False},
        {"activation_function": "gelu_pytorch_tanh"},
        {"activation_function": "relu"},
    ],
)
def test_logits_match_transformers_for_variants(extra):
    hf = small_hf(3, **extra)
    model = from_hf(hf)
    assert (model.lm_head.weight is model.token_embedding.weight) == hf.config.tie_word_embeddings
    idx = random_ids(7, 2, 20)
    with torch.no_grad():
        assert max_diff(model(idx)[0], hf(idx).logits) < TOL


def test_float64_models_agree_to_float64_precision():
    hf = small_hf(4, dtype=torch.float64)
    model = from_hf(hf)
    assert model.token_embedding.weight.dtype == torch.float64
    idx = random_ids(8, 2, 16)
    with torch.no_grad():
        assert max_diff(model(idx)[0], hf(idx).logits) < 1e-12


def test_converted_model_owns_its_weights_and_is_trainable():
    hf = small_hf(5)
    model = from_hf(hf).train()
    assert all(p.requires_grad for p in model.parameters())
    before = hf.transformer.wte.weight.clone()
    with torch.no_grad():
        model.token_embedding.weight.zero_()
    assert torch.equal(hf.transformer.wte.weight, before)  # a copy, not a view
    assert torch.equal(model.lm_head.weight, model.token_embedding.weight)  # still tied
    _, loss = model(random_ids(9, 2, 8), random_ids(10, 2, 8))
    loss.backward()
    assert model.blocks[0].attn.W_q.weight.grad is not None


def test_from_hf_only_overrides_runtime_fields():
    with pytest.raises(ValueError, match="can only override"):
        from_hf(small_hf(0), d_model=32)


# ---- generation ----------------------------------------------------------------------------


def hf_greedy(hf, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """transformers' own greedy generation of exactly ``n_new`` tokens after ``prompt``."""
    return hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        do_sample=False,
        pad_token_id=0,
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_generation_matches_transformers_with_and_without_cache(seed):
    hf = small_hf(seed)
    model = from_hf(hf)
    prompt = random_ids(seed + 50, 2, 5)
    n_new = 20
    expected = hf_greedy(hf, prompt, n_new)
    assert expected.shape == (2, 5 + n_new)
    assert torch.equal(greedy_gptlib(model, prompt, n_new, use_cache=False), expected)
    assert torch.equal(greedy_gptlib(model, prompt, n_new, use_cache=True), expected)


@pytest.mark.parametrize("use_cache", [True, False])
def test_gptlib_generate_greedy_matches_transformers(use_cache):
    hf = small_hf(2)
    model = from_hf(hf)
    prompt = random_ids(52, 2, 6)
    n_new = 26  # fills the 32-token context exactly
    expected = hf_greedy(hf, prompt, n_new)
    got = generate(model, prompt, n_new, temperature=0, use_cache=use_cache)
    assert torch.equal(got, expected)


def test_kv_cache_logits_match_transformers_step_by_step():
    hf = small_hf(6)
    model = from_hf(hf)
    idx = random_ids(11, 2, 12)
    cache = KVCache()
    with torch.no_grad():
        full = hf(idx).logits
        steps = [model(idx[:, :4], cache=cache)[0]]  # a 4-token prompt, then one at a time
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(4, 12)]
    assert cache.length == 12
    assert max_diff(torch.cat(steps, dim=1), full) < TOL


# ---- weights -------------------------------------------------------------------------------


def test_round_trip_gptlib_to_hf_to_gptlib_keeps_every_tensor():
    torch.manual_seed(0)
    model = randomize(GPT(gpt2_config(n_blocks=2, n_heads=4, d_model=64, context_length=32)), 1)
    back = from_hf(to_hf(model))
    assert back.config == model.config
    original, restored = model.state_dict(), back.state_dict()
    assert original.keys() == restored.keys()
    for key in original:
        assert torch.equal(original[key], restored[key]), key
    assert back.lm_head.weight is back.token_embedding.weight


def test_round_trip_hf_to_gptlib_to_hf_keeps_every_tensor():
    hf = small_hf(7, tie_word_embeddings=False)
    again = to_hf(from_hf(hf))
    original, restored = hf.state_dict(), again.state_dict()
    assert original.keys() == restored.keys()
    for key in original:
        assert torch.equal(original[key], restored[key]), key


def test_state_dict_from_hf_splits_the_packed_qkv_projection():
    hf = small_hf(8)
    sd = state_dict_from_hf(hf.state_dict(), config_from_hf(hf.config))
    c_attn = hf.transformer.h[1].attn.c_attn  # Conv1D: y = x @ W + b, W (64, 192)
    x = torch.randn(3, 64)
    q, k, v = c_attn(x).split(64, dim=-1)
    for name, part in (("W_q", q), ("W_k", k), ("W_v", v)):
        w, b = sd[f"blocks.1.attn.{name}.weight"], sd[f"blocks.1.attn.{name}.bias"]
        assert max_diff(x @ w.T + b, part) < TOL  # nn.Linear's convention


def test_state_dict_from_hf_reads_openai_style_keys_with_mask_buffers():
    hf = small_hf(9)
    config = config_from_hf(hf.config)
    plain = state_dict_from_hf(hf.state_dict(), config)
    # OpenAI's checkpoint on the Hub: no "transformer." prefix, no lm_head, causal-mask buffers
    openai = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    del openai["lm_head.weight"]
    for i in range(config.n_blocks):
        openai[f"h.{i}.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
    converted = state_dict_from_hf(openai, config)
    assert converted.keys() == plain.keys()
    assert all(torch.equal(converted[k], plain[k]) for k in plain)


def test_state_dict_from_hf_reports_missing_extra_and_mis_shaped_tensors():
    hf = small_hf(10)
    config = config_from_hf(hf.config)
    sd = dict(hf.state_dict())
    missing = {k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match="no 'transformer.h.1.mlp.c_fc.bias'. Is it a GPT-2"):
        state_dict_from_hf(missing, config)
    with pytest.raises(ValueError, match="does not know: 'transformer.h.0.attn.rotary'. Is"):
        state_dict_from_hf({**sd, "transformer.h.0.attn.rotary": torch.zeros(1)}, config)
    with pytest.raises(ValueError, match="wpe.weight: \\(32, 64\\) instead of \\(16, 64\\)"):
        state_dict_from_hf(sd, replace(config, context_length=16))
    with pytest.raises(ValueError, match="c_attn.weight: \\(64, 192\\) instead of \\(32, 96\\)"):
        state_dict_from_hf(sd, replace(config, d_model=32, n_heads=4))


def test_state_dict_from_hf_refuses_untied_weights_for_a_tied_config():
    hf = small_hf(11, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="not tied; convert it with tie_embeddings=False"):
        state_dict_from_hf(hf.state_dict(), replace(config_from_hf(hf.config), tie_embeddings=True))


def test_state_dict_to_hf_loads_strictly_into_transformers():
    torch.manual_seed(1)
    model = randomize(GPT(gpt2_config(n_blocks=2, n_heads=4, d_model=64, context_length=32)), 2)
    sd = state_dict_to_hf(model)
    hf = GPT2LMHeadModel(config_to_hf(model.config, "eager"))
    hf.load_state_dict(sd, strict=True)
    hf.eval()
    model.eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 10))
    with torch.no_grad():
        assert max_diff(model(idx)[0], hf(idx).logits) < TOL


# ---- loading from disk ---------------------------------------------------------------------


def test_from_pretrained_reads_a_save_pretrained_folder(tmp_path):
    hf = small_hf(12)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    model = from_pretrained(tmp_path)
    also = from_pretrained(str(tmp_path), fused_attention=False)  # a str path, the explicit path
    assert not model.training and also.config.fused_attention is False
    assert model.config.fused_attention is True  # gpt2_config's default: the fused kernel
    expected = from_hf(hf).state_dict()
    for key, value in expected.items():
        assert torch.equal(model.state_dict()[key], value), key
    idx = random_ids(13, 2, 32)
    with torch.no_grad():
        logits = hf(idx).logits
        assert max_diff(model(idx)[0], logits) < TOL
        assert max_diff(also(idx)[0], logits) < TOL
    prompt = idx[:, :6]
    expected_ids = greedy_gptlib(from_hf(hf), prompt, 10, use_cache=False)
    assert torch.equal(greedy_gptlib(model, prompt, 10, use_cache=True), expected_ids)


def test_gptlib_model_saved_through_transformers_loads_back(tmp_path):
    torch.manual_seed(2)
    model = randomize(GPT(gpt2_config(n_blocks=2, n_heads=4, d_model=64, context_length=32)), 3)
    to_hf(model).save_pretrained(tmp_path)
    back = from_pretrained(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_from_pretrained_explains_what_to_download_when_offline(tmp_path):
    with pytest.raises(PretrainedUnavailableError) as err:
        from_pretrained("gpt2", cache_dir=tmp_path, local_files_only=True)
    message = str(err.value)
    for part in (GPT2_REPO_ID, "config.json", "model.safetensors", "hf download", str(tmp_path)):
        assert part in message, part


def test_from_pretrained_obeys_hf_hub_offline(tmp_path, monkeypatch):
    # HF_HUB_OFFLINE is read once, when huggingface_hub is imported; is_offline_mode() then
    # reports this constant, and transformers asks it on every call. The empty cache_dir keeps a
    # developer's real cache out of the test.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert constants.is_offline_mode()
    with pytest.raises(PretrainedUnavailableError, match="offline mode: HF_HUB_OFFLINE=1") as err:
        from_pretrained("gpt2", cache_dir=tmp_path)
    assert GPT2_REPO_ID in str(err.value) and "--local-dir" in str(err.value)


def test_from_pretrained_rejects_folders_without_a_checkpoint(tmp_path):
    with pytest.raises(PretrainedUnavailableError, match="missing config.json, model.safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(PretrainedUnavailableError, match="does not exist"):
        from_pretrained(str(tmp_path / "nowhere" / "gpt2"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PretrainedUnavailableError, match="is a file; pass the folder"):
        from_pretrained(tmp_path / "config.json")


# ---- tokenizer -----------------------------------------------------------------------------


def test_gpt2_tokenizer_is_tiktokens_gpt2_encoding():
    try:
        tok = gpt2_tokenizer()
    except TokenizerUnavailableError as err:
        pytest.skip(f"tiktoken's gpt2 files are not available offline: {err}")
    assert tok.vocab_size == gpt2_config().vocab_size
    assert tok.encoding.eot_token == 50256 == tok.vocab_size - 1
    text = "Hello, world! GPT-2 reads bytes."
    ids = tok.encode(text)
    assert tok.decode(ids) == text and max(ids) < tok.vocab_size
