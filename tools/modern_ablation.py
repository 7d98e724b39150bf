"""Chapter 13's ablation: the book's model against a Llama-style model of the same size.

Trains, on the sales textbook with chapter 10's budget (compact vocabulary, batch 32, 2,500 steps,
AdamW with a cosine schedule, one CPU thread), the book's model and variants of it:

* ``book``: the running example's model (sinusoidal positions, LayerNorm, ReLU, 4 key/value heads);
* ``modern``: all four changes of chapter 13 at once (RoPE, RMSNorm, SwiGLU, grouped-query
  attention with 2 key/value heads) and no biases;
* ``rope``, ``rmsnorm``, ``swiglu``, ``gqa``: one change each, the rest as in the book's model;
* ``llama``: ``modern`` without the book's √d_model factor on the token embeddings, as Llama-style
  models are built;
* ``book:1``, ``modern:1``, ``llama:1``: those again with other seeds (model seed 1, batch seed
  1338), to see how far two runs of the same model land apart.

A variant whose parameter count differs from the book model's by more than 1% gets the
feed-forward width (``d_ff``) that brings it closest, so every model has (almost) the same
number of parameters. Each run records the validation-loss curve and, at the end, the loss over
the whole validation split. After the training runs, the same process times training steps of
every variant, interleaved round by round (the machine may be shared: interleaving spreads any
disturbance over all variants), and keeps the median seconds per step.

Re-run (from the repository root; each run takes 4 to 15 minutes on one CPU thread, depending on
the machine and its load)::

    nice python tools/modern_ablation.py                    # every run, then the timing

or, as the stored file was made, in parallel parts joined by ``--merge`` (which then times)::

    nice python tools/modern_ablation.py --variants book modern rope --rounds 0 --out /tmp/p1.json
    nice python tools/modern_ablation.py --variants rmsnorm swiglu gqa --rounds 0 --out /tmp/p2.json
    nice python tools/modern_ablation.py --variants book:1 --rounds 0 --out /tmp/p3.json
    nice python tools/modern_ablation.py --variants modern:1 --rounds 0 --out /tmp/p4.json
    nice python tools/modern_ablation.py --variants llama llama:1 --rounds 0 --out /tmp/p5.json
    nice python tools/modern_ablation.py --merge /tmp/p[1-5].json

(The stored file's ``llama`` runs were added later to the first eight, without timing them: its
``command`` field says so.)

``--merge`` joins the training results of earlier runs (made in parallel, say) and times all
their variants in this process. The result goes to ``chapters/data/ch13_ablation.json`` by
default; chapter 13 reads it (the chapter itself never trains these models).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from gptlib.example import TRAINING_RUN, running_example
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer
from gptlib.train import TrainConfig, estimate_loss, make_optimizer, train, train_step

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "ch13_ablation.json"
MODEL_SEED = 0  # the running example's model seed (gptlib.example.MODEL_SEED)
PARAM_TOLERANCE = 0.01  # variants within 1% of the book model's parameter count keep their width

TRAIN = TRAINING_RUN  # chapter 10's run, unchanged

MODERN = {
    "positions": "rope",
    "norm_type": "rmsnorm",
    "activation": "swiglu",
    "n_kv_heads": 2,
    "bias": False,
}
VARIANTS = {  # name -> the GPTConfig fields it changes
    "book": {},
    "modern": MODERN,
    "rope": {"positions": "rope"},
    "rmsnorm": {"norm_type": "rmsnorm"},
    "swiglu": {"activation": "swiglu"},
    "gqa": {"n_kv_heads": 2},
    # "modern" keeps the book's sqrt(d_model) factor on the token embeddings; Llama-style models
    # drop it, so this one is the whole Llama recipe
    "llama": {**MODERN, "scale_embeddings": False},
}
DEFAULT_RUNS = [*VARIANTS, "book:1", "modern:1", "llama:1"]  # ":1": the same, other seeds


def n_params(config: GPTConfig) -> int:
    with torch.device("meta"):  # shapes only
        return GPT(config).num_parameters()


def matched_config(base: GPTConfig, changes: dict) -> GPTConfig:
    """``base`` with ``changes``; if that moves the parameter count by more than 1%, the
    feed-forward width that brings it closest to ``base``'s count."""
    # d_ff and n_kv_heads None: worked out again for the changed switches (see GPTConfig)
    target = n_params(base)
    config = replace(base, **({"d_ff": None, "n_kv_heads": None} | changes))
    if abs(n_params(config) - target) <= PARAM_TOLERANCE * target:
        return config
    widths = range(8, 8 * config.d_model + 1)
    best = min(widths, key=lambda h: abs(n_params(replace(config, d_ff=h)) - target))
    return replace(config, d_ff=best)


@torch.no_grad()
def full_val_loss(model: GPT, val: torch.Tensor) -> float:
    """Mean loss over every non-overlapping window of the validation split (eval mode)."""
    model.eval()
    T = model.config.context_length
    n = (len(val) - 1) // T
    x = val[: n * T].view(n, T)  # (n, T)
    y = val[1 : n * T + 1].view(n, T)
    total = sum(
        float(model(xb, yb)[1]) * len(xb) for xb, yb in zip(x.split(64), y.split(64), strict=True)
    )
    return total / n


