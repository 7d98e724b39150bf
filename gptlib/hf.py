"""The bridge to Hugging Face: gptlib's ``GPT`` with the right switches *is* OpenAI's GPT-2
(chapter 12) or a Llama (chapter 13, the Llama half lives in :mod:`gptlib.hf_llama`).

GPT-2 is a pre-LN decoder with learned positions, GELU (tanh approximation), biases everywhere,
a final LayerNorm and an output layer tied to the token embedding. :func:`gpt2_config` flips
those switches in a :class:`~gptlib.model.GPTConfig`; the rest of this module moves weights
between Hugging Face's ``GPT2LMHeadModel`` and gptlib's ``GPT``:

* :func:`config_from_hf` / :func:`config_to_hf` translate the configurations,
* :func:`state_dict_from_hf` / :func:`state_dict_to_hf` rename and reshape the tensors,
* :func:`from_hf` / :func:`to_hf` convert whole models,
* :func:`from_pretrained` loads the real GPT-2 weights from a local folder or the Hub.

Each of these also accepts a Llama model, configuration or folder (``LlamaForCausalLM``, or a
``GPTConfig`` with rotary positions, see :func:`llama_config`) and hands it to the Llama bridge.

Two details of the Hugging Face layout matter. Its linear layers are ``Conv1D`` modules whose
weight is stored as ``(in_features, out_features)``, the transpose of ``nn.Linear``'s; and its
attention packs the query, key and value projections into one ``c_attn`` layer of width
``3 * d_model``, which we split into ``W_q``, ``W_k`` and ``W_v``.

``transformers`` is an optional dependency (``pip install 'gptlib[hf]'``). It is imported inside
the functions that need it, so ``import gptlib`` (and this module) never loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gptlib import hf_llama
from gptlib.hf_common import (  # re-exported: gptlib.hf is the front door
    CONFIG_FILE,
    RUNTIME_FIELDS,
    WEIGHT_FILES,
    PretrainedUnavailableError,
    build_model,
    check_local_dir,
    check_runtime_overrides,
    check_state_dict,
    import_transformers,
    looks_like_path,
    unavailable_message,
)
from gptlib.hf_llama import check_llama_compatible, is_llama_config, llama_config
from gptlib.integrity import refused_pickle
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer

if TYPE_CHECKING:  # only for type checkers: importing transformers is slow and optional
    from transformers import GPT2Config, GPT2LMHeadModel

# The Hub repository of the 124M-parameter GPT-2 and the short names that point to it.
GPT2_REPO_ID = "openai-community/gpt2"
HUB_ALIASES: dict[str, str] = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
GPT2_VOCAB_SIZE = 50_257  # 50,000 merges + 256 byte tokens + <|endoftext|>
GPT2_EOT_ID = 50_256  # id of <|endoftext|>, GPT-2's only special token

# Hugging Face's names for GELU variants -> gptlib's activation names
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
__all__ = [
    "CONFIG_FILE",
    "RUNTIME_FIELDS",
    "WEIGHT_FILES",
    "PretrainedUnavailableError",
    "check_llama_compatible",
    "llama_config",
]

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def gpt2_config(**overrides: Any) -> GPTConfig:
    """The configuration of the 124M-parameter GPT-2, with any field overridden.

    ``gpt2_config(n_blocks=2, d_model=64, n_heads=4, context_length=32)`` gives a small model of
    the same architecture, handy for tests.
    """
    base = GPTConfig(
        vocab_size=GPT2_VOCAB_SIZE,
        context_length=1024,
        d_model=768,
        n_heads=12,
        n_blocks=12,
        ffn_mult=4,
        dropout=0.1,
        norm="pre",
        positions="learned",
        scale_embeddings=False,
        activation="gelu_tanh",
        bias=True,
        tie_embeddings=True,
        final_norm=True,
        layer_norm_eps=1e-5,
        fused_attention=True,  # F.scaled_dot_product_attention: much faster at GPT-2's size
    )
    return replace(base, **overrides)


def check_gpt2_compatible(config: GPTConfig) -> None:
    """Raise ``ValueError`` (listing every reason) if GPT-2's layout cannot express ``config``."""
    needed = {
        "norm": "pre",
        "positions": "learned",
        "scale_embeddings": False,
        "bias": True,
        "final_norm": True,
    }
    problems = [
        f"{name}={getattr(config, name)!r} (GPT-2 needs {name}={value!r})"
        for name, value in needed.items()
        if getattr(config, name) != value
    ]
    if config.activation not in _ACTIVATIONS_TO_HF:
        problems.append(f"activation={config.activation!r} has no Hugging Face equivalent")
    if problems:
        raise ValueError(
            "this GPTConfig cannot be expressed as a GPT-2 model: "
            + "; ".join(problems)
            + ". Start from gptlib.hf.gpt2_config(...) to get a compatible configuration."
        )


