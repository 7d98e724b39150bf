"""The bridge to Hugging Face: gptlib's ``GPT`` with the right switches *is* OpenAI's GPT-2
(chapter 12) or a Llama (chapter 13).

The two architectures are described in :mod:`gptlib.hf_arch` (their switches, configurations and
name maps: :data:`GPT2` and :data:`LLAMA`); this module moves weights for both, written once:

* :func:`config_from_hf` / :func:`config_to_hf` translate the configurations,
* :func:`state_dict_from_hf` / :func:`state_dict_to_hf` rename and reshape the tensors,
* :func:`from_hf` / :func:`to_hf` convert whole models,
* :func:`from_pretrained` loads real weights from a local folder or the Hub.

From transformers, the architecture is the configuration's ``model_type``. From gptlib, pass
``architecture=`` ("gpt2", "llama"); left out, it is the architecture the configuration is
closest to (the one with the fewest switches to change), whose reasons are listed if it still
does not fit.

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
from pathlib import Path
from typing import Any

import torch

from gptlib.hf_arch import (  # re-exported: gptlib.hf is the front door
    ARCHITECTURES,
    GPT2,
    LLAMA,
    Architecture,
    TensorPair,
    check_gpt2_compatible,
    check_llama_compatible,
    gpt2_config,
    import_transformers,
    llama_config,
)
from gptlib.integrity import refused_pickle
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer

__all__ = [
    "ARCHITECTURES",
    "CONFIG_FILE",
    "GPT2",
    "LLAMA",
    "RUNTIME_FIELDS",
    "WEIGHT_FILES",
    "Architecture",
    "PretrainedUnavailableError",
    "UnconvertibleConfigError",
    "TensorPair",
    "check_gpt2_compatible",
    "check_llama_compatible",
    "config_from_hf",
    "config_to_hf",
    "from_hf",
    "from_pretrained",
    "gpt2_config",
    "gpt2_tokenizer",
    "llama_config",
    "state_dict_from_hf",
    "state_dict_to_hf",
    "to_hf",
]

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
# GPTConfig fields that do not change any tensor's shape, so they may differ from the checkpoint
RUNTIME_FIELDS = ("dropout", "fused_attention")
OUTPUT = "lm_head.weight"  # the output layer, under this name in gptlib and in transformers


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights cannot be had: neither on disk nor downloadable (for instance
    offline), or their config.json describes a model gptlib cannot convert."""


class UnconvertibleConfigError(PretrainedUnavailableError, ValueError):
    """A config.json that gptlib cannot express (another architecture, Llama 3.1's RoPE
    scaling, ...): refused from the file alone, before any weights are read or downloaded."""


# --------------------------------------------------------------------------------------------
# Which architecture
# --------------------------------------------------------------------------------------------


def architecture_of(model_type: str | None, what: str = "this configuration") -> Architecture:
    """The architecture whose transformers ``model_type`` this is, or a ValueError naming the
    ones gptlib converts."""
    for arch in ARCHITECTURES:
        if arch.hf_model_type == model_type:
            return arch
    known = " and ".join(f"{a.name} ({a.hf_model_type!r})" for a in ARCHITECTURES)
    raise ValueError(f"{what} describes a {model_type!r} model; gptlib reads {known} models")


def architecture_for(
    config: GPTConfig, architecture: Architecture | str | None = None
) -> Architecture:
    """The architecture to express ``config`` in, checked: ``architecture`` (an Architecture or a
    ``model_type`` such as "llama"), else the one with the fewest switches to change."""
    if isinstance(architecture, str):
        architecture = architecture_of(architecture, f"architecture={architecture!r}")
    if architecture is None:
        architecture = min(ARCHITECTURES, key=lambda a: len(a.problems(config)))
    architecture.check(config)
    return architecture


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def config_from_hf(hf_config: Any, **overrides: Any) -> GPTConfig:
    """Translate a transformers ``GPT2Config`` or ``LlamaConfig`` into a :class:`GPTConfig`
    (fields overridable)."""
    arch = architecture_of(getattr(hf_config, "model_type", None))
    return arch.config_from_hf(hf_config, **overrides)


