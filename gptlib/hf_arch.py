"""The architectures the Hugging Face bridge converts, each described once (chapters 12 and 13).

gptlib's ``GPT`` with the right switches *is* OpenAI's GPT-2 (chapter 12) or a Llama (chapter 13).
An :class:`Architecture` says everything that differs between the two: which switches make a
:class:`~gptlib.model.GPTConfig` that architecture, how its configuration translates to and from
transformers' (``GPT2Config``, ``LlamaConfig``), and its name map, which pairs every tensor's
name in transformers with its name in gptlib and says how its layout differs.
:mod:`gptlib.hf` holds the conversions themselves, written once for both.

* **GPT-2** is a pre-LN decoder with learned positions, GELU (tanh approximation), biases
  everywhere, a final LayerNorm and an output layer tied to the token embedding. Its linear layers
  are ``Conv1D`` modules whose weight is stored as ``(in_features, out_features)``, the transpose of
  ``nn.Linear``'s, and its attention packs the query, key and value projections into one
  ``c_attn`` layer of width ``3 * d_model``.
* **Llama** (Llama 2 and 3, TinyLlama, SmolLM, ...) is a pre-norm decoder with rotary position
  embeddings, RMSNorm, a SwiGLU feed-forward network, grouped-query attention and no biases. Its
  layers are plain ``nn.Linear`` with separate query, key and value projections, and gptlib's RoPE
  uses transformers' layout (pair i = numbers i and i + hs/2), so its name map is a renaming: no
  tensor is transposed, split or permuted.

``transformers`` is optional (``pip install 'gptlib[hf]'``): it is imported only inside the
functions that build its objects, so importing this module never loads it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gptlib.model import GPTConfig


def import_transformers():
    """The ``transformers`` module, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "gptlib.hf needs the Hugging Face 'transformers' package, which is not installed: "
            "pip install 'gptlib[hf]' (or pip install transformers)"
        ) from err
    return transformers


class TensorPair(NamedTuple):
    """One line of a name map: a tensor of transformers and the gptlib tensor(s) it holds."""

    hf: str  # its name in transformers' state dict, e.g. "transformer.h.0.attn.c_attn.weight"
    ours: tuple[str, ...]  # gptlib's names; several when transformers packs them side by side
    transposed: bool = False  # stored as (in, out), the transpose of nn.Linear's (out, in)


@dataclass(frozen=True)
class Architecture:
    """One architecture the bridge converts: its switches, configuration and tensor names."""

    name: str  # as messages say it: "GPT-2", "Llama"
    hf_model_type: str  # transformers' config.model_type
    hf_class: str  # transformers' model with an output layer, e.g. "GPT2LMHeadModel"
    body_prefix: str  # transformers' prefix of every tensor but the output layer
    buffers: tuple[str, ...]  # endings of non-parameter tensors some checkpoints carry (skipped)
    make_config: Callable[..., GPTConfig]  # the 124M GPT-2, or the book's sizes as a Llama
    problems: Callable[[GPTConfig], list[str]]  # why it cannot express a config ([] if it can)
    config_from_hf: Callable[..., GPTConfig]  # (transformers config, **overrides) -> GPTConfig
    config_to_hf: Callable[[GPTConfig], Any]  # GPTConfig -> transformers config
    name_map: Callable[[GPTConfig], list[TensorPair]]  # every tensor but the output layer

    def check(self, config: GPTConfig) -> None:
        """Raise ``ValueError`` (listing every reason) if this architecture cannot express
        ``config``."""
        problems = self.problems(config)
        if problems:
            raise ValueError(
                f"this GPTConfig cannot be expressed as a {self.name} model: "
                + "; ".join(problems)
                + f". Start from gptlib.hf.{self.make_config.__name__}(...) to get a compatible "
                "configuration."
            )


