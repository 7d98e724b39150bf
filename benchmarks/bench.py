"""How fast is it? ``python benchmarks/bench.py`` measures training and generation on this machine.

This script is not part of gptlib (nothing in the package imports it): it holds the per-head
baseline model and the acceptance targets the library is measured against.

It prints, for the book's model (batch 4, context 16, d_model 64, 4 heads, 8 blocks, dropout
0.1, AdamW lr 1e-3) with the full cl100k output size (100,070 rows) and with the corpus's compact
vocabulary (3,771 rows), and for a larger CPU configuration (batch 12, context 64, d_model 128,
4 heads, 4 blocks):

* training throughput (iterations/s and tokens/s in the steady state: neither the first steps of a
  run nor evaluations are counted) of :func:`gptlib.train.train` with the explicit and the fused
  attention path, and of a *baseline*: the same model written the straightforward way (a Python
  loop over attention heads, each with its own small query/key/value layers, and a default
  ``torch.optim.AdamW``), trained by a plain loop;
* how a step of the book's model splits into a part that does not depend on the vocabulary
  (blocks, embeddings of the batch, the optimizer on the blocks) and a part that grows with it
  (output layer, loss, optimizer on the two tables), solved from the two vocabulary sizes;
* the achieved GFLOP/s, as a share of a measured fp32 matrix-multiply peak on the same threads;
* generation speed with and without the KV cache, 256 new tokens at context 256.

The token values do not change the cost of a step, so the benchmark trains on random ids; the
timings are wall-clock and depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gptlib.data import get_batch
from gptlib.generate import generate
from gptlib.model import GPT, GPTConfig, sinusoidal_positional_encoding
from gptlib.train import TrainConfig, train

FULL_VOCAB = 100_070  # the largest cl100k id in the book's corpus + 1
COMPACT_VOCAB = 3_771  # the corpus's distinct tokens (the compact Vocabulary reserves no id)


@dataclass(frozen=True)
class Shape:
    """A model/batch size to measure."""

    name: str
    batch_size: int
    context_length: int
    d_model: int
    n_heads: int
    n_blocks: int
    dropout: float = 0.1

    def config(self, vocab_size: int, fused: bool = True) -> GPTConfig:
        return GPTConfig(
            vocab_size=vocab_size,
            context_length=self.context_length,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_blocks=self.n_blocks,
            dropout=self.dropout,
            fused_attention=fused,
        )


BOOK = Shape("book", 4, 16, 64, 4, 8)
LARGER = Shape("larger", 12, 64, 128, 4, 4)


# --------------------------------------------------------------------------------------------
# The baseline: the same model, one attention head at a time
# --------------------------------------------------------------------------------------------


class LoopHead(nn.Module):
    """One attention head with its own query, key and value layers (d_model -> head_size)."""

    def __init__(self, d_model: int, head_size: int, context_length: int, dropout: float):
        super().__init__()
        self.query = nn.Linear(d_model, head_size)
        self.key = nn.Linear(d_model, head_size)
        self.value = nn.Linear(d_model, head_size)
        self.register_buffer("allowed", torch.tril(torch.ones(context_length, context_length)))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, hs) each
        scores = q @ k.transpose(1, 2) / math.sqrt(k.shape[-1])  # (B, T, T)
        scores = scores.masked_fill(self.allowed[:T, :T] == 0, float("-inf"))
        return self.drop(torch.softmax(scores, dim=-1)) @ v  # (B, T, hs)


class LoopAttention(nn.Module):
    """Multi-head attention as a list of heads whose outputs are concatenated, then projected."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.heads = nn.ModuleList(
            LoopHead(c.d_model, c.head_size, c.context_length, c.dropout) for _ in range(c.n_heads)
        )
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(torch.cat([head(x) for head in self.heads], dim=-1)))


class LoopBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = LoopAttention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(c.d_model, c.d_ff),
            nn.ReLU(),
            nn.Linear(c.d_ff, c.d_model),
            nn.Dropout(c.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class LoopGPT(nn.Module):
    """The book's model (pre-LN, sinusoidal positions, ReLU, biases) with per-head modules.

    It has exactly the parameters of :class:`gptlib.model.GPT` for the same config;
    :meth:`copy_from` loads a GPT's weights so the two can be checked against each other.
    """

    def __init__(self, c: GPTConfig):
        super().__init__()
        if (c.norm, c.positions, c.activation, c.bias, c.tie_embeddings, c.final_norm) != (
            "pre",
            "sinusoidal",
            "relu",
            True,
            False,
            True,
        ):
            raise ValueError("LoopGPT only builds the book's default architecture")
        self.config = c
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        pe = sinusoidal_positional_encoding(c.context_length, c.d_model)
        self.register_buffer("positional_encoding", pe, persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.Sequential(*(LoopBlock(c) for _ in range(c.n_blocks)))
        self.final_norm = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        T = idx.shape[1]
        x = self.token_embedding(idx) * self.embed_scale  # (B, T, C)
        x = self.drop(x + self.positional_encoding[:T])
        logits = self.lm_head(self.final_norm(self.blocks(x)))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def copy_from(self, gpt: GPT) -> LoopGPT:
        """Take over the weights of a :class:`GPT` of the same config (head h = rows h*hs...)."""
        hs = self.config.head_size
        self.token_embedding.weight.copy_(gpt.token_embedding.weight)
        self.final_norm.load_state_dict(gpt.final_norm.state_dict())
        self.lm_head.weight.copy_(gpt.lm_head.weight)
        for mine, theirs in zip(self.blocks, gpt.blocks, strict=True):
            mine.ln1.load_state_dict(theirs.ln1.state_dict())
            mine.ln2.load_state_dict(theirs.ln2.state_dict())
            mine.ffn[0].load_state_dict(theirs.ffn.linear1.state_dict())
            mine.ffn[2].load_state_dict(theirs.ffn.linear2.state_dict())
            mine.attn.proj.load_state_dict(theirs.attn.W_o.state_dict())
            for h, head in enumerate(mine.attn.heads):
                rows = slice(h * hs, (h + 1) * hs)
                for layer, big in ((head.query, "W_q"), (head.key, "W_k"), (head.value, "W_v")):
                    source = getattr(theirs.attn, big)
                    layer.weight.copy_(source.weight[rows])
                    layer.bias.copy_(source.bias[rows])
        return self


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def training_flops_per_token(c: GPTConfig) -> float:
    """Matrix-multiply FLOPs of one training step per token (forward + backward = 3 x forward).

    Forward per token: per block the Q, K, V and output projections (4 * 2 d^2), the two
    feed-forward layers (2 * 2 d d_ff) and attention (2 * 2 T d: scores and weighted values,
    counted over the whole window); then the output layer (2 d V). Embedding look-ups, norms,
    softmax and the optimizer are not counted.
    """
    d, T = c.d_model, c.context_length
    per_block = 8 * d * d + 4 * d * c.d_ff + 4 * T * d
    return 3.0 * (c.n_blocks * per_block + 2 * d * c.vocab_size)


def matmul_peak(seconds: float = 0.6) -> tuple[float, int]:
    """The best fp32 GFLOP/s of ``torch.mm`` over a few square sizes, on the current threads."""
    best, best_n = 0.0, 0
    for n in (256, 512, 1024, 1536):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm-up
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 4:
            torch.mm(a, b)
            reps += 1
        rate = 2 * n**3 * reps / (time.perf_counter() - start) / 1e9
        if rate > best:
            best, best_n = rate, n
    return best, best_n


def _timed(step: Callable[[], None], seconds: float, max_steps: int = 5000) -> float:
    """Seconds per step over as many steps as fit in ``seconds`` (at least 3)."""
    n, start = 0, time.perf_counter()
    while n < 3 or (time.perf_counter() - start < seconds and n < max_steps):
        step()
        n += 1
    return (time.perf_counter() - start) / n


Runner = Callable[[float], float]  # seconds to spend -> measured seconds per step


def baseline_runner(shape: Shape, vocab: int, data: torch.Tensor) -> Runner:
    """The per-head baseline with a default AdamW and a plain loop (warmed up)."""
    torch.manual_seed(0)
    model = LoopGPT(shape.config(vocab)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        x, y = get_batch(data, shape.batch_size, shape.context_length, generator=g)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    return lambda seconds: _timed(step, seconds)


def gptlib_runner(
    shape: Shape, vocab: int, data: torch.Tensor, *, fused: bool = True, grad_clip: float = 0.0
) -> Runner:
    """:func:`gptlib.train.train` itself, timed in the steady state like the baseline.

    Each measurement trains a fresh model for 2n steps with an evaluation after step n; the time
    per step comes from the history's training clock between those two evaluations, so neither
    the first steps (the optimizer allocates its state then) nor the evaluations are counted.
    """

    def run(steps: int) -> float:
        torch.manual_seed(0)
        model = GPT(shape.config(vocab, fused))
        config = TrainConfig(
            batch_size=shape.batch_size,
            max_iters=2 * steps,
            learning_rate=1e-3,
            weight_decay=0.01,  # AdamW's default, as in the baseline
            grad_clip=grad_clip,
            eval_interval=steps,
            eval_iters=1,
            device="cpu",
        )
        history = train(model, data, data, config, quiet=True)
        return (history["elapsed_s"][-1] - history["elapsed_s"][0]) / steps

    per_step = run(3)  # warm-up, and a first estimate of the step time

    def measure(seconds: float) -> float:
        return run(max(5, min(5000, int(seconds / max(per_step, 1e-6)))))

    return measure


def best_of_rounds(runners: dict[str, Runner], seconds: float, rounds: int) -> dict[str, float]:
    """Run the runners in turn, ``rounds`` times, and keep each one's best seconds per step.

    Taking turns and keeping the best makes the comparison fair when other programs load the
    machine for a while: every candidate gets its chance at the quiet moments.
    """
    best = {name: math.inf for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            best[name] = min(best[name], runner(seconds / rounds))
    return best


def generation_runner(config: GPTConfig, new_tokens: int, use_cache: bool):
    """A function that generates ``new_tokens`` greedily after a one-token prompt and returns
    (tokens per second, the ids)."""
    torch.manual_seed(0)
    model = GPT(config).eval()

    def run() -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        out = generate(model, [0], new_tokens, temperature=0, use_cache=use_cache)
        return new_tokens / (time.perf_counter() - start), out

    return run


def step_split(sec_compact: float, sec_full: float) -> tuple[float, float]:
    """Solve ``sec = fixed + per_row * vocab`` from the two vocabulary sizes: the seconds of a
    step that do not depend on the vocabulary, and the seconds each vocabulary row adds."""
    per_row = (sec_full - sec_compact) / (FULL_VOCAB - COMPACT_VOCAB)
    return sec_compact - per_row * COMPACT_VOCAB, per_row


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _row(label: str, sec: float, shape: Shape, vocab: int, peak: float) -> str:
    tokens = shape.batch_size * shape.context_length
    gflops = training_flops_per_token(shape.config(vocab)) * tokens / sec / 1e9
    rate = f"{1 / sec:9.1f}{tokens / sec:11,.0f}{gflops:9.2f}{100 * gflops / peak:8.1f}%"
    return f"  {label:<42}{rate}"


BASELINE = "baseline (per-head loop, default AdamW)"
EXPLICIT = "gptlib train, explicit attention"
FUSED = "gptlib train, fused attention"
CLIPPED = "gptlib train, fused, grad clip 1.0"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Measure gptlib's training and generation speed on this machine.",
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per candidate")
    parser.add_argument("--rounds", type=int, default=6, help="turns per measurement (best)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens to generate")
    parser.add_argument(
        "--quick", action="store_true",
        help="a smoke run in seconds (--seconds 0.3 --rounds 1 --new-tokens 32): ratios are noisy",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.new_tokens = 0.3, 1, 32
    return args


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


CASES = [(BOOK, FULL_VOCAB), (BOOK, COMPACT_VOCAB), (LARGER, COMPACT_VOCAB)]


def measure_training(args: argparse.Namespace, peak: float) -> dict[tuple[str, int, str], float]:
    """Seconds per step of every candidate for every case (printed as they come)."""
    g = torch.Generator().manual_seed(0)
    data = {v: torch.randint(v, (60_000,), generator=g) for v in (FULL_VOCAB, COMPACT_VOCAB)}
    header = f"{'it/s':>9}{'tokens/s':>11}{'GFLOP/s':>9}{'of peak':>9}"
    print(f"\ntraining, steady state{' ' * 22}{header}")
    sec: dict[tuple[str, int, str], float] = {}
    for shape, vocab in CASES:
        print(
            f"{shape.name}: batch {shape.batch_size}, context {shape.context_length}, d_model "
            f"{shape.d_model}, {shape.n_heads} heads, {shape.n_blocks} blocks, vocab {vocab:,}"
        )
        d = data[vocab]
        runners = {
            BASELINE: baseline_runner(shape, vocab, d),
            EXPLICIT: gptlib_runner(shape, vocab, d, fused=False),
            FUSED: gptlib_runner(shape, vocab, d),
        }
        if (shape, vocab) == (BOOK, FULL_VOCAB):
            runners[CLIPPED] = gptlib_runner(shape, vocab, d, grad_clip=1.0)
        for which, value in best_of_rounds(runners, args.seconds, args.rounds).items():
            sec[shape.name, vocab, which] = value
            print(_row(which, value, shape, vocab, peak), flush=True)
    return sec


def print_ratios(sec: dict[tuple[str, int, str], float]) -> None:
    print("\nratios of iterations/s")
    for shape, vocab in CASES:
        what = f"{shape.name}, vocab {vocab:,}"
        r = sec[shape.name, vocab, BASELINE] / sec[shape.name, vocab, FUSED]
        target = "  (target >= 2)" if (shape, vocab) == (BOOK, FULL_VOCAB) else ""
        print(f"  gptlib fused / baseline, {what}: {r:.2f}x{target}")
        r = sec[shape.name, vocab, EXPLICIT] / sec[shape.name, vocab, FUSED]
        print(f"  fused / explicit attention, {what}: {r:.2f}x")
    r = sec["book", FULL_VOCAB, FUSED] / sec["book", COMPACT_VOCAB, FUSED]
    print(f"  compact / full vocabulary, book, gptlib fused: {r:.2f}x  (target >= 5)")
    r = sec["book", FULL_VOCAB, BASELINE] / sec["book", COMPACT_VOCAB, FUSED]
    print(f"  gptlib compact / baseline full vocabulary, book: {r:.2f}x")
    fixed, per_row = step_split(sec["book", COMPACT_VOCAB, FUSED], sec["book", FULL_VOCAB, FUSED])
    print(
        f"  a book step (gptlib fused) = {1e3 * fixed:.2f} ms that do not depend on the vocabulary"
        f" + {1e9 * per_row:.0f} ns per vocabulary row ({1e3 * per_row * FULL_VOCAB:.1f} ms at "
        f"{FULL_VOCAB:,}, {1e3 * per_row * COMPACT_VOCAB:.1f} ms at {COMPACT_VOCAB:,})"
    )


def measure_generation(args: argparse.Namespace) -> None:
    gen = GPTConfig(**{**LARGER.config(COMPACT_VOCAB).to_dict(), "context_length": 256})
    print(
        f"\ngeneration: {args.new_tokens} new tokens after a 1-token prompt, greedy, context "
        f"256, d_model {gen.d_model}, {gen.n_heads} heads, {gen.n_blocks} blocks, vocab "
        f"{gen.vocab_size:,}"
    )
    runs = {False: generation_runner(gen, args.new_tokens, False)}
    runs[True] = generation_runner(gen, args.new_tokens, True)
    rate = {False: 0.0, True: 0.0}
    ids: dict[bool, torch.Tensor] = {}
    for _ in range(args.rounds):  # take turns, keep the best
        for cached, run in runs.items():
            tokens_per_s, ids[cached] = run()
            rate[cached] = max(rate[cached], tokens_per_s)
    print(f"  without KV cache: {rate[False]:8.1f} tokens/s")
    print(f"  with KV cache:    {rate[True]:8.1f} tokens/s")
    same = "yes" if torch.equal(ids[False], ids[True]) else "NO"
    ratio = rate[True] / rate[False]
    print(f"  cache / no cache: {ratio:.2f}x  (target >= 3); identical tokens: {same}")


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/bench.py``: print the measurements (takes a few minutes)."""
    args = _parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(
        f"gptlib benchmark: torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()}, "
        f"load average before: {_load()}"
    )
    peak, n = matmul_peak()
    print(f"fp32 matmul peak: {peak:.1f} GFLOP/s (torch.mm, {n}x{n})")
    print_ratios(measure_training(args, peak))
    measure_generation(args)
    peak_after, _ = matmul_peak()
    print(f"\nfp32 matmul peak measured again at the end: {peak_after:.1f} GFLOP/s")
    if abs(peak_after - peak) > 0.2 * max(peak, peak_after):
        print("warning: the two peak measurements differ by more than 20%: the machine was busy")
    print(f"\ntotal time {time.perf_counter() - start:.0f} s; load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
