"""gptlib: the library behind the book. Each module holds one step of the pipeline.

Imports flow one way (tests/test_structure.py checks it): ``config`` -> ``model`` ->
``checkpoint`` / ``hf`` / ``fast`` -> ``train`` / ``generate`` -> ``commands`` (the command
lines). This package re-exports the everyday names of the lower layers; it imports neither the
training loop nor the commands, so ``python -m gptlib.train`` and ``python -m gptlib.generate``
run their modules once.
"""

from gptlib.data import (
    CORPORA,
    ChecksumError,
    CorpusUnavailableError,
    data_dir,
    download,
    get_batch,
    load_corpus,
    train_val_split,
)
from gptlib.files import atomic_write_bytes
from gptlib.kv_cache import KVCache
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