def config_from_hf(hf_config: GPT2Config, **overrides: Any) -> GPTConfig:
    """Translate a Hugging Face ``GPT2Config`` (or ``LlamaConfig``) into a :class:`GPTConfig`
    (fields overridable)."""
    c = hf_config
    model_type = getattr(c, "model_type", None)
    if model_type == "llama":
        return hf_llama.llama_config_from_hf(c, **overrides)
    if model_type != "gpt2":
        raise ValueError(
            f"expected a GPT-2 or Llama configuration (model_type 'gpt2' or 'llama'), got "
            f"{model_type!r}"
        )
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
    if c.n_inner is not None and c.n_inner % c.n_embd:
        problems.append(
            f"n_inner={c.n_inner} is not a multiple of n_embd={c.n_embd} (gptlib sizes the "
            "feed-forward layer as ffn_mult * d_model)"
        )
    if problems:
        raise ValueError("cannot convert this GPT2Config to gptlib: " + "; ".join(problems))
    rates = {c.resid_pdrop, c.embd_pdrop, c.attn_pdrop}
    if len(rates) > 1 and "dropout" not in overrides:
        warnings.warn(
            f"the GPT2Config has different dropout rates (resid {c.resid_pdrop}, embd "
            f"{c.embd_pdrop}, attn {c.attn_pdrop}); gptlib uses one rate everywhere and takes "
            f"resid_pdrop={c.resid_pdrop}. Pass dropout=... to choose another.",
            stacklevel=2,
        )
    fields = dict(
        vocab_size=c.vocab_size,
        context_length=c.n_positions,
        d_model=c.n_embd,
        n_heads=c.n_head,
        n_blocks=c.n_layer,
        ffn_mult=4 if c.n_inner is None else c.n_inner // c.n_embd,
        dropout=float(c.resid_pdrop),
        activation=_ACTIVATIONS_FROM_HF[c.activation_function],
        tie_embeddings=bool(c.tie_word_embeddings),
        layer_norm_eps=float(c.layer_norm_epsilon),
    )
    fields.update(overrides)
    return gpt2_config(**fields)


def config_to_hf(config: GPTConfig, attn_implementation: str | None = None) -> GPT2Config:
    """Translate a GPT-2-compatible :class:`GPTConfig` into a Hugging Face ``GPT2Config`` (a
    configuration with rotary positions into a ``LlamaConfig``).

    ``attn_implementation`` ("eager", "sdpa", ...) picks Hugging Face's attention code; left out,
    transformers chooses.
    """
    if is_llama_config(config):
        return hf_llama.llama_config_to_hf(config, attn_implementation)
    check_gpt2_compatible(config)
    GPT2Config = import_transformers().GPT2Config
    # <|endoftext|> only exists in a vocabulary as large as GPT-2's
    eot = GPT2_EOT_ID if config.vocab_size > GPT2_EOT_ID else None
    hf_config = GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.context_length,
        n_embd=config.d_model,
        n_layer=config.n_blocks,
        n_head=config.n_heads,
        n_inner=None if config.ffn_mult == 4 else config.d_ff,
        activation_function=_ACTIVATIONS_TO_HF[config.activation],
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=config.layer_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    return hf_config


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _is_hf_buffer(key: str) -> bool:
    """The causal-mask buffers older GPT-2 checkpoints store; they are not parameters."""
    return key.endswith((".attn.bias", ".attn.masked_bias"))


