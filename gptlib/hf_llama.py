"""The bridge to Llama (chapter 13): gptlib's ``GPT`` with the modern switches *is* a Llama.

A Llama-architecture model (Llama 2 and 3, TinyLlama, SmolLM, ...) is a pre-norm decoder with
rotary position embeddings, RMSNorm, a SwiGLU feed-forward network, grouped-query attention and no
biases. :func:`llama_config` flips those switches in a :class:`~gptlib.model.GPTConfig`; the rest
of this module moves weights between Hugging Face's ``LlamaForCausalLM`` and gptlib's ``GPT``.
Unlike GPT-2's, Llama's layers are plain ``nn.Linear`` layers with separate query, key and value
projections, and gptlib's RoPE uses Hugging Face's layout (pair i = numbers i and i + hs/2), so
the conversion is a renaming: no tensor is transposed, split or permuted.

Use it through :mod:`gptlib.hf`: ``from_hf``, ``to_hf``, ``config_from_hf``, ``config_to_hf``
and ``from_pretrained`` recognise Llama models and configurations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from gptlib.hf_common import (
    build_model,
    check_runtime_overrides,
    check_state_dict,
    import_transformers,
)
from gptlib.model import GPT, GPTConfig

if TYPE_CHECKING:  # only for type checkers: importing transformers is slow and optional
    from transformers import LlamaConfig, LlamaForCausalLM

LLAMA_SWITCHES: dict[str, Any] = {  # what makes a GPTConfig a Llama
    "norm": "pre",
    "norm_type": "rmsnorm",
    "positions": "rope",
    "activation": "swiglu",
    "scale_embeddings": False,
    "final_norm": True,
}


def llama_config(**overrides: Any) -> GPTConfig:
    """The book's sizes with Llama's switches (no biases, untied, eps 1e-6), fields overridable.

    ``llama_config(n_kv_heads=2)`` is the book's model as a Llama with grouped-query attention.
    """
    base = GPTConfig(
        **LLAMA_SWITCHES,
        bias=False,
        tie_embeddings=False,
        layer_norm_eps=1e-6,
        dropout=0.0,
        fused_attention=True,
    )
    return replace(base, **overrides)


def is_llama_config(config: GPTConfig) -> bool:
    """Does ``config`` ask for a Llama (rotary positions)? Then the Llama bridge handles it."""
    return config.positions == "rope"


def check_llama_compatible(config: GPTConfig) -> None:
    """Raise ``ValueError`` (listing every reason) if Llama's layout cannot express ``config``."""
    problems = [
        f"{name}={getattr(config, name)!r} (Llama needs {name}={value!r})"
        for name, value in LLAMA_SWITCHES.items()
        if getattr(config, name) != value
    ]
    if problems:
        raise ValueError(
            "this GPTConfig cannot be expressed as a Llama model: "
            + "; ".join(problems)
            + ". Start from gptlib.hf.llama_config(...) to get a compatible configuration."
        )


def _rope(c: LlamaConfig) -> tuple[str, float]:
    """The rotary type and base of a LlamaConfig (transformers 5's rope_parameters or older)."""
    params = getattr(c, "rope_parameters", None) or {}
    scaling = getattr(c, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return kind, float(params.get("rope_theta", getattr(c, "rope_theta", 10_000.0)))


def llama_config_from_hf(hf_config: LlamaConfig, **overrides: Any) -> GPTConfig:
    """Translate a Hugging Face ``LlamaConfig`` into a :class:`GPTConfig` (fields overridable)."""
    c = hf_config
    kind, base = _rope(c)
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
    problems = []
    if kind != "default":
        problems.append(f"rope_type={kind!r} (gptlib implements the plain rotation only)")
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r} (gptlib's SwiGLU uses silu)")
    head_dim = getattr(c, "head_dim", None)
    if head_dim is not None and head_dim * heads != c.hidden_size:
        problems.append(f"head_dim={head_dim} is not hidden_size / num_attention_heads")
    if bool(c.attention_bias) != bool(getattr(c, "mlp_bias", False)):
        problems.append("attention_bias and mlp_bias differ (gptlib has one bias switch)")
    if problems:
        raise ValueError("cannot convert this LlamaConfig to gptlib: " + "; ".join(problems))
    automatic = llama_config(d_model=c.hidden_size, n_heads=heads).d_ff
    fields = dict(
        vocab_size=c.vocab_size,
        context_length=c.max_position_embeddings,
        d_model=c.hidden_size,
        n_heads=heads,
        n_kv_heads=0 if kv_heads == heads else kv_heads,
        n_blocks=c.num_hidden_layers,
        ffn_hidden=0 if c.intermediate_size == automatic else c.intermediate_size,
        dropout=float(c.attention_dropout),
        rope_base=base,
        bias=bool(c.attention_bias),
        tie_embeddings=bool(c.tie_word_embeddings),
        layer_norm_eps=float(c.rms_norm_eps),
    )
    return llama_config(**(fields | overrides))


def llama_config_to_hf(config: GPTConfig, attn_implementation: str | None = None) -> LlamaConfig:
    """Translate a Llama-compatible :class:`GPTConfig` into a Hugging Face ``LlamaConfig``."""
    check_llama_compatible(config)
    hf_config = import_transformers().LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_blocks,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_size,
        hidden_act="silu",
        max_position_embeddings=config.context_length,
        rms_norm_eps=config.layer_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        attention_bias=config.bias,
        mlp_bias=config.bias,
        attention_dropout=config.dropout,
        bos_token_id=None,  # gptlib's vocabularies have no Llama special tokens
        eos_token_id=None,
    )
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    return hf_config


