"""The bridge to GPT-2: gptlib's ``GPT`` with the right switches *is* OpenAI's GPT-2.

GPT-2 is a pre-LN decoder with learned positions, GELU (tanh approximation), biases everywhere,
a final LayerNorm and an output layer tied to the token embedding. :func:`gpt2_config` flips
those switches in a :class:`~gptlib.model.GPTConfig`; the rest of this module moves weights
between Hugging Face's ``GPT2LMHeadModel`` and gptlib's ``GPT``:

* :func:`config_from_hf` / :func:`config_to_hf` translate the configurations,
* :func:`state_dict_from_hf` / :func:`state_dict_to_hf` rename and reshape the tensors,
* :func:`from_hf` / :func:`to_hf` convert whole models,
* :func:`from_pretrained` loads the real GPT-2 weights from a local folder or the Hub.

Two details of the Hugging Face layout matter. Its linear layers are ``Conv1D`` modules whose
weight is stored as ``(in_features, out_features)``, the transpose of ``nn.Linear``'s; and its
attention packs the query, key and value projections into one ``c_attn`` layer of width
``3 * d_model``, which we split into ``W_q``, ``W_k`` and ``W_v``.

``transformers`` is an optional dependency (``pip install 'gptlib[hf]'``). It is imported inside
the functions that need it, so ``import gptlib`` (and this module) never loads it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

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
# What a local folder must hold: the configuration and the weights (one of the weight files).
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
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
# GPTConfig fields that do not change any tensor's shape, so they may differ from the checkpoint
RUNTIME_FIELDS = ("dropout", "fused_attention")


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights are neither on disk nor downloadable (for instance offline)."""


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
    """Translate a Hugging Face ``GPT2Config`` into a :class:`GPTConfig` (fields overridable)."""
    c = hf_config
    model_type = getattr(c, "model_type", None)
    if model_type != "gpt2":
        raise ValueError(f"expected a GPT-2 configuration (model_type 'gpt2'), got {model_type!r}")
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
    """Translate a GPT-2-compatible :class:`GPTConfig` into a Hugging Face ``GPT2Config``.

    ``attn_implementation`` ("eager", "sdpa", ...) picks Hugging Face's attention code; left out,
    transformers chooses.
    """
    check_gpt2_compatible(config)
    GPT2Config = _import_transformers().GPT2Config
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


def _expected_shapes(config: GPTConfig) -> dict[str, torch.Size]:
    """Every tensor gptlib's GPT has for ``config``, built on the meta device (no memory)."""
    with torch.device("meta"):
        reference = GPT(config)
    return {k: v.shape for k, v in reference.state_dict().items()}