def name_map(n_blocks: int) -> list[tuple[str, str, bool]]:
    """Every tensor's Hugging Face name (without ``transformer.``), its gptlib name, and whether
    it is a Conv1D weight that must be transposed. Written once, read in both directions; the
    packed ``c_attn`` (query, key and value side by side) and the output layer are handled
    apart."""
    pairs = [("wte.weight", "token_embedding.weight", False)]
    pairs.append(("wpe.weight", "position_embedding.weight", False))
    layers = (("ln_1", "ln1", False), ("ln_2", "ln2", False), ("attn.c_proj", "attn.W_o", True))
    layers += (("mlp.c_fc", "ffn.linear1", True), ("mlp.c_proj", "ffn.linear2", True))
    for i in range(n_blocks):
        for hf_name, name, conv in layers:
            pairs.append((f"h.{i}.{hf_name}.weight", f"blocks.{i}.{name}.weight", conv))
            pairs.append((f"h.{i}.{hf_name}.bias", f"blocks.{i}.{name}.bias", False))
    pairs += [("ln_f.weight", "final_norm.weight", False), ("ln_f.bias", "final_norm.bias", False)]
    return pairs


QKV = ("W_q", "W_k", "W_v")  # the three slices of c_attn, in Hugging Face's order


def _split_qkv(w: torch.Tensor, b: torch.Tensor, C: int, where: str) -> dict[str, torch.Tensor]:
    """c_attn's (C, 3C) Conv1D weight and (3C,) bias -> W_q, W_k, W_v as nn.Linear tensors."""
    if w.shape != (C, 3 * C) or b.shape != (3 * C,):
        raise ValueError(
            f"{where} has shape {tuple(w.shape)} / {tuple(b.shape)}, expected "
            f"({C}, {3 * C}) / ({3 * C},) for d_model {C}"
        )
    out = {}
    for j, name in enumerate(QKV):
        cols = slice(j * C, (j + 1) * C)
        out[f"{name}.weight"] = w[:, cols].t().contiguous()  # (C, C) as (out, in)
        out[f"{name}.bias"] = b[cols].contiguous()  # (C,)
    return out


