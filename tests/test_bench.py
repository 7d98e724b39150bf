"""The benchmark's helpers (benchmarks/bench.py, outside the package): its per-head baseline is
the same model as gptlib's GPT, and its arithmetic is right."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_benchmark_baseline_is_the_same_model(bench):
    model = tiny_model(vocab_size=40, context_length=8, n_heads=2)
    baseline = bench.LoopGPT(model.config).copy_from(model).eval()
    assert sum(p.numel() for p in baseline.parameters()) == model.num_parameters()
    x = torch.randint(40, (3, 8), generator=torch.Generator().manual_seed(0))
    # the same maths in other shapes (one small matmul per head): equal up to float32 rounding
    torch.testing.assert_close(baseline(x)[0], model(x)[0], rtol=1e-5, atol=1e-5)
    c = model.config  # 3 x forward: 2 blocks x (8 d^2 + 4 d d_ff + 4 T d) + 2 d V
    assert bench.training_flops_per_token(c) == 3 * (
        2 * (8 * 256 + 4 * 16 * 64 + 4 * 8 * 16) + 2 * 16 * 40
    )


def test_benchmark_splits_a_step_into_fixed_and_per_row_seconds(bench):
    fixed, per_row = 0.0115, 3.8e-7  # seconds, seconds per vocabulary row
    compact, full = (fixed + per_row * V for V in (bench.COMPACT_VOCAB, bench.FULL_VOCAB))
    assert bench.step_split(compact, full) == pytest.approx((fixed, per_row), rel=1e-9)