def data():
    ex = running_example()
    tok = Tokenizer.from_corpus(ex.text)
    train_ids = torch.tensor(tok.vocab.encode(ex.train.tolist()))
    val_ids = torch.tensor(tok.vocab.encode(ex.val.tolist()))
    return ex.config, len(tok.vocab), train_ids, val_ids


def build(config: GPTConfig, seed: int = MODEL_SEED) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def parse_name(name: str) -> tuple[str, int]:
    """``"modern"`` -> ("modern", 0); ``"modern:1"`` -> ("modern", 1): a repeat with other seeds
    (model seed MODEL_SEED + 1, batch seed TRAIN.seed + 1), to see the seed-to-seed spread."""
    variant, _, repeat = name.partition(":")
    if variant not in VARIANTS or not (repeat == "" or repeat.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown variant {name!r}; use one of {list(VARIANTS)}")
    return variant, int(repeat or 0)


def run_variant(name: str, base: GPTConfig, train_ids, val_ids, config_train: TrainConfig) -> dict:
    variant, repeat = parse_name(name)
    config = matched_config(base, VARIANTS[variant])
    config_train = replace(config_train, seed=config_train.seed + repeat)
    model = build(config, MODEL_SEED + repeat)
    start_val = estimate_loss(model, val_ids, config_train)
    print(f"[{name}] {model.num_parameters():,} parameters, d_ff {config.d_ff}", flush=True)
    history = train(model, train_ids, val_ids, config_train, quiet=True)
    full = full_val_loss(model, val_ids)
    print(f"[{name}] val {history['val_loss'][-1]:.4f}, full split {full:.4f}", flush=True)
    return {
        "variant": variant,
        "repeat": repeat,
        "changes": VARIANTS[variant],
        "config": config.to_dict(),
        "parameters": model.num_parameters(),
        "d_ff": config.d_ff,
        "start_val_loss": start_val,
        "history": {k: history[k] for k in ("step", "train_loss", "val_loss")},
        "full_val_loss": full,
        "train_seconds": history["elapsed_s"][-1],
    }


def time_steps(configs: dict[str, GPTConfig], train_ids, rounds: int, steps: int) -> dict:
    """Median seconds per training step of each model, timed in interleaved rounds."""
    models = {name: build(c).train() for name, c in configs.items()}
    optimizers = {name: make_optimizer(m, TRAIN, torch.device("cpu")) for name, m in models.items()}
    g = torch.Generator().manual_seed(0)
    T = next(iter(configs.values())).context_length
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(rounds + 1):  # round 0 warms up and is not kept
        for name, model in models.items():
            starts = torch.randint(len(train_ids) - T, (steps, TRAIN.batch_size), generator=g)
            t0 = time.perf_counter()
            for s in starts:
                x = torch.stack([train_ids[i : i + T] for i in s])  # (B, T)
                y = torch.stack([train_ids[i + 1 : i + T + 1] for i in s])
                train_step(
                    model, optimizers[name], x, y, lr=1e-4, grad_clip=TRAIN.grad_clip, fast=True
                )
            if r:
                samples[name].append((time.perf_counter() - t0) / steps)
    return {name: {"median_s": statistics.median(v), "samples_s": v} for name, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_RUNS, help="NAME or NAME:K")
    parser.add_argument("--merge", nargs="+", type=Path, help="join earlier results, then time")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (0: no timing)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timing round")
    parser.add_argument("--max-iters", type=int, default=TRAIN.max_iters, help="for a quick try")
    args = parser.parse_args(argv)
    for name in args.variants:
        try:
            parse_name(name)  # fail before training if a name is wrong
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))
    torch.set_num_threads(1)  # as chapter 10: one thread, the same sums on every run
    book, vocab_size, train_ids, val_ids = data()
    base = replace(book, vocab_size=vocab_size, fused_attention=True)
    runs: dict[str, dict] = {}
    if args.merge:
        for path in args.merge:
            runs.update(json.loads(path.read_text())["runs"])
    else:
        for name in args.variants:
            config_train = replace(TRAIN, max_iters=args.max_iters)
            runs[name] = run_variant(name, base, train_ids, val_ids, config_train)
            write(args.out, runs, None, args)  # keep what is done if a later run fails
    timing = None
    if args.rounds:
        configs = {run["variant"]: GPTConfig(**run["config"]) for run in runs.values()}
        timing = time_steps(configs, train_ids, args.rounds, args.steps)
        for name, t in timing.items():
            print(f"[{name}] {1000 * t['median_s']:.1f} ms per step", flush=True)
    write(args.out, runs, timing, args)
    return 0


def write(path: Path, runs: dict, timing: dict | None, args: argparse.Namespace) -> None:
    result = {
        "what": "chapter 13's ablation: the book's model and Llama-style variants of about the "
        "same parameter count, trained with chapter 10's settings on the sales textbook",
        "how": "tools/modern_ablation.py (see its docstring); one CPU thread",
        "command": " ".join(["python", "tools/modern_ablation.py", *sys.argv[1:]]),
        "train_config": replace(TRAIN, max_iters=args.max_iters).__dict__,
        "model_seed": MODEL_SEED,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "timing": None
        if timing is None
        else {"rounds": args.rounds, "steps_per_round": args.steps, "seconds_per_step": timing},
        "runs": runs,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
