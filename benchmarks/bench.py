"""How fast is gptlib next to its peers? ``python benchmarks/bench.py``.

This script is not part of gptlib (nothing in the package imports it). In one run of one harness
it trains, on the same batches of the sales textbook (cl100k ids, the book's shape: batch 4,
context 16, d_model 64, 4 heads, 8 blocks, vocabulary 100,070, dropout 0.1, AdamW lr 1e-3, fp32,
the same torch threads):

* nanoGPT's ``GPT`` (its ``model.py``, given with ``--nanogpt PATH``) and gptlib's ``GPT`` switched
  to the *same architecture* (tied embeddings, no biases, learned positions, GELU, no embedding
  scale), each with its own optimizer set-up: nanoGPT's ``configure_optimizers`` and gradient
  clipping as its ``train.py`` does, gptlib's :func:`gptlib.train.make_optimizer` and
  :func:`gptlib.train.train_step` through :mod:`gptlib.fast`, as :func:`gptlib.train.train` runs
  it, with :class:`gptlib.train.TrainConfig`'s defaults for both (``--decompose`` adds gptlib
  without :mod:`gptlib.fast`, and gptlib's model with nanoGPT's own step);
* the reference article's ``TransformerLanguageModel`` (``--article PATH``; the file is a script:
  only its imports, constant assignments and definitions are run, see :func:`load_article`) with
  its default ``AdamW``, and gptlib's book model (``GPTConfig()``'s defaults);

and prints each one's steady-state iterations/s (best of interleaved rounds: every candidate gets
the same batches in the same round, so a busy moment of the machine hits all of them alike), the
ratios with their targets, the *time to quality* (seconds of training until the validation loss
first reaches a stated value), and generation speed with and without gptlib's KV cache.

The peers' files are never copied into this repository: pass the paths of your own copies.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from gptlib.data import get_batch, load_corpus, train_val_split
from gptlib.generate import generate
from gptlib.model import GPT, GPTConfig
from gptlib.tokenizer import Tokenizer
from gptlib.train import TrainConfig, make_optimizer, train_step

FULL_VOCAB = 100_070  # the largest cl100k id in the book's corpus + 1
BATCH, CONTEXT, D_MODEL, N_HEADS, N_BLOCKS, DROPOUT, LR = 4, 16, 64, 4, 8, 0.1, 1e-3
TARGETS = {"nanogpt": 1.5, "article": 2.0, "kv_cache": 3.0}  # ratios of speed, this machine

NANOGPT_HOW = (
    "nanoGPT's model.py (https://github.com/karpathy/nanoGPT): save it anywhere outside this "
    "repository and pass --nanogpt PATH"
)
ARTICLE_HOW = (
    "the reference article's model.py (https://github.com/waylandzhang/Transformer-from-scratch):"
    " save it anywhere outside this repository and pass --article PATH"
)


class PeerFileError(RuntimeError):
    """A peer's file is missing or does not look like the file the benchmark expects."""


# --------------------------------------------------------------------------------------------
# The peers, loaded from the user's files
# --------------------------------------------------------------------------------------------


