"""The scale study of the appendix "After training": how loudly to add the token vectors.

Trains the running example's model with the compact vocabulary and chapter 10b's settings
(``gptlib.example.TRAINING_RUN``: batch 32, 2,500 steps, AdamW with a cosine schedule, one CPU
thread), once per option:

* ``baseline``: the token vectors as initialised (std 0.02) plus the sinusoidal table;
* ``sqrt_d``: the token vectors times sqrt(d_model) before adding the table (the 2017 paper,
  and the book's default);
* ``learned``: a learned position table, initialised like the token table, as in GPT-2;
* ``big_init``: the token table drawn with std sqrt(1/2), so that a token row is as long as a
  row of the sinusoidal table.

``NAME:K`` runs an option again with model seed K (other initial weights, the same batches), for
a noise estimate; the stored file has ``sqrt_d:1``. For every run it records, on the running
example's batch, the ratio of the token and position lengths at the start and the attention's
content share (the mean total-variation distance between the attention rows of two sequences at
the same block, head and query; query 0 left out) at the start, after 100 steps and at the end,
with the validation-loss curve (``estimate_loss``, evaluated at step 100 and every 250 steps).

Re-run (from the repository root; each run takes minutes on one CPU thread)::

    nice python tools/scale_study.py                      # every option and sqrt_d:1
    nice python tools/scale_study.py --runs sqrt_d --max-iters 200 --out /tmp/try.json

The result goes to ``chapters/data/ch3_scale_study.json`` by default, which the appendix reads
(it never trains these models itself). A run repeated on another machine or gptlib version
lands apart by about as much as another seed does (chapter 10b measured 0.009 nats): compare the
options of one study with each other.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from gptlib.example import MODEL_SEED, TRAINING_RUN, book_config, running_example
from gptlib.model import GPT
from gptlib.tokenizer import Vocabulary
from gptlib.train import train

OUT = Path(__file__).resolve().parent.parent / "chapters" / "data" / "ch3_scale_study.json"
EARLY = 100  # the early evaluation: "after 100 steps"
OPTIONS = {  # name -> (GPTConfig fields, token-table std or None, description)
    "baseline": (
        {"scale_embeddings": False},
        None,
        "token vectors as initialised (std 0.02) plus the sinusoidal table (the old default)",
    ),
    "sqrt_d": (
        {"scale_embeddings": True},
        None,
        "token vectors times sqrt(d_model) = 8 before adding the sinusoidal table (the 2017 paper)",
    ),
    "learned": (
        {"scale_embeddings": False, "positions": "learned"},
        None,
        "a learned position table, initialised like the token table (std 0.02), as in GPT-2",
    ),
    "big_init": (
        {"scale_embeddings": False},
        math.sqrt(0.5),
        "token vectors initialised with std 1/sqrt(2), as long as the position vectors",
    ),
}
DEFAULT_RUNS = [*OPTIONS, "sqrt_d:1"]


def parse_name(name: str) -> tuple[str, int]:
    """``"sqrt_d"`` -> ("sqrt_d", 0); ``"sqrt_d:1"`` -> ("sqrt_d", 1), model seed 1."""
    option, _, seed = name.partition(":")
    if option not in OPTIONS or not (seed == "" or seed.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown run {name!r}; use one of {list(OPTIONS)}")
    return option, int(seed or MODEL_SEED)


def build(option: str, vocab_size: int, seed: int) -> GPT:
    fields, std, _ = OPTIONS[option]
    torch.manual_seed(seed)
    model = GPT(book_config(vocab_size=vocab_size, fused_attention=True, **fields))
    if std is not None:  # re-draw the token table, from the generator seeded above
        torch.nn.init.normal_(model.token_embedding.weight, std=std)
    return model


@torch.no_grad()
def content_share(model: GPT, x: torch.Tensor) -> float:
    """Mean total-variation distance between two sequences' attention rows (query 0 left out)."""
    was_training = model.training
    w = model.eval().attention_weights(x)  # (n_blocks, B, H, T, T)
    model.train(was_training)
    n = w.shape[1]
    tv = [
        0.5 * (w[:, a] - w[:, b]).abs().sum(dim=-1)[..., 1:].mean()
        for a in range(n)
        for b in range(a + 1, n)
    ]
    return float(torch.stack(tv).mean())