def _check_state_dict(sd: Mapping[str, torch.Tensor], config: GPTConfig, what: str) -> None:
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    wrong = [
        f"{k}: {tuple(sd[k].shape)} instead of {tuple(s)}"
        for k, s in expected.items()
        if k in sd and sd[k].shape != s
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")
        if wrong:
            parts.append("wrong shapes: " + "; ".join(wrong[:6]))
        raise ValueError(
            f"{what} does not match the configuration ({config.n_blocks} blocks, d_model "
            f"{config.d_model}, vocab {config.vocab_size}, context {config.context_length}): "
            + "; ".join(parts)
            + ". Build the configuration from the checkpoint with config_from_hf(...)."
        )


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
    that need no reshaping are returned as they are (not copied).
    """
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
    _check_state_dict(out, config, "the converted state dict")
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
    ``GPT2LMHeadModel.state_dict()``.
    """
    config = model.config
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
    """A gptlib ``GPT`` with the weights of a Hugging Face ``GPT2LMHeadModel`` (copied).

    Only :data:`RUNTIME_FIELDS` (``dropout``, ``fused_attention``) may be overridden. The new
    model has the Hugging Face model's dtype, device and train/eval mode.
    """
    bad = sorted(set(overrides) - set(RUNTIME_FIELDS))
    if bad:
        raise ValueError(
            f"from_hf can only override {RUNTIME_FIELDS}, got {bad}: the other fields are fixed "
            "by the checkpoint's tensor shapes"
        )
    config = config_from_hf(hf_model.config, **overrides)
    sd = state_dict_from_hf(hf_model.state_dict(), config)
    copies: dict[int, torch.Tensor] = {}  # a tied tensor is copied once
    for key, value in sd.items():
        if id(value) not in copies:
            copies[id(value)] = value.detach().clone()
        sd[key] = copies[id(value)]
    with torch.device("meta"):  # no time spent on a random initialisation we would overwrite
        model = GPT(config)
    model.load_state_dict(sd, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True made two Parameters; share one again
        model.lm_head.weight = model.token_embedding.weight
    _check_no_meta(model)
    return model.train(hf_model.training)


def _check_no_meta(model: GPT) -> None:
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"internal error: tensors left uninitialised after loading: {left[:6]}")


def to_hf(model: GPT, attn_implementation: str | None = None) -> GPT2LMHeadModel:
    """A Hugging Face ``GPT2LMHeadModel`` with the weights of a gptlib ``GPT`` (copied).

    The model must use GPT-2's switches (see :func:`gpt2_config`); the result has the same dtype,
    device and train/eval mode.
    """
    hf_config = config_to_hf(model.config, attn_implementation)
    GPT2LMHeadModel = _import_transformers().GPT2LMHeadModel
    first = next(model.parameters())
    hf_model = GPT2LMHeadModel(hf_config)
    hf_model.load_state_dict(state_dict_to_hf(model), strict=True)
    if model.config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(device=first.device, dtype=first.dtype).train(model.training)


# --------------------------------------------------------------------------------------------
# Pretrained weights
# --------------------------------------------------------------------------------------------


def _import_transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(
            "gptlib.hf needs the Hugging Face 'transformers' package, which is not installed: "
            "pip install 'gptlib[hf]' (or pip install transformers)"
        ) from err
    return transformers


def _looks_like_path(name: str) -> bool:
    """A Hub id is 'name' or 'owner/name'; anything else we read as a (missing) folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _check_local_dir(path: Path) -> None:
    missing = []
    if not (path / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES[:2]))
    if missing:
        raise PretrainedUnavailableError(
            f"the folder {path} does not hold a GPT-2 checkpoint: missing {', '.join(missing)}. "
            f"It needs {CONFIG_FILE} and model.safetensors, for example from "
            f"https://huggingface.co/{GPT2_REPO_ID}/tree/main or from "
            "GPT2LMHeadModel.save_pretrained(folder)."
        )


def _unavailable_message(name: str, repo_id: str, cache_dir: str | os.PathLike | None) -> str:
    from huggingface_hub import constants

    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    offline = " (offline mode: HF_HUB_OFFLINE=1)" if constants.is_offline_mode() else ""
    asked = f"'{name}', that is '{repo_id}'" if name != repo_id else f"'{repo_id}'"
    url = f"https://huggingface.co/{repo_id}"
    files = f"{CONFIG_FILE} model.safetensors"
    cache_opt = f" --cache-dir {cache}" if cache_dir is not None else ""
    return (
        f"could not load the pretrained weights {asked}: they are not in the Hugging Face cache "
        f"({cache}) and could not be downloaded{offline}.\n"
        f"Two files from {url} are needed: {CONFIG_FILE} and model.safetensors "
        "(about 0.5 GB for the 124M GPT-2). Any one of these works:\n"
        f"  1. with internet access, call from_pretrained({name!r}) again, or fill the cache "
        f"first with\n       hf download {repo_id} {files}{cache_opt}\n"
        "     (older huggingface_hub: huggingface-cli download ...); offline runs then find them;\n"
        "  2. on another machine with internet access, run\n"
        f"       hf download {repo_id} {files} --local-dir gpt2-weights\n"
        "     copy the gpt2-weights folder here and call from_pretrained('gpt2-weights');\n"
        f"  3. download {url}/resolve/main/{CONFIG_FILE} and {url}/resolve/main/model.safetensors "
        "into one folder yourself and pass that folder's path."
    )


def from_pretrained(
    name_or_dir: str | os.PathLike = "gpt2",
    *,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool | None = None,
    **overrides: Any,
) -> GPT:
    """The real GPT-2 weights as a gptlib ``GPT`` in eval mode.

    ``name_or_dir`` is either a folder holding ``config.json`` and ``model.safetensors`` (what
    ``save_pretrained`` or ``hf download --local-dir`` write) or a Hub id such as ``"gpt2"``
    (an alias of ``openai-community/gpt2``). Hub ids are looked up in the Hugging Face cache
    (``cache_dir`` or the default) and downloaded when online; with ``local_files_only=True``,
    or ``HF_HUB_OFFLINE=1``, nothing is downloaded. When the weights cannot be had this raises
    :class:`PretrainedUnavailableError`, saying which files to get and where to put them.
    ``overrides`` may set ``dropout`` or ``fused_attention``.
    """
    transformers = _import_transformers()
    name = os.fspath(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        _check_local_dir(path)
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(path, local_files_only=True)
    elif path.exists():
        raise PretrainedUnavailableError(
            f"{path} is a file; pass the folder that holds {CONFIG_FILE} and model.safetensors"
        )
    elif _looks_like_path(name):
        raise PretrainedUnavailableError(
            f"the folder {name} does not exist; pass a folder holding {CONFIG_FILE} and "
            f"model.safetensors, or a Hub id such as 'gpt2'"
        )
    else:
        repo_id = HUB_ALIASES.get(name, name)
        kwargs: dict[str, Any] = {"cache_dir": cache_dir}
        if local_files_only is not None:
            kwargs["local_files_only"] = local_files_only
        try:
            hf_model = transformers.GPT2LMHeadModel.from_pretrained(repo_id, **kwargs)
        except OSError as err:  # transformers reports missing files and network errors this way
            msg = _unavailable_message(name, repo_id, cache_dir)
            raise PretrainedUnavailableError(f"{msg}\n(transformers said: {err})") from err
    return from_hf(hf_model, **overrides).eval()


def gpt2_tokenizer() -> Tokenizer:
    """GPT-2's byte-pair tokenizer (tiktoken's ``gpt2`` encoding, 50,257 ids, no re-numbering).

    Offline it needs tiktoken's two cached files, exactly like ``cl100k_base``; see
    :func:`gptlib.tokenizer.get_encoding`.
    """
    return Tokenizer("gpt2")