def config_to_hf(
    config: GPTConfig,
    attn_implementation: str | None = None,
    architecture: Architecture | str | None = None,
) -> Any:
    """Translate a :class:`GPTConfig` into a transformers ``GPT2Config`` or ``LlamaConfig``.

    ``attn_implementation`` ("eager", "sdpa", ...) picks transformers' attention code; left out,
    transformers chooses.
    """
    hf_config = architecture_for(config, architecture).config_to_hf(config)
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    return hf_config


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _listed(names: list[str]) -> str:
    return ", ".join(map(repr, names[:6])) + (" ..." if len(names) > 6 else "")


def _expected_shapes(config: GPTConfig) -> dict[str, torch.Size]:
    """Every tensor gptlib's GPT has for ``config``, built on the meta device (no memory)."""
    with torch.device("meta"):
        reference = GPT(config)
    return {k: v.shape for k, v in reference.state_dict().items()}


def _hf_shape(pair: TensorPair, ours: dict[str, torch.Size]) -> tuple[int, ...]:
    """The shape transformers stores ``pair`` in: gptlib's tensors stacked, maybe transposed."""
    first = ours[pair.ours[0]]
    shape = (sum(ours[name][0] for name in pair.ours), *first[1:])
    return shape[::-1] if pair.transposed else shape


def _hf_source(hf_state_dict: Mapping[str, torch.Tensor], arch: Architecture) -> dict:
    """The tensors under their full names (the body prefix added where a checkpoint leaves it
    out, as OpenAI's GPT-2 does), the non-parameter buffers left out."""
    src = {}
    for key, value in hf_state_dict.items():
        if key.endswith(arch.buffers):
            continue
        if key != OUTPUT and not key.startswith(arch.body_prefix):
            key = arch.body_prefix + key
        src[key] = value
    return src


def _check_source(src: dict, pairs: list[TensorPair], config: GPTConfig, arch: Architecture):
    """Raise ValueError naming every missing, unknown or mis-shaped tensor of ``src``."""
    expected = _expected_shapes(config)
    missing = [p.hf for p in pairs if p.hf not in src]
    if not config.tie_embeddings and OUTPUT not in src:
        missing.append(OUTPUT)
    unknown = sorted(set(src) - {p.hf for p in pairs} - {OUTPUT})
    wrong = [
        f"{p.hf}: {tuple(src[p.hf].shape)} instead of {_hf_shape(p, expected)}"
        for p in pairs
        if p.hf in src and tuple(src[p.hf].shape) != _hf_shape(p, expected)
    ]
    problems = [f"no {_listed(missing)}"] if missing else []
    problems += [f"tensors gptlib does not know: {_listed(unknown)}"] if unknown else []
    problems += ["wrong shapes: " + "; ".join(wrong[:6])] if wrong else []
    if problems:
        raise ValueError(
            "the Hugging Face state dict has " + "; ".join(problems) + f". Is it a {arch.name} "
            f"checkpoint with {config.n_blocks} blocks, d_model {config.d_model}, vocab "
            f"{config.vocab_size} and context {config.context_length}? Build the configuration "
            "from the checkpoint with config_from_hf(...)."
        )