def load_nanogpt(path: str | os.PathLike) -> ModuleType:
    """Import nanoGPT's ``model.py`` from ``path`` (it only defines classes: safe to import)."""
    path = Path(path)
    if not path.is_file():
        raise PeerFileError(f"{path} does not exist; get {NANOGPT_HOW}")
    spec = importlib.util.spec_from_file_location("bench_peer_nanogpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its @dataclass looks the module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    gpt, config = getattr(module, "GPT", None), getattr(module, "GPTConfig", None)
    if gpt is None or config is None or not hasattr(gpt, "configure_optimizers"):
        raise PeerFileError(
            f"{path} does not look like nanoGPT's model.py (no GPT class with "
            f"configure_optimizers, or no GPTConfig); get {NANOGPT_HOW}"
        )
    return module


ARTICLE_NAMES = ("batch_size", "context_length", "d_model", "num_blocks", "num_heads", "dropout")
ARTICLE_CLASSES = ("TransformerLanguageModel", "TransformerBlock", "MultiHeadAttention")


def _constant(node: ast.AST) -> bool:
    """A number/string literal, possibly negated (``1e-3``, ``-1``, ``'cpu'``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant)


def _keep(node: ast.stmt) -> bool:
    """Imports, definitions, and ``name = constant`` assignments; nothing that runs work."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)):
        return True
    return (
        isinstance(node, ast.Assign)
        and all(isinstance(t, ast.Name) for t in node.targets)
        and _constant(node.value)
    )


def load_article(path: str | os.PathLike, vocab_size: int = FULL_VOCAB) -> type[torch.nn.Module]:
    """The article's ``TransformerLanguageModel`` class, at the benchmark's shape.

    The file is a script: imported, it would download the data and train for 5000 steps. So it is
    parsed, and only its imports, class and function definitions and ``name = constant``
    hyperparameters are executed, with the hyperparameters (and ``max_token_value``, ``device``)
    replaced by the benchmark's. A file without those names is refused with an explanation.
    """
    path = Path(path)
    if not path.is_file():
        raise PeerFileError(f"{path} does not exist; get {ARTICLE_HOW}")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kept = [node for node in tree.body if _keep(node)]
    classes = {n.name for n in kept if isinstance(n, ast.ClassDef)}
    names = {t.id for n in kept if isinstance(n, ast.Assign) for t in n.targets}
    missing = [c for c in ARTICLE_CLASSES if c not in classes]
    missing += [n for n in ARTICLE_NAMES if n not in names]
    if missing:
        raise PeerFileError(
            f"{path} does not look like the article's model.py: no {', '.join(missing)} at the "
            f"top level; get {ARTICLE_HOW}"
        )
    shape = {
        "batch_size": BATCH, "context_length": CONTEXT, "d_model": D_MODEL,
        "num_blocks": N_BLOCKS, "num_heads": N_HEADS, "dropout": DROPOUT,
        "learning_rate": LR, "max_token_value": vocab_size, "device": "cpu",
    }  # fmt: skip
    overrides = ast.parse("\n".join(f"{k} = {v!r}" for k, v in shape.items())).body
    module = ast.Module(body=kept + overrides, type_ignores=[])
    namespace: dict[str, object] = {"__name__": "bench_peer_article"}
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - definitions only, see above
    return namespace["TransformerLanguageModel"]  # type: ignore[return-value]


def nanogpt_arch_config(vocab_size: int = FULL_VOCAB) -> GPTConfig:
    """gptlib's GPT at nanoGPT's architecture: GPTConfig(block_size=16, vocab_size=100070,
    n_layer=8, n_head=4, n_embd=64, dropout=0.1, bias=False) in nanoGPT's terms."""
    return GPTConfig(
        vocab_size=vocab_size, context_length=CONTEXT, d_model=D_MODEL, n_heads=N_HEADS,
        n_blocks=N_BLOCKS, dropout=DROPOUT, tie_embeddings=True, bias=False,
        positions="learned", activation="gelu", scale_embeddings=False, fused_attention=True,
    )  # fmt: skip


def nanogpt_config(nanogpt: ModuleType, vocab_size: int = FULL_VOCAB):
    return nanogpt.GPTConfig(
        block_size=CONTEXT, vocab_size=vocab_size, n_layer=N_BLOCKS, n_head=N_HEADS,
        n_embd=D_MODEL, dropout=DROPOUT, bias=False,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Candidates: a model and its training step
# --------------------------------------------------------------------------------------------

Batch = tuple[torch.Tensor, torch.Tensor]  # x, y: (B, T) each
NANOGPT, ARTICLE = "nanoGPT GPT", "article's model"  # the peers' rows
# --decompose: gptlib at nanoGPT's architecture without gptlib.fast, and with nanoGPT's own step
NANO_ARCH_BOOK = "gptlib nanoGPT-arch, book step"
NANO_ARCH_PLAIN = "gptlib nanoGPT-arch, nanoGPT's step"


@dataclass
class Candidate:
    """A model with its own training step (batch -> loss) and validation loss (batch -> loss)."""

    name: str
    model: torch.nn.Module
    step: Callable[[torch.Tensor, torch.Tensor], float]
    val_loss: Callable[[torch.Tensor, torch.Tensor], float]


def gptlib_candidate(name: str, config: GPTConfig, seed: int = 0, fast: bool = True) -> Candidate:
    """gptlib's model and step as :func:`gptlib.train.train` runs them (``fast``: through
    :mod:`gptlib.fast`; False: the book's step, ``F.cross_entropy`` and ``clip_grad_norm_``)."""
    torch.manual_seed(seed)
    model = GPT(config)
    train = TrainConfig(learning_rate=LR, device="cpu", fast=fast)  # defaults: wd 0.1, clip 1.0
    optimizer = make_optimizer(model, train)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        return train_step(model, optimizer, x, y, grad_clip=train.grad_clip, fast=train.fast)

    return Candidate(name, model, step, _plain_val(model))


def gptlib_with_nanogpts_step(seed: int = 0) -> Candidate:
    """gptlib's model at nanoGPT's architecture, trained exactly as nanoGPT's row: the same
    AdamW set-up (two groups, not fused on a CPU), ``clip_grad_norm_`` and ``F.cross_entropy``.
    Against nanoGPT's row this measures the models alone."""
    torch.manual_seed(seed)
    model = GPT(nanogpt_arch_config())
    train = TrainConfig(learning_rate=LR)
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(train.beta1, train.beta2))
    return Candidate(NANO_ARCH_PLAIN, model, _plain_step(model, optimizer, train.grad_clip),
                     _plain_val(model))  # fmt: skip


def nanogpt_candidate(nanogpt: ModuleType, seed: int = 0) -> Candidate:
    """nanoGPT's GPT with its configure_optimizers and its train.py's clipping."""
    train = TrainConfig(learning_rate=LR)  # the same defaults as gptlib's (and nanoGPT's own)
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter counts
        model = nanogpt.GPT(nanogpt_config(nanogpt))
        betas = (train.beta1, train.beta2)
        optimizer = model.configure_optimizers(train.weight_decay, LR, betas, "cpu")
    return Candidate(
        NANOGPT, model, _plain_step(model, optimizer, train.grad_clip), _plain_val(model)
    )


def article_candidate(article_model: type[torch.nn.Module], seed: int = 0) -> Candidate:
    """The article's model with its own optimizer: AdamW(model.parameters(), lr) (no clipping)."""
    torch.manual_seed(seed)
    model = article_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    return Candidate(ARTICLE, model, _plain_step(model, optimizer, 0.0), _plain_val(model))


def _plain_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip: float):
    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        model.train()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss.item()

    return step


