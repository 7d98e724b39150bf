"""Export a trained gptlib model for the book's "Try the model" page (no kernel needed).

The page runs the model in the reader's browser with a small JavaScript module
(``_static/interactive/gpt-model.js``). This script writes what that module needs:

* ``model.js``: the model's configuration and every weight, float32 little-endian, in one
  base64 string, plus a manifest (name, shape, offset) for each tensor, and the tokens whose
  embedding rows never got a gradient in training (only weight decay shrank them;
  :func:`unread_ids`), which the page marks;
* ``tokenizer.js``: the compact vocabulary (model id -> cl100k id) and the whole cl100k_base
  byte-pair table (each token's bytes, in rank order), so that the page splits any text exactly as
  tiktoken does and can name the tokens the model has never seen.

Both are JavaScript files that assign a global (``window.gptWebModel``, ``window.gptWebTokenizer``)
rather than ``.bin``/``.json`` files fetched at run time: browsers refuse ``fetch`` on ``file://``
pages, but they do run ``<script>`` files, so the page also works from a folder on disk.

Without a checkpoint, :func:`write_missing` writes a ``model.js`` that tells the page to ask the
reader to run chapter 10b first. The book's Sphinx extension (``_ext/gptbook_web.py``) calls
:func:`export` after every HTML build. By hand::

    python tools/export_web_model.py chapters/runs/ch10/checkpoint.pt _build/html/_static/web-model
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from gptlib.checkpoint import load_checkpoint
from gptlib.files import atomic_write_bytes
from gptlib.tokenizer import get_encoding
from gptlib.train import make_optimizer

FORMAT = "gptbook-web-model"
VERSION = 3  # 2: config fields d_ff, norm_placement and norm_eps; 3: unread_ids
# The split pattern that gpt-tokenizer.js re-implements; a tiktoken that changes it must fail here
CL100K_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)
CONFIG_KEYS = (
    "vocab_size",
    "context_length",
    "d_model",
    "n_heads",
    "n_blocks",
    "d_ff",
    "norm_placement",
    "positions",
    "scale_embeddings",
    "activation",
    "bias",
    "tie_embeddings",
    "final_norm",
    "norm_eps",
)


def _js_file(path: Path, global_name: str, payload: dict) -> int:
    """Write ``window.<global_name> = <payload as JSON>;`` and return the file's size."""
    text = f"window.{global_name} = {json.dumps(payload, separators=(',', ':'))};\n"
    atomic_write_bytes(path, text.encode("utf-8"))  # a reader never sees half a file
    return path.stat().st_size


# chapter 13's switches, which the page's JavaScript model does not implement: their book values
BOOK_ONLY = {
    "norm_type": "layernorm",
    "positions": ("sinusoidal", "learned"),
    "activation": ("relu", "gelu", "gelu_tanh"),
}


def check_exportable(config: dict, where: str) -> None:
    """Raise ValueError, naming the switches, for a model the page cannot run."""
    bad = [
        f"{k}={config.get(k)!r}"
        for k, ok in BOOK_ONLY.items()
        if config.get(k) not in (ok if isinstance(ok, tuple) else (ok,))
    ]
    if config.get("n_kv_heads") != config.get("n_heads"):  # grouped-query attention
        bad.append(f"n_kv_heads={config.get('n_kv_heads')!r}")
    if bad:
        raise ValueError(
            f"{where}: the in-browser model runs the book's architecture only, not "
            f"{', '.join(bad)} (chapter 13's switches); export a model trained as in chapter 10b"
        )


def unread_ids(ckpt) -> list[int] | None:  # noqa: ANN001 (a gptlib Checkpoint)
    """The model ids whose embedding row never got a gradient in training: tokens the run never
    read as an input (chapter 10b's held-out-only tokens), still their random start, only shrunk
    by weight decay. AdamW's running mean of squared gradients stays exactly 0 for such a row, and
    only for such a row.
    None when the checkpoint holds no optimizer state (nothing is known about its training)."""
    if ckpt.optimizer_state is None or ckpt.train_config is None:
        return None
    optimizer = make_optimizer(ckpt.model, ckpt.train_config, "cpu")
    optimizer.load_state_dict(ckpt.optimizer_state)
    state = optimizer.state.get(ckpt.model.token_embedding.weight)
    if not state:  # saved before the first step
        return None
    squares = state["exp_avg_sq"]  # (V, d_model)
    return (squares == 0).all(dim=1).nonzero().flatten().tolist()


