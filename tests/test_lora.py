"""LoRA (chapter 14): the adapter starts as the base model, merges exactly, equals peft's LoRA in
outputs and gradients, trains only A and B, and saves/loads only the adapter, with clear errors."""

from __future__ import annotations

import pytest
import torch
from conftest import random_ids, tiny_model

from gptlib import lora
from gptlib.hf import from_hf
from gptlib.train import make_optimizer, train_step

LLAMA = {"norm_type": "rmsnorm", "positions": "rope", "activation": "swiglu", "bias": False}


def llama_tiny(seed: int = 0):
    return tiny_model(seed, n_kv_heads=2, scale_embeddings=False, **LLAMA)


def randomise_b(model, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g))


def test_b_starts_at_zero_so_the_adapted_model_is_the_base():
    model, base = llama_tiny(), llama_tiny()
    names = lora.apply_lora(model, rank=4, alpha=8)
    assert names == [f"blocks.{i}.attn.{w}" for i in range(2) for w in ("W_q", "W_v")]
    x = random_ids(0, 2, 12)
    assert torch.equal(model(x)[0], base(x)[0])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{m}" for n in names for m in "AB"}
    # parameters: r * (d_in + d_out) per layer; W_v is (32 x 16) with 2 of 4 heads
    assert sum(model.get_parameter(n).numel() for n in trainable) == 2 * 4 * (32 + 24)


def test_merge_gives_the_same_function_with_plain_layers():
    model = llama_tiny()
    lora.apply_lora(model, rank=4, alpha=8, targets=("attn.W_q", "attn.W_v", "ffn.down"))
    randomise_b(model)
    x = random_ids(1, 2, 12)
    before = model(x)[0]
    assert lora.merge_lora(model) == 6 and not lora.lora_layers(model)
    torch.testing.assert_close(model(x)[0], before, atol=1e-5, rtol=0)
    assert isinstance(model.blocks[0].attn.W_q, torch.nn.Linear)
    assert not any(p.requires_grad for p in model.parameters())


def test_lora_equals_peft_in_outputs_and_gradients():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    ours = from_hf(hf_model, fused_attention=False)
    spec = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    theirs = peft.get_peft_model(hf_model, spec)
    lora.apply_lora(ours, rank=4, alpha=8)
    randomise_b(ours)
    pairs = [
        (f"blocks.{i}.attn.W_{p}", f"layers.{i}.self_attn.{p}_proj") for i in range(2) for p in "qv"
    ]
    peft_layers = dict(theirs.named_modules())
    with torch.no_grad():
        for mine, hf in pairs:
            layer = ours.get_submodule(mine)
            peft_layer = next(m for n, m in peft_layers.items() if n.endswith(hf))
            peft_layer.lora_A["default"].weight.copy_(layer.lora_A)
            peft_layer.lora_B["default"].weight.copy_(layer.lora_B)
    x = random_ids(2, 2, 16, V=64)
    _, loss = ours(x[:, :-1], x[:, 1:])
    out = theirs(input_ids=x[:, :-1])
    torch.testing.assert_close(ours(x[:, :-1])[0], out.logits, atol=1e-5, rtol=0)
    hf_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 64), x[:, 1:].reshape(-1))
    loss.backward()
    hf_loss.backward()
    for mine, hf in pairs:
        layer = ours.get_submodule(mine)
        peft_layer = next(m for n, m in peft_layers.items() if n.endswith(hf))
        torch.testing.assert_close(layer.lora_A.grad, peft_layer.lora_A["default"].weight.grad)
        torch.testing.assert_close(layer.lora_B.grad, peft_layer.lora_B["default"].weight.grad)


