"""How fast is the hand-built BPE of chapter 1 next to tiktoken? ``python benchmarks/bpe.py``.

In one process, on the whole sales textbook: rebuilding cl100k_base's rank table, encoding
with :class:`gptlib.bpe.BytePairEncoder` (its per-chunk cache cold, warm, and switched off),
encoding with tiktoken, and training merges on the textbook's bytes with
:func:`gptlib.bpe.train_bpe`. It prints processor time (what the code costs, whatever else the
machine runs) and wall time (what a reader waits), the ratios to tiktoken, and the load average,
since a busy machine stretches the wall times.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from gptlib.bpe import BytePairEncoder, train_bpe
from gptlib.data import load_corpus
from gptlib.tokenizer import get_encoding


class UncachedEncoder(BytePairEncoder):
    """Forgets every chunk it encoded: what the cache saves."""

    def encode_chunk(self, chunk: bytes) -> list[int]:
        self.cache.clear()
        return super().encode_chunk(chunk)


def timed(
    label: str, work: Callable[[], object], peer: float | None = None
) -> tuple[float, object]:
    """Run ``work`` once; print its processor and wall time, and the ratio to ``peer``'s."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = work()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    ratio = f"  ({cpu / peer:,.0f}x tiktoken's processor time)" if peer else ""
    print(f"{label:<44} cpu {cpu:7.2f} s   wall {wall:7.2f} s{ratio}")
    return cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=200, help="merges to train (default 200)")
    args = parser.parse_args()
    text = load_corpus("sales-textbook")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"the sales textbook: {len(text):,} characters, {len(text.encode()):,} bytes")
    encoding = get_encoding("cl100k_base")
    peer, reference = timed("tiktoken encode_ordinary", lambda: encoding.encode_ordinary(text))
    _, bpe = timed("rebuild the rank table", lambda: BytePairEncoder.from_tiktoken())
    _, ids = timed("hand-built, cache cold", lambda: bpe.encode_ordinary(text), peer)
    timed("hand-built, cache warm", lambda: bpe.encode_ordinary(text), peer)
    uncached = UncachedEncoder(bpe.ranks, bpe.pattern.pattern, bpe.special_tokens)
    timed("hand-built, no cache", lambda: uncached.encode_ordinary(text), peer)
    print(f"same ids as tiktoken: {ids == reference} ({len(ids):,} ids, {len(bpe.cache):,} chunks)")
    _, merges = timed(f"train {args.merges} merges", lambda: train_bpe(text.encode(), args.merges))
    print(f"learned {len(merges)} merges; load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
