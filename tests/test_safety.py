"""Nothing a user trains is lost (issue 22): divergence, a bad or busy output folder, Ctrl-C, a
full disk, absurd sizes, stale temporary files, the corpus's name, and the best checkpoint.

Each test names the numbered case of the issue it checks.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from gptlib import rundir
from gptlib.checkpoint import load_checkpoint
from gptlib.commands import generate as generate_cli
from gptlib.commands import train as train_cli
from gptlib.config import TrainConfig
from gptlib.generate import generate
from gptlib.interrupt import TrainingInterrupted
from gptlib.memory import NotEnoughMemoryError
from gptlib.rundir import RunLock
from gptlib.tokenizer import TokenizerUnavailableError, get_encoding
from gptlib.train import train

try:
    get_encoding("cl100k_base")
except TokenizerUnavailableError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"the cl100k_base files are not available offline ({err})", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "The customer wants a clear answer about the price.",
    "A good seller listens before speaking.",
    "Trust grows when the seller keeps every promise.",
    "The customer compares the offer with other offers.",
]
T = ["--d-model", "16", "--n-heads", "2", "--n-blocks", "1", "--context-length", "8"]
T += ["--batch-size", "4", "--eval-iters", "2", "--eval-interval", "5", "--quiet", "--seed", "3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    lines = [SENTENCES[(i * 3) % len(SENTENCES)] for i in range(80)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(main, argv, capsys) -> tuple[int, str]:
    """A command's exit status and its stderr."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "error: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def finite(path: Path) -> bool:
    model = load_checkpoint(path).model
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def tiny_data(seed: int = 0, n: int = 400, V: int = 50) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(V, (n,), generator=g)


# ---- case 1: divergence never overwrites a good checkpoint ------------------------------------


