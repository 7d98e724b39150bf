"""Several processes: torchrun with two CPU ranks (gloo) ends with identical parameters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlib import distributed
from gptlib.checkpoint import load_checkpoint
from gptlib.tokenizer import TokenizerUnavailableError, get_encoding

SENTENCES = [
    "Every rank reads the same text but draws its own windows.",
    "The gradients are averaged, so the weights stay the same.",
    "Only the first rank writes the checkpoint and the history.",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_defaults(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.env_info() is None
    info = distributed.current()
    assert (info.rank, info.world_size, info.is_main, info.enabled) == (0, 1, True, False)
    assert distributed.init_from_env("cpu") == distributed.DistInfo()
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_mean(t) is t
    assert distributed.all_gather_objects("x") == ["x"]
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap(model, torch.device("cpu")) is model


def test_env_info_reads_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = distributed.env_info()
    assert info == distributed.DistInfo(rank=3, world_size=4, local_rank=1)
    assert not info.is_main and info.enabled
    assert not distributed.is_main_process()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(RuntimeError, match="malformed torchrun environment"):
        distributed.env_info()


def test_parameter_digest_sees_any_change():
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2)
    digest = distributed.parameter_digest(a)
    assert digest == distributed.parameter_digest(a)
    with torch.no_grad():
        a.bias[0] += 1e-6
    assert distributed.parameter_digest(a) != digest


def torchrun(corpus: Path, out: Path, digest: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        "-m", "gptlib.train", str(corpus), "--out", str(out), "--device", "cpu",
        "--eval-interval", "3", "--eval-iters", "2", "--d-model", "16", "--n-heads", "2",
        "--n-blocks", "1", "--context-length", "8", "--param-digest", str(digest), *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done


def read_digests(digest: Path) -> list[dict]:
    return [json.loads(Path(f"{digest}.rank{r}").read_text()) for r in (0, 1)]


def test_torchrun_two_cpu_ranks_end_identical_and_resume(tmp_path):
    try:
        get_encoding("cl100k_base")
    except TokenizerUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"the cl100k_base files are not available offline ({err})")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES[i % 3] for i in range(90)) + "\n", encoding="utf-8")
    out, digest = tmp_path / "run", tmp_path / "digest"

    done = torchrun(corpus, out, digest, "--max-iters", "3")
    records = read_digests(digest)
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world_size"] == 2 for r in records)
    assert records[0]["params"] == records[1]["params"]  # DDP kept the ranks identical
    assert records[0]["batch_seed"] != records[1]["batch_seed"]  # but they drew different data
    # only rank 0 wrote files: the last and the best checkpoint, one history, the folder's lock,
    # no temporary files
    names = sorted(p.name for p in out.iterdir())
    assert names == [".gptlib.lock", "best.pt", "checkpoint.pt", "history.json"]
    assert done.stderr.count("step 3: train loss") == 1  # one summary line, from rank 0
    ckpt = load_checkpoint(out)
    assert ckpt.step == 3 and ckpt.extra["world_size"] == 2
    assert len(ckpt.extra["rng"]) == 2  # each rank's random state, for an exact resume
    assert not torch.equal(ckpt.extra["rng"][0]["batch"], ckpt.extra["rng"][1]["batch"])
    assert distributed.parameter_digest(ckpt.model) == records[0]["params"]

    done = torchrun(corpus, out, digest, "--max-iters", "6", "--resume")
    assert "resuming from" in done.stderr
    resumed = read_digests(digest)
    assert resumed[0]["params"] == resumed[1]["params"] != records[0]["params"]
    ckpt = load_checkpoint(out)
    assert ckpt.step == 6
    assert distributed.parameter_digest(ckpt.model) == resumed[0]["params"]
    assert json.loads((out / "history.json").read_text())["step"] == [3, 6]