def llama_name_map(n_blocks: int, bias: bool) -> list[tuple[str, str]]:
    """Every tensor's Hugging Face name and its gptlib name (the output layer apart)."""
    pairs = [("model.embed_tokens.weight", "token_embedding.weight")]
    linears = [(f"self_attn.{p}_proj", f"attn.W_{p}") for p in "qkvo"]
    linears += [(f"mlp.{p}_proj", f"ffn.{p}") for p in ("gate", "up", "down")]
    norms = [("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")]
    for i in range(n_blocks):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        for hf_name, name in linears:
            pairs.append((f"{hf}{hf_name}.weight", f"{ours}{name}.weight"))
            if bias:
                pairs.append((f"{hf}{hf_name}.bias", f"{ours}{name}.bias"))
        pairs += [(f"{hf}{hf_name}.weight", f"{ours}{name}.weight") for hf_name, name in norms]
    pairs.append(("model.norm.weight", "final_norm.weight"))
    return pairs


def llama_state_dict_from_hf(
    hf_state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> dict[str, torch.Tensor]:
    """Rename a ``LlamaForCausalLM`` state dict into gptlib ``GPT`` keys (tensors not copied)."""
    check_llama_compatible(config)
    src = {k: v for k, v in hf_state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
    missing = [hf for hf, _ in llama_name_map(config.n_blocks, config.bias) if hf not in src]
    if missing:
        raise ValueError(
            f"the Hugging Face state dict has no {missing[:3]}; is it a Llama checkpoint with "
            f"{config.n_blocks} blocks (biases: {config.bias})?"
        )
    out = {name: src.pop(hf) for hf, name in llama_name_map(config.n_blocks, config.bias)}
    head = src.pop("lm_head.weight", None)
    if config.tie_embeddings:
        wte = out["token_embedding.weight"]
        if head is not None and head.data_ptr() != wte.data_ptr() and not torch.equal(head, wte):
            raise ValueError(
                "the checkpoint's lm_head.weight differs from its token embedding, so its "
                "embeddings are not tied; convert it with tie_embeddings=False"
            )
        head = wte
    elif head is None:
        raise ValueError("the Hugging Face state dict has no 'lm_head.weight' (untied output)")
    out["lm_head.weight"] = head
    if src:
        raise ValueError(
            f"the Hugging Face state dict has tensors gptlib does not know: {sorted(src)[:6]}"
        )
    check_state_dict(out, config, "the converted state dict")
    return out


def llama_state_dict_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """gptlib ``GPT`` weights under ``LlamaForCausalLM``'s keys (new tensors)."""
    config = model.config
    check_llama_compatible(config)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {hf: sd[name].clone() for hf, name in llama_name_map(config.n_blocks, config.bias)}
    tied = config.tie_embeddings
    out["lm_head.weight"] = (
        out["model.embed_tokens.weight"] if tied else sd["lm_head.weight"].clone()
    )
    return out


def llama_from_hf(hf_model: LlamaForCausalLM | Any, **overrides: Any) -> GPT:
    """A gptlib ``GPT`` with the weights of a Hugging Face ``LlamaForCausalLM`` (copied).

    Only ``dropout`` and ``fused_attention`` may be overridden; the new model has the Hugging
    Face model's dtype, device and train/eval mode.
    """
    check_runtime_overrides(overrides)
    config = llama_config_from_hf(hf_model.config, **overrides)
    sd = llama_state_dict_from_hf(hf_model.state_dict(), config)
    return build_model(config, sd, hf_model.training)


def llama_to_hf(model: GPT, attn_implementation: str | None = None) -> LlamaForCausalLM:
    """A Hugging Face ``LlamaForCausalLM`` with the weights of a gptlib ``GPT`` (copied)."""
    hf_config = llama_config_to_hf(model.config, attn_implementation)
    first = next(model.parameters())
    hf_model = import_transformers().LlamaForCausalLM(hf_config)
    hf_model.load_state_dict(llama_state_dict_to_hf(model), strict=True)
    if model.config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(device=first.device, dtype=first.dtype).train(model.training)
