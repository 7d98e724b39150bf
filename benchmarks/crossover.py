"""Where does the fused output layer + loss win? ``python benchmarks/crossover.py``.

Times one forward + backward of the output layer and the loss, for hidden (N, C) and weight
(V, C), two ways, in interleaved rounds (best of each):

* plain: ``gptlib.fast.cross_entropy(F.linear(h, W), t)``, which holds the (N, V) logits and
  their gradient;
* fused: gptlib.fast's ``_LinearCrossEntropy``, a block of vocabulary columns at a time.

It prints the milliseconds and the ratio for each (N, V), and the smallest V from which the fused
path is faster at every N measured. ``--step`` measures instead what the choice does to a whole
training step (:func:`gptlib.train.train_step`, book shape, nanoGPT's architecture: tied
embeddings) for each V, with the fused path forced on and off in turn. Both are the measurement
behind ``gptlib.fast.FUSED_MIN_VOCAB``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gptlib import fast as loss
from gptlib.data import get_batch
from gptlib.fast import _LinearCrossEntropy, cross_entropy

VOCABS = (1_024, 2_048, 4_096, 8_192, 16_384, 32_768, 65_536, 100_070)
ROWS = (64, 768)  # the book's batch 4 x context 16, and batch 12 x context 64


def plain(h: torch.Tensor, W: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return cross_entropy(F.linear(h, W), t)


def fused(h: torch.Tensor, W: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return _LinearCrossEntropy.apply(h, W, t)


def step_seconds(fn: Callable, N: int, C: int, V: int, reps: int) -> float:
    """Best seconds of one forward + backward of ``fn`` over ``reps`` tries (after a warm-up)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, C, generator=g).requires_grad_()
    W = (torch.randn(V, C, generator=g) * 0.02).requires_grad_()
    t = torch.randint(V, (N,), generator=g)
    best = math.inf
    for i in range(reps + 1):
        h.grad = W.grad = None
        start = time.perf_counter()
        fn(h, W, t).backward()
        if i:  # the first call is the warm-up
            best = min(best, time.perf_counter() - start)
    return best


def step_ab(vocabs: list[int], rounds: int, steps: int = 8) -> None:
    """Milliseconds of a training step at each V with the fused path off and on (interleaved)."""
    from bench import gptlib_candidate, nanogpt_arch_config  # benchmarks/ is on sys.path

    cands = {V: gptlib_candidate(f"V={V}", nanogpt_arch_config(V)) for V in vocabs}
    data = {
        V: torch.randint(V, (50_000,), generator=torch.Generator().manual_seed(0)) for V in vocabs
    }
    ms: dict[tuple[int, str], list[float]] = {
        (V, m): [] for V in vocabs for m in ("plain", "fused")
    }
    for r in range(rounds + 1):  # round 0 is the warm-up
        for V, c in cands.items():
            g = torch.Generator().manual_seed(r)
            batches = [get_batch(data[V], 4, 16, generator=g) for _ in range(steps)]
            for mode in ("plain", "fused") if r % 2 else ("fused", "plain"):
                loss.FUSED_MIN_VOCAB = 1 if mode == "fused" else V + 1
                start = time.perf_counter()
                for x, y in batches:
                    c.step(x, y)
                if r:
                    ms[V, mode].append(1e3 * (time.perf_counter() - start) / steps)
    print(
        f"{'V':>9}{'plain ms':>10}{'fused ms':>10}{'plain/fused':>13}  (medians of {rounds} rounds)"
    )
    for V in vocabs:
        plain_ms, fused_ms = (statistics.median(ms[V, m]) for m in ("plain", "fused"))
        print(f"{V:>9,}{plain_ms:10.1f}{fused_ms:10.1f}{plain_ms / fused_ms:12.2f}x", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/crossover.py", description=__doc__)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best of)")
    parser.add_argument("--reps", type=int, default=3, help="tries per round")
    parser.add_argument("--d-model", type=int, default=64, help="C, the hidden size")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="N values")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), help="V values")
    parser.add_argument("--step", action="store_true", help="time whole training steps instead")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load {load}")
    if args.step:
        step_ab(args.vocabs, 2 * args.rounds)
        print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return 0
    print(f"{'N':>6}{'V':>9}{'plain ms':>10}{'fused ms':>10}{'plain/fused':>13}")
    wins: dict[int, list[bool]] = {V: [] for V in args.vocabs}
    for N in args.rows:
        for V in args.vocabs:
            best = {"plain": math.inf, "fused": math.inf}
            for _ in range(args.rounds):  # take turns so that load hits both alike
                for name, fn in (("plain", plain), ("fused", fused)):
                    sec = step_seconds(fn, N, args.d_model, V, args.reps)
                    best[name] = min(best[name], sec)
            ratio = best["plain"] / best["fused"]
            wins[V].append(ratio > 1.0)
            ms = f"{1e3 * best['plain']:10.2f}{1e3 * best['fused']:10.2f}"
            print(f"{N:>6}{V:>9,}{ms}{ratio:12.2f}x", flush=True)
    always = [V for V in args.vocabs if all(all(wins[W]) for W in args.vocabs if W >= V)]
    where = f"V >= {always[0]:,}" if always else "no V measured"
    print(f"fused faster at every N measured, for all larger V too: {where}")
    print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