def _plain_val(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], float]:
    return lambda x, y: model(x, y)[1].item()


# --------------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------------


def book_ids() -> tuple[torch.Tensor, torch.Tensor, str]:
    """The sales textbook as cl100k ids, split 90/10 (gptlib.data), or random ids if absent."""
    try:
        ids = torch.tensor(Tokenizer("cl100k_base").encode(load_corpus("sales-textbook")))
        train, val = train_val_split(ids, 0.1)
        return train, val, f"the sales textbook, {len(ids):,} cl100k tokens"
    except Exception as err:  # noqa: BLE001 - any reason: say it and go on with random ids
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(FULL_VOCAB, (60_000,), generator=g)
        return ids, ids, f"RANDOM ids (the textbook is not available: {err}); no time-to-quality"


def make_batches(data: torch.Tensor, n: int, seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [get_batch(data, BATCH, CONTEXT, generator=g) for _ in range(n)]


def timed_rounds(cands: list[Candidate], data: torch.Tensor, steps: int, rounds: int):
    """Seconds per step of every candidate in every round: round r feeds everyone the same
    ``steps`` batches, in an order that rotates so no one always goes first."""
    per_round: dict[str, list[float]] = {c.name: [] for c in cands}
    for c in cands:  # warm-up: the optimizer allocates its state on the first step
        for x, y in make_batches(data, 3, seed=99):
            c.step(x, y)
    for r in range(rounds):
        batches = make_batches(data, steps, seed=r)
        for c in cands[r % len(cands) :] + cands[: r % len(cands)]:
            start = time.perf_counter()
            for x, y in batches:
                c.step(x, y)
            per_round[c.name].append((time.perf_counter() - start) / steps)
    return per_round


# Time to quality: the pair at nanoGPT's architecture, and the article's model next to gptlib's
# book model. The default target, 7.0, is reached in ~150 steps (lr 1e-3, the sales textbook).
@dataclass
class Progress:
    """One candidate's run towards the validation-loss target."""

    steps: int = 0
    seconds: float = 0.0  # training time only (evaluations are not counted)
    start: float = math.inf  # the validation loss before training
    val: float = math.inf
    reached: bool = False


def time_to_quality(
    cands: list[Candidate], train: torch.Tensor, val: torch.Tensor, args: argparse.Namespace
) -> dict[str, Progress]:
    """Train every candidate from its seeded start on the same batch sequence, ``args.every``
    steps at a time in turn, until its loss on 20 fixed validation batches is <= args.target or
    it has trained ``args.ttq_budget`` seconds."""
    val_batches = make_batches(val, 20, seed=1234)
    gens = {c.name: torch.Generator().manual_seed(7) for c in cands}  # the same draws for all
    progress = {c.name: Progress() for c in cands}
    for c in cands:
        c.model.eval()
        with torch.no_grad():
            progress[c.name].start = statistics.fmean(c.val_loss(x, y) for x, y in val_batches)
    active = list(cands)
    while active:
        for c in list(active):
            p = progress[c.name]
            g = gens[c.name]
            batches = [get_batch(train, BATCH, CONTEXT, generator=g) for _ in range(args.every)]
            start = time.perf_counter()
            for x, y in batches:
                c.step(x, y)
            p.seconds += time.perf_counter() - start
            p.steps += len(batches)
            c.model.eval()
            with torch.no_grad():
                p.val = statistics.fmean(c.val_loss(x, y) for x, y in val_batches)
            p.reached = p.val <= args.target
            if p.reached or p.seconds >= args.ttq_budget:
                active.remove(c)
    return progress


def measure_generation(new_tokens: int, rounds: int) -> float:
    """Tokens/s of gptlib's generate with and without the KV cache (greedy, context 256)."""
    config = GPTConfig(vocab_size=3_771, context_length=256, d_model=128, n_heads=4, n_blocks=4)
    torch.manual_seed(0)
    model = GPT(config).eval()
    print(
        f"\ngeneration (gptlib): {new_tokens} new tokens after a 1-token prompt, greedy, context "
        f"256, d_model 128, 4 heads, 4 blocks, vocab 3,771"
    )
    rate, ids = {False: 0.0, True: 0.0}, {}
    for _ in range(rounds):  # take turns, keep the best
        for cached in (False, True):
            start = time.perf_counter()
            ids[cached] = generate(model, [0], new_tokens, temperature=0, use_cache=cached)
            rate[cached] = max(rate[cached], new_tokens / (time.perf_counter() - start))
    same = "yes" if torch.equal(ids[False], ids[True]) else "NO"
    ratio = rate[True] / rate[False]
    print(f"  without KV cache: {rate[False]:8.1f} tokens/s")
    print(f"  with KV cache:    {rate[True]:8.1f} tokens/s")
    print(f"  cache / no cache: {ratio:.2f}x  (target >= {TARGETS['kv_cache']:g})"
          f"; identical tokens: {same}")  # fmt: skip
    return ratio


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

NANO_ARCH = "gptlib, nanoGPT's architecture"
BOOK = "gptlib book model (GPTConfig())"
BOOK_FUSED = "gptlib book model, fused attention"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Compare gptlib's training speed with nanoGPT's and the article's model.",
    )
    parser.add_argument("--nanogpt", default=None, help="path of nanoGPT's model.py")
    parser.add_argument("--article", default=None, help="path of the article's model.py")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--target", type=float, default=7.0, help="validation loss to reach")
    parser.add_argument("--every", type=int, default=25, help="steps between evaluations")
    parser.add_argument(
        "--ttq-budget", type=float, default=150.0, help="training seconds per model (0: skip)"
    )
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens to generate")
    parser.add_argument("--decompose", action="store_true",
        help="two more rows at nanoGPT's architecture: gptlib's book step (no gptlib.fast), and "
             "gptlib's model with nanoGPT's optimizer set-up (the models alone)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
        help="a smoke run in a few minutes: --steps 4 --rounds 2 --target 9 --ttq-budget 20 "
             "--new-tokens 64; ratios are noisy")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.target, args.ttq_budget = 4, 2, 8.5, 30.0
        args.new_tokens, args.every = 64, 10
    return args


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def build_candidates(args: argparse.Namespace, quiet: bool = False) -> list[Candidate]:
    """gptlib's rows always; a peer's row when its file is given and loads (else say why not)."""
    cands = [gptlib_candidate(NANO_ARCH, nanogpt_arch_config())]
    if getattr(args, "decompose", False):
        cands.append(gptlib_candidate(NANO_ARCH_BOOK, nanogpt_arch_config(), fast=False))
        cands.append(gptlib_with_nanogpts_step())
    for which, how in (("nanogpt", NANOGPT_HOW), ("article", ARTICLE_HOW)):
        if which == "article":  # the book models, then the article's next to them
            cands.append(gptlib_candidate(BOOK, GPTConfig()))
            cands.append(gptlib_candidate(BOOK_FUSED, GPTConfig(fused_attention=True)))
        path = getattr(args, which)
        if path is None:
            if not quiet:
                print(f"skipping the {which} rows: no file given; to compare, get {how}")
            continue
        try:
            load = nanogpt_candidate if which == "nanogpt" else article_candidate
            cands.append(load(load_nanogpt(path) if which == "nanogpt" else load_article(path)))
        except PeerFileError as err:
            print(f"skipping the {which} rows: {err}")
    return cands


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight is counted once