@torch.no_grad()
def at_init(model: GPT, x: torch.Tensor) -> dict:
    """The lengths, the content share and the predictions of the untrained model on ``x``."""
    model.eval()
    tokens = model.token_embedding(x)  # (B, T, C)
    if model.config.scale_embeddings:
        tokens = tokens * math.sqrt(model.config.d_model)
    T = x.shape[1]
    if model.position_embedding is not None:
        positions = model.position_embedding.weight[:T]  # (T, C)
    else:
        positions = model.positional_encoding[:T]  # (T, C) the sinusoidal table
    top = model(x)[0].argmax(dim=-1).flatten()  # (B * T,) the most likely next tokens
    most_common = int(top.mode().values)
    return {
        "token_to_position_length_ratio_at_init": float(
            tokens.norm(dim=-1).mean() / positions.norm(dim=-1).mean()
        ),
        "attention_content_share_at_init": content_share(model, x),
        "share_of_positions_with_the_most_common_top_token_at_init": float(
            (top == most_common).float().mean()
        ),
    }


def run(name: str, data: dict, max_iters: int) -> dict:
    option, seed = parse_name(name)
    config = replace(TRAINING_RUN, max_iters=max_iters)
    model = build(option, data["vocab_size"], seed)
    result = {"description": OPTIONS[option][2], **at_init(model, data["x"])}
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.pt"
        args = (model, data["train"], data["val"], config)
        common = {"checkpoint_path": path, "quiet": True, "callbacks": [records.append]}
        train(*args, stop_at=EARLY, **common)  # evaluates at its last step, 100
        result["attention_content_share_after_100_steps"] = content_share(model, data["x"])
        train(*args, resume=True, **common)  # resumes exactly where the first call stopped
    curve = {str(int(r["step"])): r["val_loss"] for r in records}
    result |= {
        "val_loss_after_100_steps": curve[str(EARLY)],
        "val_loss_final": records[-1]["val_loss"],
        "val_loss_curve": curve,
        "train_loss_final": records[-1]["train_loss"],
        "attention_content_share_final": content_share(model, data["x"]),
        "seconds_on_one_cpu_thread": records[-1]["elapsed_s"],
    }
    print(f"[{name}] val loss {result['val_loss_final']:.4f}", flush=True)
    return rounded(result)


def rounded(value):
    """Floats to 4 decimals, as the stored file keeps them."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def example_data() -> dict:
    ex = running_example()
    vocab = Vocabulary.from_ids(ex.ids.tolist())  # chapter 1's compact vocabulary
    return {
        "vocab_size": len(vocab),
        "x": torch.tensor([vocab.encode(row) for row in ex.x.tolist()]),  # (B, T)
        "train": torch.tensor(vocab.encode(ex.train.tolist())),
        "val": torch.tensor(vocab.encode(ex.val.tolist())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="OPTION or OPTION:SEED")
    parser.add_argument("--max-iters", type=int, default=TRAINING_RUN.max_iters)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for name in args.runs:
        try:
            parse_name(name)  # fail before training if a name is wrong
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))
    torch.set_num_threads(1)  # one thread, as chapter 10b
    data = example_data()
    options: dict[str, dict] = {}
    seeds: dict[str, dict] = {}
    for name in args.runs:
        option, seed = parse_name(name)
        results = options if seed == MODEL_SEED else seeds  # the appendix reads both by option
        results[option] = run(name, data, args.max_iters)
        write(args.out, options, seeds, args)  # keep what is done if a later run fails
    return 0


def write(path: Path, options: dict, seeds: dict, args: argparse.Namespace) -> None:
    config = replace(TRAINING_RUN, max_iters=args.max_iters)
    result = {
        "what": "Token-to-position scale study: the running example's model with the compact "
        "vocabulary, trained with chapter 10b's settings, once per option.",
        "how": f"python tools/scale_study.py {' '.join(sys.argv[1:])} (one CPU thread). "
        f"Training: gptlib.train.train with {config}; model seed {MODEL_SEED}. One seed per "
        "option: differences of a few hundredths in the loss are within run-to-run noise.",
        "torch": torch.__version__,
        "options": options,
        "second_seed": {"what": "the same runs with another model seed", "options": seeds},
        "chosen": "sqrt_d",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
