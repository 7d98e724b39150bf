"""gptlib: the library behind the book. Each module holds one step of the pipeline.

Imports flow one way (tests/test_structure.py checks it): ``config`` -> ``model`` ->
``checkpoint`` / ``hf`` -> ``train`` / ``generate``, each command's ``main`` at the end of its
module. This package re-exports the everyday names; ``KVCache`` is looked up in
:mod:`gptlib.generate` only when asked for, so ``python -m gptlib.generate`` runs that module once.
"""

from gptlib.data import (
    CORPORA,
    ChecksumError,
    CorpusUnavailableError,
    atomic_write_bytes,
    data_dir,
    download,
    get_batch,
    load_corpus,
    train_val_split,
)
from gptlib.model import (
    GPT,
    FeedForward,
    GPTConfig,
    MultiHeadAttention,
    SwiGLUFeedForward,
    TransformerBlock,
    apply_rope,
    causal_mask,
    layer_norm,
    merge_heads,
    repeat_kv,
    rms_norm,
    rope_cos_sin,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
    split_heads,
)
from gptlib.tokenizer import (
    Tokenizer,
    TokenizerUnavailableError,
    UnknownTokenError,
    Vocabulary,
    get_encoding,
    token_strings,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "KVCache":  # generation's cache; see the module docstring for why it is lazy
        from gptlib.generate import KVCache

        return KVCache
    raise AttributeError(f"module 'gptlib' has no attribute {name!r}")


__all__ = [
    "CORPORA",
    "GPT",
    "ChecksumError",
    "CorpusUnavailableError",
    "FeedForward",
    "GPTConfig",
    "KVCache",
    "MultiHeadAttention",
    "SwiGLUFeedForward",
    "Tokenizer",
    "TokenizerUnavailableError",
    "TransformerBlock",
    "UnknownTokenError",
    "Vocabulary",
    "apply_rope",
    "atomic_write_bytes",
    "causal_mask",
    "data_dir",
    "download",
    "get_batch",
    "get_encoding",
    "layer_norm",
    "load_corpus",
    "merge_heads",
    "repeat_kv",
    "rms_norm",
    "rope_cos_sin",
    "scaled_dot_product_attention",
    "sinusoidal_positional_encoding",
    "split_heads",
    "token_strings",
    "train_val_split",
]