def print_training(cands: list[Candidate], per_round: dict[str, list[float]]) -> None:
    print(f"\n{'training, steady state':<38}{'params':>12}{'it/s best':>11}{'median':>9}"
          f"{'tokens/s':>10}")  # fmt: skip
    for c in cands:
        secs = per_round[c.name]
        best, median = 1 / min(secs), 1 / statistics.median(secs)
        print(f"  {c.name:<36}{_params(c.model):>12,}{best:11.2f}{median:9.2f}"
              f"{best * BATCH * CONTEXT:10,.0f}")  # fmt: skip
    pairs = [
        (NANO_ARCH, NANOGPT, TARGETS["nanogpt"]),
        (NANO_ARCH_BOOK, NANOGPT, None),
        (NANO_ARCH_PLAIN, NANOGPT, None),
        (BOOK, ARTICLE, TARGETS["article"]),
        (BOOK_FUSED, ARTICLE, None),
    ]
    print("\nratios of iterations/s (best of rounds; median of rounds in brackets)")
    for mine, theirs, target in pairs:
        if theirs not in per_round or mine not in per_round:
            continue
        best = min(per_round[theirs]) / min(per_round[mine])
        median = statistics.median(per_round[theirs]) / statistics.median(per_round[mine])
        goal = f"  (target >= {target:g})" if target else ""
        print(f"  {mine} / {theirs}: {best:.2f}x ({median:.2f}x){goal}")


