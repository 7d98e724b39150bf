"""``python -m gptlib.train`` (also ``gptlib-train``): train a GPT on a corpus from the shell.

The command reads a corpus (a named one or a text file), encodes it with tiktoken and a compact
vocabulary, builds a :class:`~gptlib.model.GPT` from the model options, and runs
:func:`gptlib.train.train`, saving ``OUT/checkpoint.pt`` and ``OUT/history.json``. Every option of
the model and of the run is a field of :class:`~gptlib.config.GPTConfig` or
:class:`~gptlib.config.TrainConfig`, help text included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from gptlib import distributed
from gptlib.checkpoint import (
    BEST_NAME,
    DEFAULT_NAME,
    CheckpointError,
    config_from_dict,
    read_checkpoint,
    vocab_from_checkpoint,
)
from gptlib.checks import check_window_fits
from gptlib.commands.options import (
    HelpFormatter,
    OneLineParser,
    UsageError,
    add_config_options,
    config_from_args,
    float_arg,
    usage_error,
)
from gptlib.config import GPTConfig, TrainConfig, resolve_device
from gptlib.data import (
    CORPORA,
    ChecksumError,
    CorpusUnavailableError,
    corpus_title,
    load_corpus,
    train_val_split,
)
from gptlib.files import atomic_write_bytes
from gptlib.interrupt import TrainingInterrupted
from gptlib.memory import check_fits, parameter_count, training_bytes
from gptlib.model import GPT
from gptlib.run import batch_seed
from gptlib.rundir import RunLock, check_writable, remove_stale_temporaries
from gptlib.tokenizer import Tokenizer, TokenizerUnavailableError, UnknownTokenError, Vocabulary
from gptlib.train import train

HISTORY_NAME = "history.json"  # the loss history, beside the checkpoints


def note(condition: bool, message: str) -> None:
    """Tell the user (on stderr) when ``condition`` holds."""
    if condition:
        print(message, file=sys.stderr)


EXAMPLES = """examples:
  python -m gptlib.train sales-textbook --out runs/book --max-iters 2000
  python -m gptlib.train notes.txt --out runs/notes --d-model 128 --context-length 64 \\
      --lr-schedule cosine --warmup-iters 100 --checkpoint-interval 500
  python -m gptlib.train sales-textbook --out runs/book --max-iters 4000 --resume
  python -m gptlib.generate runs/book --prompt "The customer" -n 100

several processes (DistributedDataParallel; gloo on CPU, nccl on CUDA):
  torchrun --nproc_per_node=2 -m gptlib.train sales-textbook --out runs/ddp
several machines (run on each, with its own --node_rank):
  torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 --rdzv_backend=c10d \\
      --rdzv_endpoint=HOST:29500 -m gptlib.train sales-textbook --out runs/ddp