def _switch_problems(config: GPTConfig, needed: dict[str, Any], who: str) -> list[str]:
    return [
        f"{name}={getattr(config, name)!r} ({who} needs {name}={value!r})"
        for name, value in needed.items()
        if getattr(config, name) != value
    ]


# --------------------------------------------------------------------------------------------
# GPT-2 (chapter 12)
# --------------------------------------------------------------------------------------------

GPT2_VOCAB_SIZE = 50_257  # 50,000 merges + 256 byte tokens + <|endoftext|>
GPT2_EOT_ID = 50_256  # id of <|endoftext|>, GPT-2's only special token
GPT2_SWITCHES: dict[str, Any] = {  # what makes a GPTConfig a GPT-2
    "norm_placement": "pre",
    "norm_type": "layernorm",
    "positions": "learned",
    "scale_embeddings": False,
    "bias": True,
    "final_norm": True,
}
# transformers' names for GELU variants -> gptlib's activation names
_ACTIVATIONS_FROM_HF = {
    "gelu_new": "gelu_tanh",  # OpenAI's original formula, the tanh approximation
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula, factored differently
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
}
_ACTIVATIONS_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def gpt2_config(**overrides: Any) -> GPTConfig:
    """The configuration of the 124M-parameter GPT-2, with any field overridden.

    ``gpt2_config(n_blocks=2, d_model=64, n_heads=4, context_length=32)`` gives a small model of
    the same architecture, handy for tests.
    """
    sizes = dict(
        vocab_size=GPT2_VOCAB_SIZE,
        context_length=1024,
        d_model=768,
        n_heads=12,
        n_blocks=12,
        dropout=0.1,
        activation="gelu_tanh",
        tie_embeddings=True,
        norm_eps=1e-5,
        fused_attention=True,  # F.scaled_dot_product_attention: much faster at GPT-2's size
    )
    # built afresh, so that d_ff (4 * d_model) follows an overridden d_model
    return GPTConfig(**(GPT2_SWITCHES | sizes | overrides))


def _gpt2_problems(config: GPTConfig) -> list[str]:
    problems = _switch_problems(config, GPT2_SWITCHES, "GPT-2")
    if config.activation not in _ACTIVATIONS_TO_HF:
        problems.append(f"activation={config.activation!r} has no Hugging Face equivalent")
    if config.n_kv_heads != config.n_heads:
        problems.append(f"n_kv_heads={config.n_kv_heads} (GPT-2 gives every head its own keys)")
    return problems


def _gpt2_config_problems(c) -> list[str]:
    """What gptlib cannot express in a ``GPT2Config``."""
    problems = []
    if not c.scale_attn_weights:
        problems.append("scale_attn_weights=False (gptlib always divides scores by sqrt(d_k))")
    if c.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx=True (not supported by gptlib)")
    if c.add_cross_attention:
        problems.append("add_cross_attention=True (gptlib is decoder-only, no cross-attention)")
    if c.activation_function not in _ACTIVATIONS_FROM_HF:
        problems.append(
            f"activation_function={c.activation_function!r} (supported: "
            f"{', '.join(sorted(_ACTIVATIONS_FROM_HF))})"
        )
    return problems


def _gpt2_config_from_hf(c, **overrides: Any) -> GPTConfig:
    problems = _gpt2_config_problems(c)
    if problems:
        raise ValueError("cannot convert this GPT2Config to gptlib: " + "; ".join(problems))
    rates = {c.resid_pdrop, c.embd_pdrop, c.attn_pdrop}
    if len(rates) > 1 and "dropout" not in overrides:
        warnings.warn(
            f"the GPT2Config has different dropout rates (resid {c.resid_pdrop}, embd "
            f"{c.embd_pdrop}, attn {c.attn_pdrop}); gptlib uses one rate everywhere and takes "
            f"resid_pdrop={c.resid_pdrop}. Pass dropout=... to choose another.",
            stacklevel=3,  # the caller of gptlib.hf.config_from_hf or from_hf
        )
    fields = dict(
        vocab_size=c.vocab_size,
        context_length=c.n_positions,
        d_model=c.n_embd,
        n_heads=c.n_head,
        n_blocks=c.n_layer,
        d_ff=c.n_inner,  # None: 4 * n_embd, for transformers and for gptlib alike
        dropout=float(c.resid_pdrop),
        activation=_ACTIVATIONS_FROM_HF[c.activation_function],
        tie_embeddings=bool(c.tie_word_embeddings),
        norm_eps=float(c.layer_norm_epsilon),
    )
    return gpt2_config(**(fields | overrides))


