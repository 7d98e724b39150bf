"""The benchmark's helpers (benchmarks/bench.py, outside the package): the peers' files are
loaded safely (the article's script never runs its training), gptlib at nanoGPT's architecture
has nanoGPT's parameters, and the harness feeds every candidate the same batches."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gptlib.model import GPT

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench.py"
# the peers' files are never in this repository: a developer may point at local copies
NANOGPT = Path(os.environ.get("GPTLIB_NANOGPT_MODEL", "/work/peers/nanogpt/model.py"))
ARTICLE = Path(os.environ.get("GPTLIB_ARTICLE_MODEL", "/work/peers/article/model.py"))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


FAKE_ARTICLE = """
import torch
from torch import nn

batch_size = 4
context_length = 16
d_model = 64
num_blocks = 8
num_heads = 4
dropout = 0.1
learning_rate = 1e-3
device = "cuda" if torch.cuda.is_available() else "cpu"
max_token_value = 999_999  # the benchmark's vocabulary replaces it
raise SystemExit("the script's work ran: the loader must not execute this")


class MultiHeadAttention(nn.Module):
    pass


class TransformerBlock(nn.Module):
    pass


class TransformerLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = (d_model, num_blocks, max_token_value, device)
        self.out = nn.Linear(d_model, max_token_value)


model = TransformerLanguageModel()  # module-level work: dropped
"""


def test_article_loader_keeps_definitions_and_replaces_the_shape(bench, tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(FAKE_ARTICLE))
    model_class = bench.load_article(path, vocab_size=123)
    model = model_class()
    assert model.seen == (64, 8, 123, "cpu")
    assert model.out.out_features == 123


def test_article_loader_refuses_a_file_that_does_not_look_like_it(bench, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("import torch\n\nclass TransformerLanguageModel:\n    pass\n")
    with pytest.raises(bench.PeerFileError, match="does not look like the article's") as err:
        bench.load_article(path)
    assert "TransformerBlock" in str(err.value) and "d_model" in str(err.value)
    with pytest.raises(bench.PeerFileError, match="does not exist; get"):
        bench.load_article(tmp_path / "missing.py")


def test_nanogpt_loader_refuses_a_file_that_does_not_look_like_it(bench, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("class GPT:\n    pass\n")
    with pytest.raises(bench.PeerFileError, match="does not look like nanoGPT's"):
        bench.load_nanogpt(path)
    with pytest.raises(bench.PeerFileError, match="does not exist; get"):
        bench.load_nanogpt(tmp_path / "missing.py")


def test_missing_peer_rows_are_skipped_with_instructions(bench, capsys, monkeypatch):
    def unbuilt(name, config, seed=0):  # the rows' names, without building 13M-parameter models
        return bench.Candidate(name, torch.nn.Linear(1, 1), lambda x, y: 0.0, lambda x, y: 0.0)

    monkeypatch.setattr(bench, "gptlib_candidate", unbuilt)
    args = bench._parse(["--quick"])
    names = [c.name for c in bench.build_candidates(args)]
    out = capsys.readouterr().out
    assert names == [bench.NANO_ARCH, bench.BOOK, bench.BOOK_FUSED]
    assert "skipping the nanogpt rows: no file given" in out and "--nanogpt PATH" in out
    assert "skipping the article rows: no file given" in out and "--article PATH" in out


@pytest.mark.skipif(not NANOGPT.is_file(), reason=f"nanoGPT's model.py is not at {NANOGPT}")
def test_gptlib_at_nanogpt_architecture_has_nanogpts_parameters(bench):
    nanogpt = bench.load_nanogpt(NANOGPT)
    for vocab in (50, 1000):  # gptlib's W_q, W_k, W_v hold what nanoGPT's c_attn holds
        theirs = nanogpt.GPT(bench.nanogpt_config(nanogpt, vocab))
        mine = GPT(bench.nanogpt_arch_config(vocab))
        assert mine.num_parameters() == sum(p.numel() for p in theirs.parameters())
        assert mine.num_parameters() == theirs.get_num_params() + 16 * 64  # + positions


@pytest.mark.skipif(not ARTICLE.is_file(), reason=f"the article's model.py is not at {ARTICLE}")
def test_the_real_article_file_loads_at_the_book_shape(bench):
    model = bench.load_article(ARTICLE, vocab_size=500)()
    x = torch.randint(500, (2, 16), generator=torch.Generator().manual_seed(0))
    logits, loss = model(x, x)
    assert logits.shape == (2, 16, 500) and torch.isfinite(loss)


def test_timed_rounds_feed_every_candidate_the_same_batches(bench):
    seen: dict[str, list[torch.Tensor]] = {"a": [], "b": []}

    def candidate(name: str):
        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            seen[name].append(torch.cat([x, y]))
            return 0.0

        return bench.Candidate(name, torch.nn.Linear(1, 1), step, lambda x, y: 0.0)

    data = torch.arange(200)
    per_round = bench.timed_rounds([candidate("a"), candidate("b")], data, steps=3, rounds=2)
    assert {k: len(v) for k, v in per_round.items()} == {"a": 2, "b": 2}
    assert len(seen["a"]) == 3 + 3 * 2  # warm-up, then 2 rounds of 3 steps
    assert all(torch.equal(a, b) for a, b in zip(seen["a"], seen["b"], strict=True))
    assert not torch.equal(seen["a"][3], seen["a"][6])  # each round has its own batches
