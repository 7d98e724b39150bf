"""How far chapter 10b's training run drifts between CPU kernels (chapters/data/ch10_drift.json).

The same run, with the same seeds, ends at slightly different losses on different kernels: the
last bits of a few sums differ early on, and thousands of steps amplify them. Chapter 10b quotes
the size of that drift, measured once between the two ways the book's tests run the chapters:

1. run chapter 10b with the CPU's default kernels and keep ``chapters/runs/ch10/checkpoint.pt``;
2. run it again under ``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1`` (the
   second pass of ``.ci/run`` does exactly that) and keep that checkpoint too;
3. ``python tools/ch10_drift.py DEFAULT.pt PORTABLE.pt``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gptlib.checkpoint import read_checkpoint
from gptlib.files import atomic_write_bytes

OUT = Path(__file__).resolve().parents[1] / "chapters" / "data" / "ch10_drift.json"


def final_val_loss(path: Path) -> float:
    """The last evaluation's validation loss in a checkpoint written by ``train``."""
    history = (read_checkpoint(path).get("extra") or {}).get("history") or {}
    if not history.get("val_loss"):
        raise SystemExit(f"{path} holds no loss history: give a checkpoint written by train()")
    return float(history["val_loss"][-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("default", type=Path, help="checkpoint of the run with default kernels")
    parser.add_argument(
        "portable", type=Path, help="checkpoint of the ATEN_CPU_CAPABILITY=default run"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    a, b = final_val_loss(args.default), final_val_loss(args.portable)
    record = {
        "final_val_loss_default_kernels": round(a, 4),
        "final_val_loss_portable_kernels": round(b, 4),
        "final_val_loss_difference": round(abs(a - b), 4),
        "how": "chapter 10b run twice on one CPU: default kernels, then "
        "ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1 (tools/ch10_drift.py)",
    }
    atomic_write_bytes(args.out, (json.dumps(record, indent=1) + "\n").encode())
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
