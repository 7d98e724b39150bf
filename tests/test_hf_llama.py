"""gptlib with Llama's switches against Hugging Face's LlamaForCausalLM, all offline (chapter 13).

Small random Llama models (2 blocks, 4 heads, d_model 64, context 32, grouped-query attention)
are converted both ways through ``gptlib.hf``: the logits must agree to 1e-5, greedy generation
token for token with and without gptlib's KV cache, and a round trip must keep every tensor.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from gptlib import hf
from gptlib.generate import generate
from gptlib.model import GPT, GPTConfig

transformers = pytest.importorskip(
    "transformers", reason="the Llama bridge tests need transformers"
)

TOL = 1e-5
VOCAB = 500


def small_llama(seed: int = 0, attn: str = "eager", **extra) -> transformers.LlamaForCausalLM:
    """A random small Llama in eval mode, with non-trivial RMSNorm gains (and biases if asked)."""
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        bos_token_id=None,
        eos_token_id=None,
    )
    config = transformers.LlamaConfig(**(kwargs | extra))
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model


def ids(seed: int, B: int = 2, T: int = 32) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"num_key_value_heads": 4},  # plain multi-head attention
        {"num_key_value_heads": 1},  # multi-query attention
        {"attention_bias": True, "mlp_bias": True},
        {"tie_word_embeddings": True},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
    ],
)
def test_logits_match_transformers(attn, extra):
    reference = small_llama(1, attn, **extra)
    model = hf.from_hf(reference)
    assert model.config.positions == "rope" and not model.training
    with torch.no_grad():
        for fused in (True, False):
            model.config.fused_attention = fused
            for block in model.blocks:
                block.attn.fused = fused
            diff = (model(ids(2))[0] - reference(ids(2)).logits).abs().max().item()
            assert diff < TOL, (fused, diff)


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_generation_matches_transformers_with_and_without_cache(seed):
    reference = small_llama(seed)
    with torch.no_grad():  # larger output weights: clear margins between greedy choices
        reference.lm_head.weight.mul_(20.0)
    model = hf.from_hf(reference)
    prompt = ids(seed + 10, B=1, T=5)
    theirs = reference.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    cached = generate(model, prompt, 20, temperature=0.0, use_cache=True)
    assert torch.equal(generate(model, prompt, 20, temperature=0.0, use_cache=False), cached)
    assert torch.equal(cached, theirs)


def test_round_trips_keep_every_tensor():
    reference = small_llama(3)
    back = hf.to_hf(hf.from_hf(reference))
    assert isinstance(back, transformers.LlamaForCausalLM)
    ours, theirs = back.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    torch.manual_seed(4)
    model = GPT(hf.llama_config(vocab_size=VOCAB, n_kv_heads=2, tie_embeddings=True))
    again = hf.from_hf(hf.to_hf(model))
    assert again.config == model.config
    assert again.lm_head.weight is again.token_embedding.weight
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_config_round_trip_and_book_sizes():
    config = hf.llama_config(n_kv_heads=2)
    assert (config.d_model, config.n_heads, config.context_length) == (64, 4, 16)
    assert not config.bias and config.norm_type == "rmsnorm" and config.activation == "swiglu"
    assert hf.config_from_hf(hf.config_to_hf(config)) == config
    wide = hf.llama_config(d_ff=96, rope_base=500_000.0, tie_embeddings=True)
    assert hf.config_from_hf(hf.config_to_hf(wide)) == wide


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "linear"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"attention_bias": True, "mlp_bias": False}, "one bias switch"),
    ],
)
def test_config_from_hf_rejects_what_gptlib_cannot_express(extra, message):
    base = dict(hidden_size=64, num_attention_heads=4, intermediate_size=160)
    with pytest.raises(ValueError, match="cannot convert this LlamaConfig") as err:
        hf.config_from_hf(transformers.LlamaConfig(**(base | extra)))
    assert message in str(err.value)


def test_a_non_llama_config_is_refused_with_the_switches_to_change():
    bad = replace(hf.llama_config(), norm_type="layernorm", scale_embeddings=True)
    with pytest.raises(ValueError, match="cannot be expressed as a Llama") as err:
        hf.to_hf(GPT(bad))
    assert "norm_type='layernorm'" in str(err.value) and "llama_config" in str(err.value)
    with pytest.raises(ValueError, match="GPT-2"):  # the book's model is neither
        hf.to_hf(GPT(GPTConfig(vocab_size=50)))


def test_state_dict_errors_name_the_tensors():
    reference = small_llama(5)
    config = hf.config_from_hf(reference.config)
    sd = dict(reference.state_dict())
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        hf.state_dict_from_hf(sd, config)
    sd = dict(reference.state_dict()) | {"model.layers.0.extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="does not know.*extra"):
        hf.state_dict_from_hf(sd, config)
    with pytest.raises(ValueError, match="wrong shapes"):
        hf.state_dict_from_hf(reference.state_dict(), replace(config, d_ff=96))


def test_from_pretrained_reads_a_llama_folder(tmp_path):
    reference = small_llama(6)
    reference.save_pretrained(tmp_path)
    model = hf.from_pretrained(tmp_path)
    assert not model.training and model.config.n_kv_heads == 2
    with torch.no_grad():
        assert (model(ids(7))[0] - reference(ids(7)).logits).abs().max().item() < TOL


@pytest.mark.parametrize("where", ["folder", "hub cache"])
def test_from_pretrained_refuses_a_rope_scaling_before_reading_the_weights(tmp_path, where):
    # Llama 3.1's rotary scaling: refused from config.json alone, with the error chapter 13's
    # optional cell catches. The folder's weights file is not even a valid safetensors file, and
    # the Hub cache holds no weights at all (fetching them would fail with another message).
    config = small_llama(6).config.to_dict()
    config["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    if where == "folder":
        (tmp_path / "config.json").write_text(json.dumps(config))
        (tmp_path / "model.safetensors").write_bytes(b"not read")
        call = {"name_or_dir": tmp_path}
        named = str(tmp_path / "config.json")
    else:  # the Hugging Face cache's layout: a snapshot named by the ref "main"
        repo = tmp_path / "models--someone--llama-3.1-like"
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
        (snapshot / "config.json").write_text(json.dumps(config))
        call = {
            "name_or_dir": "someone/llama-3.1-like",
            "cache_dir": tmp_path,
            "local_files_only": True,
        }
        named = "someone/llama-3.1-like's config.json"
    with pytest.raises(hf.UnconvertibleConfigError, match="rope_type='llama3'") as err:
        hf.from_pretrained(**call)
    assert named in str(err.value)  # says which file
    # an override that the weights' shapes fix is refused before any file is read, too
    with pytest.raises(ValueError, match="from_pretrained can only override"):
        hf.from_pretrained(**call, n_blocks=1)


def test_from_pretrained_refuses_other_architectures_and_explains_offline(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    # a ValueError, and the error chapter 13's optional cell catches
    with pytest.raises(hf.UnconvertibleConfigError, match="'bert' model; gptlib reads GPT-2"):
        hf.from_pretrained(tmp_path)
    with pytest.raises(hf.PretrainedUnavailableError) as err:
        hf.from_pretrained("HuggingFaceTB/SmolLM2-135M", cache_dir=tmp_path, local_files_only=True)
    message = str(err.value)
    for part in (
        "HuggingFaceTB/SmolLM2-135M",
        "config.json",
        "hf download",
        "SmolLM2-135M-weights",
        "tokenizer.json",
    ):
        assert part in message, part


def test_smollm2_shape_grouped_query_attention_and_tied_embeddings():
    # SmolLM2-135M's layout, small: 9 query heads share 3 key/value heads, the output layer is
    # the token embedding, and the feed-forward width is not the one gptlib would pick
    reference = small_llama(
        8,
        hidden_size=72,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=192,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
    )
    assert "lm_head.weight" in reference.state_dict()  # tied: the same tensor under two names
    model = hf.from_hf(reference)
    c = model.config
    assert (c.n_heads, c.n_kv_heads, c.head_size, c.d_ff) == (9, 3, 8, 192)
    assert c.tie_embeddings and c.rope_base == 100_000.0
    assert model.lm_head.weight is model.token_embedding.weight
    assert model.blocks[0].attn.W_k.weight.shape == (24, 72)  # 3 heads of 8
    with torch.no_grad():
        diff = (model(ids(9))[0] - reference(ids(9)).logits).abs().max().item()
    assert diff < TOL
    back = hf.to_hf(model)
    assert back.config.num_key_value_heads == 3 and back.config.tie_word_embeddings
    assert back.lm_head.weight is back.model.embed_tokens.weight
    ours, theirs = back.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("arch", [hf.GPT2, hf.LLAMA], ids=lambda a: a.name)
def test_each_name_map_names_every_tensor_but_the_output_layer_once(arch, bias):
    config = arch.make_config(n_blocks=3, d_model=64, n_heads=4, context_length=16, bias=bias)
    if arch is hf.GPT2 and not bias:
        with pytest.raises(ValueError, match="bias=False \\(GPT-2 needs bias=True\\)"):
            arch.check(config)
        return
    ours = [name for pair in arch.name_map(config) for name in pair.ours]
    assert len(ours) == len(set(ours))
    with torch.device("meta"):
        expected = set(GPT(config).state_dict()) - {"lm_head.weight"}
    assert set(ours) == expected
    assert all(pair.hf.startswith(arch.body_prefix) for pair in arch.name_map(config))


def test_the_architecture_can_be_named_and_is_otherwise_the_closest():
    llama = hf.llama_config(vocab_size=VOCAB)
    assert isinstance(hf.config_to_hf(llama), transformers.LlamaConfig)
    assert isinstance(hf.config_to_hf(llama, architecture="llama"), transformers.LlamaConfig)
    with pytest.raises(
        ValueError, match="cannot be expressed as a GPT-2 model: .*positions='rope'"
    ):
        hf.config_to_hf(llama, architecture="gpt2")
    with pytest.raises(ValueError, match="architecture='bert' describes a 'bert' model"):
        hf.to_hf(GPT(llama), architecture="bert")
    # one switch away from a Llama, four from a GPT-2: the reasons given are Llama's
    with pytest.raises(ValueError, match="as a Llama model: norm_type='layernorm' \\(Llama"):
        hf.config_to_hf(replace(llama, norm_type="layernorm"))
    # a Llama state dict read as GPT-2 is refused before any tensor is touched
    reference = small_llama(10)
    with pytest.raises(ValueError, match="cannot be expressed as a GPT-2"):
        hf.state_dict_from_hf(reference.state_dict(), hf.config_from_hf(reference.config), "gpt2")