def _gpt2_config_to_hf(config: GPTConfig):
    # <|endoftext|> only exists in a vocabulary as large as GPT-2's
    eot = GPT2_EOT_ID if config.vocab_size > GPT2_EOT_ID else None
    return import_transformers().GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.context_length,
        n_embd=config.d_model,
        n_layer=config.n_blocks,
        n_head=config.n_heads,
        n_inner=None if config.d_ff == 4 * config.d_model else config.d_ff,
        activation_function=_ACTIVATIONS_TO_HF[config.activation],
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=eot,
        eos_token_id=eot,
    )


def _gpt2_name_map(config: GPTConfig) -> list[TensorPair]:
    """GPT-2's tensors: Conv1D weights are transposed, c_attn holds W_q, W_k, W_v side by side."""
    pairs = [TensorPair("transformer.wte.weight", ("token_embedding.weight",))]
    pairs.append(TensorPair("transformer.wpe.weight", ("position_embedding.weight",)))
    qkv = ("attn.W_q", "attn.W_k", "attn.W_v")
    layers = [("ln_1", ("ln1",), False), ("attn.c_attn", qkv, True)]
    layers += [("attn.c_proj", ("attn.W_o",), True), ("ln_2", ("ln2",), False)]
    layers += [("mlp.c_fc", ("ffn.linear1",), True), ("mlp.c_proj", ("ffn.linear2",), True)]
    for i in range(config.n_blocks):
        for hf, ours, conv in layers:
            weights = tuple(f"blocks.{i}.{name}.weight" for name in ours)
            pairs.append(TensorPair(f"transformer.h.{i}.{hf}.weight", weights, conv))
            biases = tuple(f"blocks.{i}.{name}.bias" for name in ours)
            pairs.append(TensorPair(f"transformer.h.{i}.{hf}.bias", biases))
    pairs.append(TensorPair("transformer.ln_f.weight", ("final_norm.weight",)))
    pairs.append(TensorPair("transformer.ln_f.bias", ("final_norm.bias",)))
    return pairs


GPT2 = Architecture(
    name="GPT-2",
    hf_model_type="gpt2",
    hf_class="GPT2LMHeadModel",
    body_prefix="transformer.",
    buffers=(".attn.bias", ".attn.masked_bias"),  # older checkpoints' causal masks
    make_config=gpt2_config,
    problems=_gpt2_problems,
    config_from_hf=_gpt2_config_from_hf,
    config_to_hf=_gpt2_config_to_hf,
    name_map=_gpt2_name_map,
)
check_gpt2_compatible = GPT2.check


# --------------------------------------------------------------------------------------------
# Llama (chapter 13)
# --------------------------------------------------------------------------------------------