def print_quality(cands: list[Candidate], progress: dict[str, Progress], target: float) -> None:
    print(f"\ntime to quality: validation loss <= {target:g} (20 fixed validation batches)")
    for c in cands:
        p = progress[c.name]
        if p.reached:
            print(f"  {c.name:<36} {p.seconds:7.1f} s of training, {p.steps:5d} steps "
                  f"(from {p.start:.3f})")  # fmt: skip
        else:
            print(f"  {c.name:<36} not reached in {p.seconds:.1f} s ({p.steps} steps, "
                  f"validation loss {p.val:.3f})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/bench.py [--nanogpt PATH] [--article PATH]``: print the comparison."""
    args = _parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(
        f"benchmark: torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()}, fp32, "
        f"load average before: {_load()}"
    )
    train, val, what = book_ids()
    shape = f"batch {BATCH}, context {CONTEXT}, d_model {D_MODEL}, {N_HEADS} heads"
    print(f"data: {what}; {shape}, {N_BLOCKS} blocks, vocab {FULL_VOCAB:,}, lr {LR:g}")
    cands = build_candidates(args)
    quality = None
    if args.ttq_budget > 0 and train is not val:  # first, while the models are untrained
        ttq = [c for c in cands if c.name in (NANO_ARCH, NANOGPT, BOOK, ARTICLE)]
        quality = (ttq, time_to_quality(ttq, train, val, args))
        cands = build_candidates(args, quiet=True)  # untrained again, from the same seeds
    per_round = timed_rounds(cands, train, args.steps, args.rounds)
    print_training(cands, per_round)
    if quality is not None:
        print_quality(*quality, args.target)
    measure_generation(args.new_tokens, max(2, args.rounds // 2))
    print(f"\ntotal time {time.perf_counter() - start:.0f} s; load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
