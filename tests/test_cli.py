"""The command lines, python -m gptlib.train and python -m gptlib.generate: end to end, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptlib.checkpoint import load_checkpoint
from gptlib.commands import generate as generate_cli
from gptlib.commands import train as train_cli
from gptlib.config import resolve_device
from gptlib.tokenizer import TokenizerUnavailableError, get_encoding

try:
    get_encoding("cl100k_base")
except TokenizerUnavailableError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"the cl100k_base files are not available offline ({err})", allow_module_level=True)


# tiny models: one torch thread (see tests/conftest.py)
pytestmark = pytest.mark.usefixtures("single_thread")


SENTENCES = [
    "The customer wants a clear answer about the price.",
    "A good seller listens before speaking.",
    "The seller asks what problem the customer needs to solve.",
    "Trust grows when the seller keeps every promise.",
    "The customer compares the offer with other offers.",
    "A short story can show the value of the product.",
]

TINY_MODEL = ["--d-model", "16", "--n-heads", "2", "--n-blocks", "1", "--context-length", "8"]
QUICK = ["--eval-iters", "2", "--batch-size", "4", "--quiet", "--seed", "3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small text whose words recur, so a few steps already learn something."""
    lines = [SENTENCES[(i * 5) % len(SENTENCES)] for i in range(120)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """A checkpoint written by the train command, run as a separate process."""
    out = tmp_path_factory.mktemp("run")
    cmd = [sys.executable, "-m", "gptlib.train", str(corpus), "--out", str(out), "--max-iters"]
    cmd += ["8", "--eval-interval", "4", *TINY_MODEL, *QUICK]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return out


def run(main, argv, capsys) -> tuple[int, str, str]:
    """Call a CLI ``main`` in this process: (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---- end to end ------------------------------------------------------------------------------


def test_train_then_generate_end_to_end(trained):
    history = json.loads((trained / "history.json").read_text())
    assert history["step"] == [4, 8]
    assert set(history) >= {"train_loss", "val_loss", "lr", "tokens_per_sec"}
    ckpt = load_checkpoint(trained / "checkpoint.pt")
    assert ckpt.step == 8 and ckpt.vocab is not None
    assert ckpt.model_config.vocab_size == len(ckpt.vocab) < 100  # the corpus's own tokens
    assert ckpt.extra["encoding"] == "cl100k_base"
    assert ckpt.train_config.max_iters == 8 and ckpt.model_config.d_model == 16
    # --attention auto: the explicit path on CPU (faster there), the fused one on a GPU
    assert ckpt.model_config.fused_attention == (resolve_device("auto").type != "cpu")

    cmd = [sys.executable, "-m", "gptlib.generate", str(trained), "--prompt", "The customer"]
    cmd += ["-n", "12", "--temperature", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout.rstrip("\n")
    assert text.startswith("The customer") and len(text) > len("The customer")


def test_generate_options_in_process(trained, capsys):
    base = [str(trained / "checkpoint.pt"), "-p", "The seller", "-n", "15"]
    code, greedy, _ = run(generate_cli.main, [*base, "-t", "0"], capsys)
    assert code == 0
    code, greedy_no_cache, _ = run(generate_cli.main, [*base, "-t", "0", "--no-cache"], capsys)
    assert code == 0 and greedy_no_cache == greedy
    _, a, _ = run(generate_cli.main, [*base, "-t", "1.0", "-k", "5", "--seed", "1"], capsys)
    _, b, _ = run(generate_cli.main, [*base, "-t", "1.0", "-k", "5", "--seed", "1"], capsys)
    assert a == b and a.startswith("The seller")


def test_help_texts(capsys):
    code, out, _ = run(train_cli.main, ["--help"], capsys)
    assert code == 0 and "--max-iters" in out and "torchrun" in out and "--full-vocab" in out
    # one option per configuration field, named after it (a few keep their historic names)
    for flag in ("--d-model", "--d-ff", "--no-bias", "--no-final-norm", "--norm-eps"):
        assert flag in out
    for flag in ("--lr", "--no-bf16", "--grad-clip", "--checkpoint-interval", "--attention"):
        assert flag in out
    code, out, _ = run(generate_cli.main, ["--help"], capsys)
    assert code == 0 and "--temperature" in out and "--top-k" in out and "checkpoint" in out


def test_resume_from_the_command_line(corpus, tmp_path, capsys, monkeypatch):
    common = [str(corpus), *TINY_MODEL, "--eval-iters", "2", "--seed", "3", "--eval-interval", "3"]
    split, whole = tmp_path / "split", tmp_path / "whole"
    for out, steps in ((whole, "6"), (split, "3")):
        argv = [*common, "--out", str(out), "--max-iters", steps, "--quiet"]
        assert run(train_cli.main, argv, capsys)[0] == 0
    reads = []
    real_read = train_cli.read_checkpoint
    monkeypatch.setattr(
        train_cli, "read_checkpoint", lambda *a, **k: reads.append(a) or real_read(*a, **k)
    )
    argv = [*common, "--out", str(split), "--max-iters", "6", "--resume"]
    code, _, err = run(train_cli.main, argv, capsys)
    assert code == 0 and "resuming from" in err and "step 3" in err
    assert [a[0].name for a in reads].count("checkpoint.pt") == 1  # read once (best.pt: summary)
    assert load_checkpoint(split).step == 6
    h_split = json.loads((split / "history.json").read_text())
    h_whole = json.loads((whole / "history.json").read_text())
    assert h_split["step"] == h_whole["step"] == [3, 6]
    # the same operations on the same machine: resuming = never having stopped, to the bit
    assert h_split["val_loss"] == h_whole["val_loss"]


def test_full_vocab_and_attention_options(corpus, tmp_path, capsys):
    argv = [str(corpus), "--out", str(tmp_path), *TINY_MODEL, *QUICK, "--full-vocab"]
    argv += ["--attention", "fused", "--max-iters", "2", "--eval-iters", "1"]
    assert run(train_cli.main, argv, capsys)[0] == 0
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.vocab is None and ckpt.model_config.vocab_size == 100_277  # all of cl100k_base
    assert ckpt.model_config.fused_attention


def test_modern_switches_from_the_command_line(corpus, tmp_path, capsys):
    argv = [str(corpus), "--out", str(tmp_path), *TINY_MODEL, *QUICK, "--max-iters", "2"]
    argv += ["--positions", "rope", "--norm-type", "rmsnorm", "--activation", "swiglu"]
    argv += ["--n-kv-heads", "1", "--no-bias", "--rope-base", "500", "--eval-iters", "1"]
    assert run(train_cli.main, argv, capsys)[0] == 0
    c = load_checkpoint(tmp_path).model_config
    assert (c.positions, c.norm_type, c.activation, c.n_kv_heads) == (
        "rope",
        "rmsnorm",
        "swiglu",
        1,
    )
    assert not c.bias and c.rope_base == 500.0


# ---- errors: one line, the right status, no traceback -----------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # the configurations' own checks (__post_init__), reported as one usage line
        (["--batch-size", "-3"], ["batch_size must be a positive integer", "got -3"]),
        (["--d-model", "17"], ["d_model (17) must be divisible by n_heads (2)"]),
        (["--n-kv-heads", "3"], ["n_kv_heads (3) must divide n_heads (2)", "try [1, 2]"]),
        (["--norm-type", "batchnorm"], ["argument --norm-type: invalid choice: 'batchnorm'"]),
        (["--dropout", "1.5"], ["dropout must be in [0, 1)", "1.5"]),
        (["--lr", "0"], ["learning_rate must be a positive number"]),
        (["--min-lr", "-1"], ["min_lr must be >= 0"]),
        # argparse's own: a value that does not parse, an unknown choice or flag
        (["--max-iters", "many"], ["argument --max-iters: must be an integer, got 'many'"]),
        (["--lr-schedule", "step"], ["argument --lr-schedule: invalid choice: 'step'"]),
        (["--device", "gpu7"], ["argument --device: unknown device 'gpu7'"]),
        (["--val-fraction", "1"], ["argument --val-fraction: must be between 0 and 1"]),
        (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"]),
    ],
)
def test_train_rejects_bad_arguments(corpus, tmp_path, capsys, extra, fragments):
    argv = [str(corpus), "--out", str(tmp_path), *TINY_MODEL, *QUICK, *extra]
    code, _, err = run(train_cli.main, argv, capsys)
    assert code == 2
    assert_one_line_error(err, *fragments)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_train_rejects_missing_and_too_short_corpora(tmp_path, capsys):
    code, _, err = run(train_cli.main, [str(tmp_path / "missing.txt"), "--quiet"], capsys)
    assert code == 2
    assert_one_line_error(err, "missing.txt", "neither a known corpus", "nor an existing text file")
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.", encoding="utf-8")
    code, _, err = run(train_cli.main, [str(short), "--out", str(tmp_path), *QUICK], capsys)
    assert code == 2
    assert_one_line_error(
        err, "the corpus is too short", "context_length + 1 = 17", "--val-fraction"
    )


@pytest.mark.parametrize(
    ("extra", "code", "fragments"),
    [
        (["-t", "-1"], 2, ["temperature must be >= 0"]),  # generate()'s own checks
        (["-k", "0"], 2, ["top_k must be a positive integer"]),
        (["-n", "-5"], 2, ["max_new_tokens must be an integer >= 0"]),
        (["-n", "five"], 2, ["argument --max-new-tokens/--length/-n: must be an integer"]),
        (["-p", ""], 2, ["the prompt is empty"]),
        (["-p", "Quantum chromodynamics"], 2, ["the model cannot read this prompt", "not in this"]),
        (["--device", "tpu"], 2, ["argument --device: unknown device 'tpu'"]),
    ],
)
def test_generate_rejects_bad_arguments(trained, capsys, extra, code, fragments):
    status, out, err = run(generate_cli.main, [str(trained), "-n", "3", *extra], capsys)
    assert status == code and out == ""
    assert_one_line_error(err, *fragments)


def test_generate_reports_missing_and_corrupt_checkpoints(trained, tmp_path, capsys):
    code, _, err = run(generate_cli.main, [str(tmp_path / "none.pt")], capsys)
    assert code == 1
    assert_one_line_error(err, "no checkpoint at", "none.pt")
    broken = tmp_path / "broken.pt"
    broken.write_bytes((trained / "checkpoint.pt").read_bytes()[:5000])
    code, _, err = run(generate_cli.main, [str(broken)], capsys)
    assert code == 1
    assert_one_line_error(err, "broken.pt is truncated or corrupt")