def test_case1_a_huge_learning_rate_fails_instead_of_saving_nan(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run(
        train_cli.main, [corpus, "--out", out, *T, "--lr", "1e38", "--max-iters", 1], capsys
    )
    line = one_line_error(err)
    assert code == 1 and "non-finite" in line and "no checkpoint was written" in line
    assert not (out / "checkpoint.pt").exists() or finite(out / "checkpoint.pt")


def test_case1_divergence_keeps_the_last_good_checkpoint_and_names_its_step(tmp_path):
    path = tmp_path / "checkpoint.pt"
    data = tiny_data()
    good = TrainConfig(max_iters=3, checkpoint_interval=1, eval_interval=3, eval_iters=2)
    train(tiny_model(), data, data, good, checkpoint_path=path, quiet=True)
    before = path.read_bytes()
    wild = TrainConfig(
        max_iters=6, checkpoint_interval=1, eval_interval=3, eval_iters=2, learning_rate=1e38
    )
    with pytest.raises(FloatingPointError) as info:
        train(tiny_model(), data, data, wild, checkpoint_path=path, resume=True, quiet=True)
    message = str(info.value)
    assert "step 4" in message  # where it went wrong
    assert f"the last good checkpoint, {path} (step 3), was left intact" in message
    assert path.read_bytes() == before and load_checkpoint(path).step == 3 and finite(path)


# ---- case 2: the output folder is checked before the first step -------------------------------


@pytest.fixture
def no_training(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("training started although the output folder is unusable")

    monkeypatch.setattr(train_cli, "train", boom)


def test_case2_out_is_a_file(corpus, tmp_path, capsys, no_training):
    out = tmp_path / "taken"
    out.write_text("not a folder")
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    assert code == 1 and f"{out} is a file, not a folder" in one_line_error(err)
    assert out.read_text() == "not a folder"


def test_case2_out_is_a_dangling_symlink(corpus, tmp_path, capsys, no_training):
    out = tmp_path / "link"
    out.symlink_to(tmp_path / "gone")
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    assert code == 1 and "symbolic link" in one_line_error(err) and "does not exist" in err


def test_case2_out_on_a_read_only_disk(corpus, tmp_path, capsys, no_training, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):  # a read-only file system refuses new files
        if ".gptlib-probe" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(rundir.os, "open", read_only)
    out = tmp_path / "ro"
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    line = one_line_error(err)
    assert code == 1 and f"cannot write into the output folder {out}" in line
    assert "Read-only file system" in line and "nothing was trained" in line


# ---- case 3: one run per folder ---------------------------------------------------------------


def test_case3_a_second_run_in_the_same_folder_is_refused_and_names_the_first(
    corpus, tmp_path, capsys
):
    out = tmp_path / "busy"
    out.mkdir()
    with RunLock(out):  # the "first run" (this process holds the folder)
        code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    line = one_line_error(err)
    assert code == 1 and f"another run is using {out}" in line
    assert f"pid {os.getpid()}" in line  # names the run in the way
    assert not (out / "checkpoint.pt").exists() and not (out / "history.json").exists()


def test_case3_a_killed_run_does_not_block_the_folder(corpus, tmp_path, capsys):
    out = tmp_path / "crashed"
    out.mkdir()
    holder = (  # rundir.py needs only the standard library: load it alone, without torch
        "import importlib.util as u, sys, time; s = u.spec_from_file_location('r', sys.argv[2]); "
        "r = u.module_from_spec(s); s.loader.exec_module(r); r.RunLock(sys.argv[1]).__enter__(); "
        "print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder, str(out), str(ROOT / "gptlib" / "rundir.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(rundir.RunFolderError, match=f"pid {proc.pid}"):
            RunLock(out).__enter__()
    finally:
        proc.kill()  # kill -9: no clean-up code runs in the holder
        proc.wait(timeout=10)
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    assert code == 0, err
    assert load_checkpoint(out).step == 5


# ---- case 5: Ctrl-C saves at a step boundary ---------------------------------------------------


def ctrl_c_at(step: int):
    def callback(record):
        if record["step"] == step:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    return callback


def test_case5_ctrl_c_saves_at_the_step_boundary_and_resumes(tmp_path):
    path = tmp_path / "checkpoint.pt"
    data = tiny_data()
    config = TrainConfig(max_iters=40, eval_interval=5, eval_iters=2)  # no periodic saves
    with pytest.raises(KeyboardInterrupt) as info:
        train(tiny_model(), data, data, config, checkpoint_path=path, callbacks=[ctrl_c_at(5)])
    assert isinstance(info.value, TrainingInterrupted)
    assert f"interrupted at step 5: saved {path} (step 5)" in str(info.value)
    assert load_checkpoint(path).step == 5
    history = train(tiny_model(), data, data, config, checkpoint_path=path, resume=True, stop_at=10)
    assert history["step"] == [5, 10]


def test_case5_ctrl_c_without_a_checkpoint_path_says_nothing_was_saved(tmp_path):
    data = tiny_data()
    config = TrainConfig(max_iters=40, eval_interval=5, eval_iters=2)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 5; nothing was saved"):
        train(tiny_model(), data, data, config, callbacks=[ctrl_c_at(5)])


def test_case5_ctrl_c_on_the_command_line(corpus, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gptlib.train", str(corpus), "--out", str(out), *T]
    cmd = [c for c in cmd if c != "--quiet"] + ["--max-iters", "100000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env)
    seen = bytearray()

    def read():
        while chunk := proc.stderr.read1(4096):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    done_steps = re.compile(rb"train:[^\r\n]*\| *[1-9][0-9]*/100000")  # the bar at step 1 or later
    while not done_steps.search(seen) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # wait until a step is done: an interrupt before it has nothing to save
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    reader.join(timeout=5)
    last = seen.decode(errors="replace").replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("error: interrupted at step ") and "--resume" in last, last
    step = int(last.split("interrupted at step ")[1].split(":")[0])
    assert load_checkpoint(out).step == step >= 1


# ---- case 8: a full disk on a later save ------------------------------------------------------


def test_case8_disk_full_on_a_later_save_is_one_line_and_keeps_the_old(
    corpus, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    real_save, calls = torch.save, []

    def fills_the_disk(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"PK" * 100)  # what fitted before the disk filled up
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 237 vs 200")

    monkeypatch.setattr(torch, "save", fills_the_disk)
    argv = [corpus, "--out", out, *T, "--max-iters", 6, "--checkpoint-interval", 3]
    code, err = run(train_cli.main, argv, capsys)
    line = one_line_error(err)
    assert code == 1 and "the disk is full" in line and "needs about" in line and "MB" in line
    assert load_checkpoint(out).step == 3  # the previous checkpoint is intact
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []


# ---- case 9: absurd sizes are refused before anything is allocated ----------------------------


@pytest.mark.parametrize(
    "sizes", [["--batch-size", "100000000"], ["--d-model", "1000000", "--n-heads", "4"]]
)
def test_case9_absurd_training_sizes_are_refused_with_the_numbers(corpus, tmp_path, capsys, sizes):
    out = tmp_path / "run"
    start = time.monotonic()
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5, *sizes], capsys)
    line = one_line_error(err)
    assert code == 1 and "needs about" in line and "is available" in line
    assert time.monotonic() - start < 30  # refused at once, not after tens of seconds


@pytest.fixture(scope="module")
def small_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small")
    assert train_cli.main([str(corpus), "--out", str(out), *T, "--max-iters", "5"]) == 0
    return out


def test_case9_generating_a_billion_tokens_is_refused(small_run, capsys):
    code, err = run(
        generate_cli.main, [small_run, "--prompt", "The customer", "-n", "1000000000"], capsys
    )
    line = one_line_error(err)
    assert code in (1, 2) and "1,000,000,000" in line


def test_case9_the_library_refuses_a_generation_that_cannot_fit():
    model = tiny_model()
    with pytest.raises(
        NotEnoughMemoryError, match=r"generating 100,000,000,000 tokens needs about"
    ):
        generate(model, [1, 2, 3], 10**11)
    assert generate(model, [1, 2, 3], 5).shape == (8,)  # a sensible request still works


# ---- case 13: stale temporary files of the same run --------------------------------------------


def test_case13_stale_temporaries_of_the_run_are_removed_at_start(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    stale = [out / ".checkpoint.pt.4242.0badf00d.tmp", out / ".history.json.4242.12345678.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * (1 << 20))
    keep = out / "notes.txt"
    keep.write_text("mine")
    code, err = run(train_cli.main, [corpus, "--out", out, *T, "--max-iters", 5], capsys)
    assert code == 0, err
    assert not any(p.exists() for p in stale) and keep.read_text() == "mine"


# ---- case 14: the exported web model carries its corpus's name ---------------------------------


def export_tool():
    spec = importlib.util.spec_from_file_location(
        "export_web_model", ROOT / "tools" / "export_web_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_case14_the_checkpoint_and_the_web_model_name_the_corpus(small_run):
    assert load_checkpoint(small_run).extra["corpus"] == "corpus.txt"
    payload = export_tool().model_payload(small_run / "checkpoint.pt")
    assert payload["corpus"] == "corpus.txt"


def test_case14_the_page_says_the_models_corpus():
    page = (ROOT / "_static" / "interactive" / "gpt-playground.js").read_text(encoding="utf-8")
    assert "tokens of the sales textbook it was trained on" not in page
    assert "corpus" in page


# ---- the best checkpoint beside the last one ---------------------------------------------------


def test_train_keeps_the_best_validation_checkpoint_beside_the_last(tmp_path):
    path = tmp_path / "checkpoint.pt"
    pattern = torch.arange(400) % 7  # training text: a strict cycle, easy to learn
    val = tiny_data(1, V=7)  # validation: random, so fitting the cycle makes it worse
    config = TrainConfig(max_iters=40, eval_interval=5, eval_iters=2, learning_rate=3e-2)
    history = train(tiny_model(vocab_size=7), pattern, val, config, checkpoint_path=path)
    best = load_checkpoint(tmp_path / "best.pt")
    losses = history["val_loss"]
    k = losses.index(min(losses))
    assert best.step == history["step"][k] < load_checkpoint(path).step == 40
    assert best.extra["best"] == {"step": best.step, "val_loss": losses[k]}
    # resuming keeps the record: best.pt stays the best evaluation of the whole run
    config = TrainConfig(max_iters=50, eval_interval=5, eval_iters=2, learning_rate=3e-2)
    model = tiny_model(vocab_size=7)
    history = train(model, pattern, val, config, checkpoint_path=path, resume=True)
    again = load_checkpoint(tmp_path / "best.pt")
    assert again.extra["best"]["val_loss"] == min(history["val_loss"])


def test_the_command_says_which_checkpoint_is_which(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [corpus, "--out", out, *[t for t in T if t != "--quiet"], "--max-iters", 10]
    code, err = run(train_cli.main, argv, capsys)
    assert code == 0, err
    assert f"last: {out / 'checkpoint.pt'} (step 10)" in err
    assert f"best: {out / 'best.pt'} (step " in err and "val loss" in err