def _output_layer(src: dict, embedding: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """The output layer's weight: the token embedding when tied (checked), else lm_head."""
    head = src.get(OUTPUT)
    if not config.tie_embeddings:
        return head
    if head is not None and head.data_ptr() != embedding.data_ptr():
        if not torch.equal(head, embedding):
            raise ValueError(
                "the checkpoint's lm_head.weight differs from its token embedding, so its "
                "embeddings are not tied; convert it with tie_embeddings=False"
            )
    return embedding


def state_dict_from_hf(
    hf_state_dict: Mapping[str, torch.Tensor],
    config: GPTConfig,
    architecture: Architecture | str | None = None,
) -> dict[str, torch.Tensor]:
    """Rename and reshape a transformers state dict into gptlib ``GPT`` keys.

    Reads the keys of ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` and of the bare bodies
    (``GPT2Model``, OpenAI's original checkpoint: ``h.0...``, no output layer when tied); the
    buffers old checkpoints carry are skipped. Packed and transposed tensors are split and
    transposed to ``nn.Linear``'s layout (see each architecture's name map); tensors that need no
    reshaping are returned as they are (not copied).
    """
    arch = architecture_for(config, architecture)
    src = _hf_source(hf_state_dict, arch)
    pairs = arch.name_map(config)
    _check_source(src, pairs, config, arch)
    out = {}
    for p in pairs:
        t = src[p.hf].t() if p.transposed else src[p.hf]
        if len(p.ours) == 1:
            out[p.ours[0]] = t.contiguous() if p.transposed else t
        else:  # packed side by side: (n * out, in) once in nn.Linear's layout
            parts = t.chunk(len(p.ours))  # shapes checked above: n equal parts
            out |= {name: part.contiguous() for name, part in zip(p.ours, parts, strict=True)}
    out[OUTPUT] = _output_layer(src, out["token_embedding.weight"], config)
    return out


def state_dict_to_hf(
    model: GPT, architecture: Architecture | str | None = None
) -> dict[str, torch.Tensor]:
    """gptlib ``GPT`` weights under transformers' keys and layout (new tensors).

    The output layer appears as ``lm_head.weight`` (tied: the token embedding again), as in
    ``GPT2LMHeadModel.state_dict()`` and ``LlamaForCausalLM.state_dict()``.
    """
    config = model.config
    arch = architecture_for(config, architecture)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {}
    for p in arch.name_map(config):
        t = torch.cat([sd[name] for name in p.ours]) if len(p.ours) > 1 else sd[p.ours[0]]
        out[p.hf] = t.t().contiguous() if p.transposed else t.clone()
        if p.ours == ("token_embedding.weight",) and config.tie_embeddings:
            out[OUTPUT] = out[p.hf]
    if not config.tie_embeddings:
        out[OUTPUT] = sd[OUTPUT].clone()
    return out


# --------------------------------------------------------------------------------------------
# Whole models
# --------------------------------------------------------------------------------------------


def check_runtime_overrides(overrides: Mapping[str, Any], what: str = "from_hf") -> None:
    """Only :data:`RUNTIME_FIELDS` may be overridden when weights come from a checkpoint."""
    bad = sorted(set(overrides) - set(RUNTIME_FIELDS))
    if bad:
        raise ValueError(
            f"{what} can only override {RUNTIME_FIELDS}, got {bad}: the other fields are fixed "
            "by the checkpoint's tensor shapes"
        )


def build_model(config: GPTConfig, sd: dict[str, torch.Tensor], training: bool) -> GPT:
    """A gptlib ``GPT`` holding copies of the tensors of ``sd`` (gptlib's names), a tied tensor
    copied once, in the given train/eval mode."""
    copies: dict[int, torch.Tensor] = {}
    for key, value in sd.items():
        if id(value) not in copies:
            copies[id(value)] = value.detach().clone()
        sd[key] = copies[id(value)]
    with torch.device("meta"):  # no time spent on a random initialisation we would overwrite
        model = GPT(config)
    model.load_state_dict(sd, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True made two Parameters; share one again
        model.lm_head.weight = model.token_embedding.weight
    model.make_position_tables(model.token_embedding.weight.device)  # were made on 'meta'
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"internal error: tensors left uninitialised after loading: {left[:6]}")
    return model.train(training)


def from_hf(hf_model: Any, **overrides: Any) -> GPT:
    """A gptlib ``GPT`` with the weights of a transformers ``GPT2LMHeadModel`` or
    ``LlamaForCausalLM`` (copied).

    Only :data:`RUNTIME_FIELDS` (``dropout``, ``fused_attention``) may be overridden. The new
    model has the transformers model's dtype, device and train/eval mode.
    """
    check_runtime_overrides(overrides)
    arch = architecture_of(getattr(hf_model.config, "model_type", None), "the model's config")
    config = arch.config_from_hf(hf_model.config, **overrides)
    sd = state_dict_from_hf(hf_model.state_dict(), config, arch)
    return build_model(config, sd, hf_model.training)


def to_hf(
    model: GPT,
    attn_implementation: str | None = None,
    architecture: Architecture | str | None = None,
) -> Any:
    """A transformers ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` with the weights of a gptlib
    ``GPT`` (copied).

    The model must use GPT-2's switches (see :func:`gpt2_config`) or Llama's (see
    :func:`llama_config`). The result has the same dtype, device and train/eval mode.
    """
    arch = architecture_for(model.config, architecture)
    hf_config = config_to_hf(model.config, attn_implementation, arch)
    first = next(model.parameters())
    hf_model = getattr(import_transformers(), arch.hf_class)(hf_config)
    hf_model.load_state_dict(state_dict_to_hf(model, arch), strict=True)
    if model.config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(device=first.device, dtype=first.dtype).train(model.training)


# --------------------------------------------------------------------------------------------
# Pretrained weights
# --------------------------------------------------------------------------------------------


def _looks_like_path(name: str) -> bool:
    """A Hub id is 'name' or 'owner/name'; anything else we read as a (missing) folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _check_local_dir(path: Path) -> None:
    """Raise PretrainedUnavailableError unless ``path`` holds a config and a weights file."""
    missing = []
    if not (path / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES[:2]))
    if missing:
        raise PretrainedUnavailableError(
            f"the folder {path} does not hold a Hugging Face checkpoint: missing "
            f"{', '.join(missing)}. It needs {CONFIG_FILE} and model.safetensors, for example "
            f"from https://huggingface.co/{GPT2_REPO_ID}/tree/main or from "
            "model.save_pretrained(folder)."
        )


def _folder_class(path: Path):
    """The transformers class for the checkpoint in the folder ``path``, from its config.json."""
    try:
        model_type = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise PretrainedUnavailableError(f"cannot read {path / CONFIG_FILE}: {err}") from err
    try:
        arch = architecture_of(model_type, str(path / CONFIG_FILE))
    except ValueError as err:
        raise UnconvertibleConfigError(str(err)) from err
    return getattr(import_transformers(), arch.hf_class)


def _check_convertible(hf_config: Any, where: str, overrides: Mapping[str, Any]) -> None:
    """Raise UnconvertibleConfigError, naming the file and the problem, if gptlib cannot express
    ``hf_config`` with ``overrides`` (another architecture, the RoPE scaling of Llama 3.1, ...):
    decided from config.json alone, before any weights are read or downloaded."""
    try:
        with warnings.catch_warnings():  # from_hf gives its warnings, once, when it converts
            warnings.simplefilter("ignore")
            config_from_hf(hf_config, **overrides)
    except ValueError as err:
        raise UnconvertibleConfigError(f"{where}: {err}") from err


def _unavailable_message(name: str, repo_id: str, cache_dir: str | os.PathLike | None) -> str:
    """Why the weights ``name`` (the Hub repository ``repo_id``) could not be had, and the three
    ways to get them."""
    from huggingface_hub import constants

    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    offline = " (offline mode: HF_HUB_OFFLINE=1)" if constants.is_offline_mode() else ""
    asked = f"'{name}', that is '{repo_id}'" if name != repo_id else f"'{repo_id}'"
    url = f"https://huggingface.co/{repo_id}"
    files = f"{CONFIG_FILE} model.safetensors"
    cache_opt = f" --cache-dir {cache}" if cache_dir is not None else ""
    folder = repo_id.rsplit("/", 1)[-1] + "-weights"
    if repo_id == GPT2_REPO_ID:
        size_note = " (about 0.5 GB for the 124M GPT-2)"
    elif repo_id in HUB_ALIASES.values():
        size_note = ""
    else:  # gptlib's tokenizers are tiktoken's: another model brings its own
        size_note = (
            "; to turn text into ids you also need its tokenizer.json and "
            "tokenizer_config.json (read with transformers.AutoTokenizer)"
        )
    return (
        f"could not load the pretrained weights {asked}: they are not in the Hugging Face cache "
        f"({cache}) and could not be downloaded{offline}.\n"
        f"Two files from {url} are needed: {CONFIG_FILE} and model.safetensors{size_note}. "
        "Any one of these works:\n"
        f"  1. with internet access, call from_pretrained({name!r}) again, or fill the cache "
        f"first with\n       hf download {repo_id} {files}{cache_opt}\n"
        "     (older huggingface_hub: huggingface-cli download ...); offline runs then find them;\n"
        "  2. on another machine with internet access, run\n"
        f"       hf download {repo_id} {files} --local-dir {folder}\n"
        f"     copy the {folder} folder here and call from_pretrained('{folder}');\n"
        f"  3. download {url}/resolve/main/{CONFIG_FILE} and {url}/resolve/main/model.safetensors "
        "into one folder yourself and pass that folder's path."
    )


def _from_hub(
    name: str,
    cache_dir: str | os.PathLike | None,
    local_files_only: bool | None,
    overrides: Mapping[str, Any],
):
    """The transformers model of the Hub id ``name`` (or its alias), from the cache or the Hub."""
    transformers = import_transformers()
    repo_id = HUB_ALIASES.get(name, name)
    kwargs: dict[str, Any] = {"cache_dir": cache_dir}
    if local_files_only is not None:
        kwargs["local_files_only"] = local_files_only
    try:  # config.json first: its model_type picks the class, before the weights are fetched
        hf_config = transformers.AutoConfig.from_pretrained(repo_id, **kwargs)
        _check_convertible(hf_config, f"{repo_id}'s {CONFIG_FILE}", overrides)
        arch = architecture_of(hf_config.model_type, f"{repo_id}'s {CONFIG_FILE}")
        cls = getattr(transformers, arch.hf_class)
        with _pickles_refused(repo_id):
            return cls.from_pretrained(repo_id, config=hf_config, **kwargs)
    except OSError as err:  # transformers reports missing files and network errors this way
        msg = _unavailable_message(name, repo_id, cache_dir)
        raise PretrainedUnavailableError(f"{msg}\n(transformers said: {err})") from err


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
    """Pretrained GPT-2 or Llama-architecture weights as a gptlib ``GPT`` in eval mode.

    ``name_or_dir`` is either a folder holding ``config.json`` and ``model.safetensors`` (what
    ``save_pretrained`` or ``hf download --local-dir`` write) or a Hub id such as ``"gpt2"`` (an
    alias of ``openai-community/gpt2``) or ``"HuggingFaceTB/SmolLM2-135M"``; ``config.json``'s
    ``model_type`` says which architecture it is. Hub ids are looked up in the Hugging Face
    cache (``cache_dir`` or the default) and downloaded when online; with
    ``local_files_only=True``, or ``HF_HUB_OFFLINE=1``, nothing is downloaded. When the weights
    cannot be had this raises :class:`PretrainedUnavailableError`, saying which files to get and
    where to put them; when config.json describes a model gptlib cannot convert, its subclass
    :class:`UnconvertibleConfigError`, before any weights are read or downloaded.
    ``overrides`` may set ``dropout`` or ``fused_attention``.
    """
    import_transformers()  # the missing-package message before any other
    check_runtime_overrides(overrides, "from_pretrained")  # before any file is read
    name = os.fspath(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        _check_local_dir(path)
        hf_class = _folder_class(path)
        hf_config = hf_class.config_class.from_pretrained(path)
        _check_convertible(hf_config, str(path / CONFIG_FILE), overrides)
        with _pickles_refused(path):
            hf_model = hf_class.from_pretrained(path, config=hf_config, local_files_only=True)
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
        hf_model = _from_hub(name, cache_dir, local_files_only, overrides)
    return from_hf(hf_model, **overrides).eval()


def gpt2_tokenizer() -> Tokenizer:
    """GPT-2's byte-pair tokenizer (tiktoken's ``gpt2`` encoding, 50,257 ids, no re-numbering).

    Offline it needs tiktoken's two cached files, exactly like ``cl100k_base``; see
    :func:`gptlib.tokenizer.get_encoding`.
    """
    return Tokenizer("gpt2")