def _hf_source(hf_state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors under names without ``transformer.``, the causal-mask buffers left out."""
    src = {key.removeprefix("transformer."): value for key, value in hf_state_dict.items()}
    return {k: v for k, v in src.items() if not _is_hf_buffer(k)}


def state_dict_from_hf(
    hf_state_dict: Mapping[str, torch.Tensor], config: GPTConfig
) -> dict[str, torch.Tensor]:
    """Rename and reshape a Hugging Face GPT-2 state dict into gptlib ``GPT`` keys.

    Accepts the keys of ``GPT2LMHeadModel`` (``transformer.h.0...``, ``lm_head.weight``) and of
    ``GPT2Model`` / OpenAI's original checkpoint (``h.0...``, no output layer); the causal-mask
    buffers old checkpoints carry are skipped. Conv1D weights (in, out) are transposed to
    ``nn.Linear``'s (out, in) and ``c_attn`` is split into ``W_q``, ``W_k``, ``W_v``. Tensors
    that need no reshaping are returned as they are (not copied). A Llama configuration reads
    ``LlamaForCausalLM``'s keys instead.
    """
    if is_llama_config(config):
        return hf_llama.llama_state_dict_from_hf(hf_state_dict, config)
    check_gpt2_compatible(config)
    src = _hf_source(hf_state_dict)
    unused = set(src)

    def take(name: str) -> torch.Tensor:
        if name not in src:
            raise ValueError(
                f"the Hugging Face state dict has no {name!r} (nor 'transformer.{name}'); is it a "
                f"GPT-2 checkpoint with {config.n_blocks} blocks?"
            )
        unused.discard(name)
        return src[name]

    out = {}
    for hf_name, name, conv in name_map(config.n_blocks):
        out[name] = take(hf_name).t().contiguous() if conv else take(hf_name)
    for i in range(config.n_blocks):
        w, b = take(f"h.{i}.attn.c_attn.weight"), take(f"h.{i}.attn.c_attn.bias")
        qkv = _split_qkv(w, b, config.d_model, f"h.{i}.attn.c_attn")
        out |= {f"blocks.{i}.attn.{k}": v for k, v in qkv.items()}
    out["lm_head.weight"] = _output_layer(src, out["token_embedding.weight"], config, take)
    unused.discard("lm_head.weight")
    if unused:
        extra = sorted(unused)
        raise ValueError(
            f"the Hugging Face state dict has tensors gptlib does not know: {extra[:6]}"
            f"{' ...' if len(extra) > 6 else ''}; is it a plain GPT-2 language model?"
        )
    check_state_dict(out, config, "the converted state dict")
    return out


def _output_layer(src: dict, wte: torch.Tensor, config: GPTConfig, take) -> torch.Tensor:
    """The output layer's weight: the token embedding when tied (checked), else lm_head."""
    if not config.tie_embeddings:
        return take("lm_head.weight")
    head = src.get("lm_head.weight")
    if head is not None and head.data_ptr() != wte.data_ptr() and not torch.equal(head, wte):
        raise ValueError(
            "the checkpoint's lm_head.weight differs from its token embedding, so its "
            "embeddings are not tied; convert it with tie_embeddings=False"
        )
    return wte


def state_dict_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """gptlib ``GPT`` weights under ``GPT2LMHeadModel``'s keys and Conv1D layout (new tensors).

    The output layer appears as ``lm_head.weight`` (tied: the token embedding again), as in
    ``GPT2LMHeadModel.state_dict()``. A Llama-style model gets ``LlamaForCausalLM``'s keys.
    """
    config = model.config
    if is_llama_config(config):
        return hf_llama.llama_state_dict_to_hf(model)
    check_gpt2_compatible(config)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {}
    for hf_name, name, conv in name_map(config.n_blocks):
        out[f"transformer.{hf_name}"] = sd[name].t().contiguous() if conv else sd[name].clone()
    for i in range(config.n_blocks):
        b, h = f"blocks.{i}.attn.", f"transformer.h.{i}.attn.c_attn."
        w = torch.cat([sd[f"{b}{n}.weight"] for n in QKV], dim=0)  # (3C, C) as (out, in)
        out[f"{h}weight"] = w.t().contiguous()  # (C, 3C) as Conv1D's (in, out)
        out[f"{h}bias"] = torch.cat([sd[f"{b}{n}.bias"] for n in QKV])  # (3C,)
    tied = config.tie_embeddings
    out["lm_head.weight"] = out["transformer.wte.weight"] if tied else sd["lm_head.weight"].clone()
    return out


# --------------------------------------------------------------------------------------------
# Whole models
# --------------------------------------------------------------------------------------------


def from_hf(hf_model: GPT2LMHeadModel | Any, **overrides: Any) -> GPT:
    """A gptlib ``GPT`` with the weights of a Hugging Face ``GPT2LMHeadModel`` or
    ``LlamaForCausalLM`` (copied).

    Only :data:`RUNTIME_FIELDS` (``dropout``, ``fused_attention``) may be overridden. The new
    model has the Hugging Face model's dtype, device and train/eval mode.
    """
    if getattr(hf_model.config, "model_type", None) == "llama":
        return hf_llama.llama_from_hf(hf_model, **overrides)
    check_runtime_overrides(overrides)
    config = config_from_hf(hf_model.config, **overrides)
    sd = state_dict_from_hf(hf_model.state_dict(), config)
    return build_model(config, sd, hf_model.training)


def to_hf(model: GPT, attn_implementation: str | None = None) -> GPT2LMHeadModel:
    """A Hugging Face ``GPT2LMHeadModel`` with the weights of a gptlib ``GPT`` (copied).

    The model must use GPT-2's switches (see :func:`gpt2_config`), or Llama's (see
    :func:`llama_config`; the result is then a ``LlamaForCausalLM``). The result has the same
    dtype, device and train/eval mode.
    """
    if is_llama_config(model.config):
        return hf_llama.llama_to_hf(model, attn_implementation)
    hf_config = config_to_hf(model.config, attn_implementation)
    GPT2LMHeadModel = import_transformers().GPT2LMHeadModel
    first = next(model.parameters())
    hf_model = GPT2LMHeadModel(hf_config)
    hf_model.load_state_dict(state_dict_to_hf(model), strict=True)
    if model.config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(device=first.device, dtype=first.dtype).train(model.training)


# --------------------------------------------------------------------------------------------
# Pretrained weights
# --------------------------------------------------------------------------------------------


_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}  # what from_pretrained reads


