"""Reading a Llama model from a GGUF file (chapter 13): its settings and its float32 weights.

GGUF is the single-file format of llama.cpp: a header of named settings (``llama.block_count``,
``tokenizer.chat_template``, ...) followed by the tensors, most of them quantised: cut into blocks
of 32 numbers, each block stored as small integers with a scale (and, for Q4_1, a minimum).
The ``gguf`` package parses the file and dequantises the blocks; this module names the settings
and tensors the way Hugging Face's ``LlamaForCausalLM`` does, so that the Llama bridge converts
them. (``transformers`` reads GGUF too, several times slower, so gptlib does it here.)

llama.cpp stores the query and key matrices with each head's rows reordered for its own rotary
code, pairs (i, i + 1) instead of Hugging Face's pairs (i, i + hs/2): :func:`unpermute` undoes it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

TENSOR_NAMES = {  # GGUF name (in block i) -> Hugging Face name
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
OUTSIDE = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def gguf_reader(path: str | os.PathLike) -> Any:
    """The ``gguf`` package's reader for ``path`` (the file is memory-mapped, not read)."""
    try:
        from gguf import GGUFReader
    except ImportError as err:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf") from err
    return GGUFReader(os.fspath(path))


def _field(reader: Any, name: str, default: Any = None) -> Any:
    field = reader.get_field(name)
    if field is None:
        if default is None:
            raise ValueError(f"the GGUF file has no setting {name!r}; is it a Llama model?")
        return default
    return field.contents()


def llama_settings(reader: Any) -> dict[str, Any]:
    """The model's sizes as ``transformers.LlamaConfig`` keyword arguments."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(
            f"the GGUF file holds a {arch!r} model; gptlib reads Llama-architecture models "
            "(Llama, SmolLM, TinyLlama, ...)"
        )
    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return dict(
        vocab_size=int(embd.shape[1]),  # GGUF lists a matrix's shape as (columns, rows)
        hidden_size=int(_field(reader, "llama.embedding_length")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=int(_field(reader, "llama.attention.head_count")),
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        # the one spelling transformers 4 and 5 both read (5 moves it into rope_parameters)
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10_000.0)),
        tie_word_embeddings="output.weight" not in names,
        hidden_act="silu",
    )


def dequantize(tensor: Any) -> torch.Tensor:
    """One GGUF tensor as float32, in PyTorch's (rows, columns) order."""
    from gguf import quants

    values = quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a copy: writable


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(n_heads * hs, C) in llama.cpp's row order -> Hugging Face's (see the module docstring)."""
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in OUTSIDE:
        return f"{OUTSIDE[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in TENSOR_NAMES:
        return f"model.layers.{parts[1]}.{TENSOR_NAMES[parts[2]]}.{kind}"
    raise ValueError(f"the GGUF file has a tensor gptlib does not know: {gguf_name!r}")


def llama_state_dict(reader: Any, settings: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor, dequantised to float32, under its Hugging Face name."""
    heads = {"attn_q": settings["num_attention_heads"], "attn_k": settings["num_key_value_heads"]}
    out = {}
    for tensor in reader.tensors:
        w = dequantize(tensor)
        kind = tensor.name.split(".")[-2]
        if kind in heads:
            w = unpermute(w, heads[kind])
        out[hf_name(tensor.name)] = w
    return out