"""


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m gptlib.train``: run and data options, then one per field."""
    p = OneLineParser(
        prog="python -m gptlib.train",
        description=(
            "Train a small GPT on a text corpus and save a checkpoint (OUT/checkpoint.pt) and its "
            "loss history (OUT/history.json). The same command runs under torchrun for several "
            "processes or machines; only rank 0 writes files and logs."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    corpora = ", ".join(CORPORA)
    p.add_argument("corpus", nargs="?", default="sales-textbook", help=f"{corpora} or a text file")
    p.add_argument("--out", default="out", help="output folder for checkpoint.pt / history.json")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--param-digest", metavar="PATH", help="write each rank's weights' sha256")
    d = p.add_argument_group("data")
    d.add_argument("--encoding", default="cl100k_base", help="tiktoken encoding")
    d.add_argument("--full-vocab", action="store_true", help="model every id of the encoding")
    d.add_argument("--val-fraction", type=float_arg, default=0.1, help="share held out")
    g = p.add_argument_group("model (ignored with --resume: the checkpoint's model is used)")
    add_config_options(g, GPTConfig, skip=("vocab_size", "fused_attention"))
    g.add_argument(
        "--attention", choices=("auto", "fused", "explicit"), default="auto",
        help="auto = explicit on CPU (faster there for small models), fused elsewhere",
    )  # fmt: skip
    add_config_options(p.add_argument_group("training"), TrainConfig)
    return p


def _prepare_data(
    args: argparse.Namespace, model_config: GPTConfig, saved: dict | None, ckpt: Path
) -> tuple[GPTConfig, Vocabulary | None, str, torch.Tensor]:
    """The model's config, vocabulary, encoding name and the corpus as model ids; a checkpoint
    to resume from decides the first three."""
    encoding = args.encoding
    if saved is not None:
        encoding = (saved.get("extra") or {}).get("encoding") or encoding
    tiktoken_encoding = Tokenizer(encoding).encoding
    raw_ids = tiktoken_encoding.encode_ordinary(load_corpus(args.corpus))
    if not raw_ids:
        raise UsageError(f"the corpus {args.corpus!r} is empty")
    if saved is not None:
        model_config = config_from_dict(saved["model_config"], ckpt)
        vocab = vocab_from_checkpoint(saved, ckpt)
    else:
        vocab = None if args.full_vocab else Vocabulary.from_ids(raw_ids)
        size = tiktoken_encoding.n_vocab if vocab is None else len(vocab)
        model_config = GPTConfig(**{**model_config.to_dict(), "vocab_size": size})
    ids = torch.tensor(vocab.encode(raw_ids) if vocab is not None else raw_ids, dtype=torch.long)
    return model_config, vocab, encoding, ids


def _split(ids: torch.Tensor, val_fraction: float, context_length: int):
    train_ids, val_ids = train_val_split(ids, val_fraction)
    for name, part in (("the training split", train_ids), ("the validation split", val_ids)):
        try:
            check_window_fits(len(part), context_length, name)
        except ValueError as err:
            raise UsageError(
                f"the corpus is too short: {err} (--context-length), or another --val-fraction"
            ) from None
    return train_ids, val_ids


def _run(
    args: argparse.Namespace, config: TrainConfig, model_config: GPTConfig, device: torch.device
) -> int:
    """Check the output folder, hold it for this run, then train (all ranks call this; only the
    main process touches the folder)."""
    out = Path(args.out)
    if not distributed.current().is_main:
        return _train(args, config, model_config, device)
    check_writable(out)  # before anything slow: a bad --out must not cost a whole run
    with RunLock(out):
        stale = remove_stale_temporaries(out, (DEFAULT_NAME, BEST_NAME, HISTORY_NAME))
        where = f"{out} by an interrupted save"
        note(
            bool(stale) and not args.quiet,
            f"removed {len(stale)} temporary file(s) left in {where}",
        )
        return _train(args, config, model_config, device)


def _train(
    args: argparse.Namespace, config: TrainConfig, model_config: GPTConfig, device: torch.device
) -> int:
    info = distributed.current()
    show = info.is_main and not args.quiet
    out = Path(args.out)
    ckpt = out / DEFAULT_NAME
    saved = read_checkpoint(ckpt) if args.resume and ckpt.exists() else None  # read once
    model_config, vocab, encoding, ids = _prepare_data(args, model_config, saved, ckpt)
    train_ids, val_ids = _split(ids, args.val_fraction, model_config.context_length)
    if saved is not None:
        note(show, f"resuming from {ckpt} (step {saved['step']}); model options are ignored")
    check_fits(
        training_bytes(model_config, config.batch_size, device.type).total,
        f"training this model ({parameter_count(model_config):,} parameters) with batch size "
        f"{config.batch_size}",
        "use a smaller --batch-size, --d-model, --n-blocks or --context-length",
        device,
    )
    torch.manual_seed(config.seed)  # the initial weights (DDP then copies rank 0's to all ranks)
    model = GPT(model_config)
    kind = f"compact vocabulary of {len(vocab):,}" if vocab else f"full {encoding}"
    note(
        show,
        f"model: {model.num_parameters():,} parameters ({kind} tokens); data: {len(train_ids):,}"
        f" training / {len(val_ids):,} validation tokens; device {device}; processes: "
        f"{info.world_size}",
    )
    resume = saved if saved is not None else args.resume  # the checkpoint is read only once
    history = train(
        model, train_ids, val_ids, config, checkpoint_path=ckpt, resume=resume, vocab=vocab,
        quiet=args.quiet, encoding=encoding, corpus=corpus_title(args.corpus),
    )  # fmt: skip
    if info.is_main:
        atomic_write_bytes(out / HISTORY_NAME, json.dumps(history, indent=1).encode())
    if args.param_digest:
        record = {"rank": info.rank, "world_size": info.world_size}
        record |= {"batch_seed": batch_seed(config.seed, info.rank)}
        record |= {"params": distributed.parameter_digest(model)}
        Path(f"{args.param_digest}.rank{info.rank}").write_text(json.dumps(record))
    note(show and bool(history["step"]), _summary(history, out))
    return 0


def _summary(history: dict[str, list[float]], out: Path) -> str:
    """What the run ended with, and which file is which."""
    last = {k: v[-1] for k, v in history.items()}
    text = (
        f"step {int(last['step'])}: train loss {last['train_loss']:.4f}, val loss "
        f"{last['val_loss']:.4f}\n  last: {out / DEFAULT_NAME} (step {int(last['step'])})"
    )
    best = out / BEST_NAME
    if best.exists():
        record = read_checkpoint(best)["extra"].get("best") or {}
        text += (
            f"\n  best: {best} (step {record.get('step')}, the lowest val loss "
            f"{record.get('val_loss', float('nan')):.4f})"
        )
    return text + f"\n  history: {out / HISTORY_NAME}"


def main(argv: list[str] | None = None) -> int:
    """``python -m gptlib.train``: returns the exit status (0 ok, 1 failure, 2 bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(parser, TrainConfig, args)
    if args.corpus not in CORPORA and not Path(args.corpus).is_file():
        parser.error(
            f"corpus {args.corpus!r} is neither a known corpus ({', '.join(CORPORA)}) nor an "
            "existing text file"
        )
    if not 0.0 < args.val_fraction < 1.0:
        parser.error(f"argument --val-fraction: must be between 0 and 1, got {args.val_fraction}")
    try:
        device = resolve_device(config.device)
    except ValueError as err:
        parser.error(f"argument --device: {err}")
    fused = args.attention == "fused" or (args.attention == "auto" and device.type != "cpu")
    model_config = config_from_args(parser, GPTConfig, args, vocab_size=1, fused_attention=fused)
    errors = (CheckpointError, FloatingPointError, TokenizerUnavailableError, OSError, ValueError)
    errors += (CorpusUnavailableError, ChecksumError, UnknownTokenError)
    try:
        info = distributed.init_from_env(device.type)
        return _run(args, config, model_config, resolve_device(config.device, info.local_rank))
    except UsageError as err:
        return usage_error(parser.prog, str(err))
    except errors as err:
        note(distributed.is_main_process(), f"error: {err}")
        return 1
    except TrainingInterrupted as err:  # at a step boundary, saved: the message says where
        note(distributed.is_main_process(), f"error: {err}")
        return 130
    except KeyboardInterrupt:
        note(
            distributed.is_main_process(),
            "error: interrupted; nothing was saved since the last checkpoint (if any)",
        )
        return 130
    finally:
        distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