def _model_class(path: Path):
    """The transformers class for the checkpoint in the folder ``path``, from its config.json."""
    try:
        model_type = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise PretrainedUnavailableError(f"cannot read {path / CONFIG_FILE}: {err}") from err
    if model_type not in _CLASSES:
        raise ValueError(
            f"{path / CONFIG_FILE} describes a {model_type!r} model; gptlib reads GPT-2 ('gpt2') "
            "and Llama-architecture ('llama') checkpoints"
        )
    return getattr(import_transformers(), _CLASSES[model_type])


@contextlib.contextmanager
def _pickles_refused(where: str | os.PathLike):
    """Turn transformers' raw UnpicklingError for a ``pytorch_model.bin`` that carries pickled
    code into one clear error (the file is refused, never run)."""
    try:
        yield
    except pickle.UnpicklingError as err:
        why = refused_pickle(str(err)) or f"it could not be read safely ({str(err)[:120]})"
        raise PretrainedUnavailableError(
            f"refusing to load the weights in {where} (pytorch_model.bin): {why}. It was refused "
            "for safety: unpickling it could run arbitrary code. Use the model.safetensors file "
            "of the same model instead (a format that holds only tensors)"
        ) from None


def from_pretrained(
    name_or_dir: str | os.PathLike = "gpt2",
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool | None = None,
    **overrides: Any,
) -> GPT:
    """Pretrained GPT-2 (or Llama-architecture) weights as a gptlib ``GPT`` in eval mode.

    ``name_or_dir`` is either a folder holding ``config.json`` and ``model.safetensors`` (what
    ``save_pretrained`` or ``hf download --local-dir`` write; GPT-2 or Llama, read from
    ``config.json``) or a Hub id such as ``"gpt2"`` (an alias of ``openai-community/gpt2``;
    other ids are read as Llama-architecture repositories). Hub ids are looked up in the Hugging
    Face cache (``cache_dir`` or the default) and downloaded when online; with
    ``local_files_only=True``, or ``HF_HUB_OFFLINE=1``, nothing is downloaded. When the weights
    cannot be had this raises :class:`PretrainedUnavailableError`, saying which files to get and
    where to put them.
    ``overrides`` may set ``dropout`` or ``fused_attention``.
    """
    transformers = import_transformers()
    name = os.fspath(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        check_local_dir(path, GPT2_REPO_ID)
        cls = _model_class(path)
        with _pickles_refused(path):
            hf_model = cls.from_pretrained(path, local_files_only=True)
    elif path.exists():
        raise PretrainedUnavailableError(
            f"{path} is a file; pass the folder that holds {CONFIG_FILE} and model.safetensors"
        )
    elif looks_like_path(name):
        raise PretrainedUnavailableError(
            f"the folder {name} does not exist; pass a folder holding {CONFIG_FILE} and "
            f"model.safetensors, or a Hub id such as 'gpt2'"
        )
    else:
        repo_id = HUB_ALIASES.get(name, name)
        gpt2 = repo_id in HUB_ALIASES.values()
        cls = transformers.GPT2LMHeadModel if gpt2 else transformers.LlamaForCausalLM
        kwargs: dict[str, Any] = {"cache_dir": cache_dir}
        if local_files_only is not None:
            kwargs["local_files_only"] = local_files_only
        try:
            with _pickles_refused(repo_id):
                hf_model = cls.from_pretrained(repo_id, **kwargs)
        except OSError as err:  # transformers reports missing files and network errors this way
            size = " (about 0.5 GB for the 124M GPT-2)" if repo_id == GPT2_REPO_ID else ""
            if not gpt2:  # gptlib's tokenizers are tiktoken's: a Llama brings its own
                size = (
                    "; to turn text into ids you also need its tokenizer.json and "
                    "tokenizer_config.json (read with transformers.AutoTokenizer)"
                )
            msg = unavailable_message(name, repo_id, cache_dir, size)
            raise PretrainedUnavailableError(f"{msg}\n(transformers said: {err})") from err
    return from_hf(hf_model, **overrides).eval()


def gpt2_tokenizer() -> Tokenizer:
    """GPT-2's byte-pair tokenizer (tiktoken's ``gpt2`` encoding, 50,257 ids, no re-numbering).

    Offline it needs tiktoken's two cached files, exactly like ``cl100k_base``; see
    :func:`gptlib.tokenizer.get_encoding`.
    """
    return Tokenizer("gpt2")