LLAMA_SWITCHES: dict[str, Any] = {  # what makes a GPTConfig a Llama
    "norm_placement": "pre",
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
    sizes = dict(bias=False, tie_embeddings=False, norm_eps=1e-6, dropout=0.0, fused_attention=True)
    # built afresh, so that d_ff and n_kv_heads follow an overridden d_model or n_heads
    return GPTConfig(**(LLAMA_SWITCHES | sizes | overrides))


def _llama_problems(config: GPTConfig) -> list[str]:
    return _switch_problems(config, LLAMA_SWITCHES, "Llama")


def _rope(c) -> tuple[str, float]:
    """The rotary type and base of a LlamaConfig (transformers 5's rope_parameters or older)."""
    params = getattr(c, "rope_parameters", None) or {}
    scaling = getattr(c, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return kind, float(params.get("rope_theta", getattr(c, "rope_theta", 10_000.0)))


def _llama_config_problems(c, rope_type: str) -> list[str]:
    """What gptlib cannot express in a ``LlamaConfig``."""
    problems = []
    if rope_type != "default":
        problems.append(f"rope_type={rope_type!r} (gptlib implements the plain rotation only)")
    if c.hidden_act != "silu":
        problems.append(f"hidden_act={c.hidden_act!r} (gptlib's SwiGLU uses silu)")
    head_dim = getattr(c, "head_dim", None)
    if head_dim is not None and head_dim * c.num_attention_heads != c.hidden_size:
        problems.append(f"head_dim={head_dim} is not hidden_size / num_attention_heads")
    if bool(c.attention_bias) != bool(getattr(c, "mlp_bias", False)):
        problems.append("attention_bias and mlp_bias differ (gptlib has one bias switch)")
    return problems


def _llama_config_from_hf(c, **overrides: Any) -> GPTConfig:
    kind, base = _rope(c)
    problems = _llama_config_problems(c, kind)
    if problems:
        raise ValueError("cannot convert this LlamaConfig to gptlib: " + "; ".join(problems))
    heads = c.num_attention_heads
    fields = dict(
        vocab_size=c.vocab_size,
        context_length=c.max_position_embeddings,
        d_model=c.hidden_size,
        n_heads=heads,
        n_kv_heads=c.num_key_value_heads or heads,
        n_blocks=c.num_hidden_layers,
        d_ff=c.intermediate_size,
        dropout=float(c.attention_dropout),
        rope_base=base,
        bias=bool(c.attention_bias),
        tie_embeddings=bool(c.tie_word_embeddings),
        norm_eps=float(c.rms_norm_eps),
    )
    return llama_config(**(fields | overrides))


def _llama_config_to_hf(config: GPTConfig):
    return import_transformers().LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_blocks,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_size,
        hidden_act="silu",
        max_position_embeddings=config.context_length,
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        attention_bias=config.bias,
        mlp_bias=config.bias,
        attention_dropout=config.dropout,
        bos_token_id=None,  # gptlib's vocabularies have no Llama special tokens
        eos_token_id=None,
    )


def _llama_name_map(config: GPTConfig) -> list[TensorPair]:
    """Llama's tensors: one gptlib tensor each, under another name, in the same layout."""
    pairs = [("model.embed_tokens.weight", "token_embedding.weight")]
    linears = [(f"self_attn.{p}_proj", f"attn.W_{p}") for p in "qkvo"]
    linears += [(f"mlp.{p}_proj", f"ffn.{p}") for p in ("gate", "up", "down")]
    norms = [("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")]
    for i in range(config.n_blocks):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        for hf_name, name in linears:
            pairs.append((f"{hf}{hf_name}.weight", f"{ours}{name}.weight"))
            if config.bias:
                pairs.append((f"{hf}{hf_name}.bias", f"{ours}{name}.bias"))
        pairs += [(f"{hf}{hf_name}.weight", f"{ours}{name}.weight") for hf_name, name in norms]
    pairs.append(("model.norm.weight", "final_norm.weight"))
    return [TensorPair(hf, (ours,)) for hf, ours in pairs]


LLAMA = Architecture(
    name="Llama",
    hf_model_type="llama",
    hf_class="LlamaForCausalLM",
    body_prefix="model.",
    buffers=("rotary_emb.inv_freq",),  # recomputed from the configuration
    make_config=llama_config,
    problems=_llama_problems,
    config_from_hf=_llama_config_from_hf,
    config_to_hf=_llama_config_to_hf,
    name_map=_llama_name_map,
)
check_llama_compatible = LLAMA.check

ARCHITECTURES = (GPT2, LLAMA)