def test_train_step_moves_only_the_adapter():
    from gptlib.config import TrainConfig

    model = llama_tiny()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    lora.apply_lora(model, rank=2, alpha=4)
    opt = make_optimizer(model, TrainConfig(learning_rate=1e-2, weight_decay=0.0))
    x, y = random_ids(3, 4, 12), random_ids(4, 4, 12)
    losses = [train_step(model, opt, x, y) for _ in range(5)]
    assert losses[-1] < losses[0]
    sd = model.state_dict()
    for k, v in frozen.items():
        key = k.replace("attn.W_q.", "attn.W_q.base.").replace("attn.W_v.", "attn.W_v.base.")
        assert torch.equal(sd[key], v), k
    assert any(layer.lora_B.abs().sum() > 0 for layer in lora.lora_layers(model).values())


def test_save_and_load_only_the_adapter(tmp_path):
    model = llama_tiny()
    lora.apply_lora(model, rank=4, alpha=8, seed=3)
    randomise_b(model)
    path = lora.save_adapter(model, tmp_path / "adapter.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter.pt"]  # no temporary left
    saved = torch.load(path, weights_only=True)
    assert set(saved["tensors"]) == set(lora.adapter_state(model))
    assert not any(".base." in k for k in saved["tensors"])  # the frozen weights are not saved
    fresh = llama_tiny()
    assert lora.load_adapter(fresh, path) == sorted(lora.lora_layers(model))
    x = random_ids(5, 2, 12)
    assert torch.equal(fresh(x)[0], model(x)[0])


def test_adapters_that_do_not_fit_are_clear_errors(tmp_path):
    model = llama_tiny()
    lora.apply_lora(model, rank=4, alpha=8)
    path = lora.save_adapter(model, tmp_path / "adapter.pt")
    with pytest.raises(lora.AdapterError, match="trained for a model with"):
        lora.load_adapter(tiny_model(0, d_model=32, **LLAMA), path)
    other_rank = llama_tiny()
    lora.apply_lora(other_rank, rank=2, alpha=8)
    with pytest.raises(lora.AdapterError, match="does not match the model's LoRA layers"):
        lora.load_adapter(other_rank, path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(lora.AdapterError, match="not a readable adapter"):
        lora.load_adapter(llama_tiny(), tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(lora.AdapterError, match="not a gptlib LoRA adapter"):
        lora.load_adapter(llama_tiny(), tmp_path / "other.pt")
    with pytest.raises(lora.AdapterError, match="no adapter file"):
        lora.load_adapter(llama_tiny(), tmp_path / "missing.pt")


def test_an_adapter_refuses_other_weights_of_the_same_shape(tmp_path):
    model = llama_tiny(seed=0)
    lora.apply_lora(model, rank=4, alpha=8)
    randomise_b(model)
    path = lora.save_adapter(model, tmp_path / "adapter.pt")
    other = llama_tiny(seed=1)  # same config, different numbers
    with pytest.raises(lora.AdapterError, match="trained beside other weights"):
        lora.load_adapter(other, path)
    assert not lora.lora_layers(other)  # refused before touching the model
    nudged = llama_tiny(seed=0)
    with torch.no_grad():
        nudged.blocks[1].attn.W_v.weight[0, 0] += 1e-3  # one number of one adapted layer
    with pytest.raises(lora.AdapterError, match="trained beside other weights"):
        lora.load_adapter(nudged, path)
    assert lora.load_adapter(other, path, check_base=False) == sorted(lora.lora_layers(model))
    assert lora.load_adapter(llama_tiny(seed=0), path)  # the weights it was trained on


def test_bad_requests_are_clear_errors():
    model = llama_tiny()
    with pytest.raises(ValueError, match="is not a linear layer"):
        lora.apply_lora(model, targets=("attn.W_x",))
    with pytest.raises(ValueError, match="rank must be an integer from 1 to 16"):
        lora.apply_lora(model, rank=17)
    lora.apply_lora(model)
    with pytest.raises(ValueError, match="already has LoRA layers"):
        lora.apply_lora(model)
    with pytest.raises(ValueError, match="no LoRA layers to save"):
        lora.save_adapter(llama_tiny(), "never.pt")