def model_payload(checkpoint_path: Path) -> dict:
    """The model's config, a manifest of its tensors and their float32 bytes (base64)."""
    ckpt = load_checkpoint(checkpoint_path)
    config = ckpt.model_config.to_dict()
    check_exportable(config, str(checkpoint_path))
    state = ckpt.model.state_dict()  # a tied lm_head appears under both names: stored once
    tensors, chunks, offset, seen = [], [], 0, {}
    for name, tensor in state.items():
        key = tensor.data_ptr()
        if key in seen:
            tensors.append({**seen[key], "name": name})
            continue
        array = tensor.detach().to("cpu").float().numpy().astype("<f4")
        entry = {"name": name, "shape": list(array.shape), "offset": offset}
        tensors.append(entry)
        seen[key] = entry
        chunks.append(array.tobytes())
        offset += array.size
    vocab_ids = list(ckpt.vocab.ids) if ckpt.vocab is not None else None
    return {
        "format": FORMAT,
        "version": VERSION,
        "available": True,
        "config": {k: config[k] for k in CONFIG_KEYS},
        "step": ckpt.step,
        "corpus": ckpt.extra.get("corpus"),  # what it was trained on (None: not recorded)
        "num_parameters": ckpt.model.num_parameters(),
        "tensors": tensors,
        "vocab_ids": vocab_ids,  # model id -> cl100k id (None: the model uses cl100k ids)
        "unread_ids": unread_ids(ckpt),  # model ids never read in training (None: unknown)
        "weights": base64.b64encode(b"".join(chunks)).decode("ascii"),
    }


def tokenizer_payload(encoding_name: str = "cl100k_base") -> dict:
    """Every byte-pair token of the encoding in rank order: one length byte, then its bytes."""
    enc = get_encoding(encoding_name)
    if enc._pat_str != CL100K_PATTERN:  # tiktoken keeps the pattern in a private attribute
        raise RuntimeError(
            f"tiktoken's {encoding_name} split pattern is not the one gpt-tokenizer.js implements;"
            " update both together"
        )
    ranks = enc._mergeable_ranks  # bytes -> rank, ranks 0..n-1
    by_rank = sorted(ranks, key=ranks.__getitem__)
    if [ranks[t] for t in by_rank] != list(range(len(by_rank))) or max(map(len, by_rank)) > 255:
        raise RuntimeError(f"{encoding_name}: expected dense ranks and tokens of <= 255 bytes")
    table = bytearray()
    for token in by_rank:
        table.append(len(token))
        table += token
    return {
        "format": FORMAT,
        "version": VERSION,
        "encoding": encoding_name,
        "n_tokens": len(by_rank),
        "table": base64.b64encode(bytes(table)).decode("ascii"),
    }


def export(checkpoint_path: str | Path, out_dir: str | Path) -> dict:
    """Write ``model.js`` and ``tokenizer.js`` into ``out_dir``; return their sizes in bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model_payload(Path(checkpoint_path))
    if model["vocab_ids"] is None and model["config"]["vocab_size"] < get_encoding().n_vocab:
        raise ValueError(f"{checkpoint_path}: no vocabulary and fewer rows than cl100k has")
    sizes = {
        "model.js": _js_file(out / "model.js", "gptWebModel", model),
        "tokenizer.js": _js_file(out / "tokenizer.js", "gptWebTokenizer", tokenizer_payload()),
    }
    sizes["parameters"] = model["num_parameters"]
    return sizes


def write_missing(out_dir: str | Path, checkpoint_path: str | Path) -> None:
    """Write a ``model.js`` that makes the page explain how to get a trained model."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    message = (
        f"No trained model was found when the book was built ({Path(checkpoint_path).name} is "
        "missing). Run chapter 10b (it trains the model and saves chapters/runs/ch10/"
        "checkpoint.pt), then build the book again."
    )
    _js_file(
        out / "model.js", "gptWebModel", {"format": FORMAT, "available": False, "message": message}
    )
    (out / "tokenizer.js").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a gptlib checkpoint (file or folder)")
    parser.add_argument("out_dir", help="folder to write model.js and tokenizer.js into")
    args = parser.parse_args(argv)
    sizes = export(args.checkpoint, args.out_dir)
    print(json.dumps(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
