"""Data: batches, the train/validation split, local corpora, and downloads against a loopback HTTP
server (success, wrong checksum, unreachable host, timeout). Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import gptlib.data as gd
import gptlib.files as gf
from gptlib.data import (
    ChecksumError,
    CorpusSpec,
    CorpusUnavailableError,
    data_dir,
    download,
    get_batch,
    load_corpus,
    train_val_split,
)
from gptlib.files import atomic_write_bytes

# ---- get_batch ------------------------------------------------------------------------------


def stream(n: int = 500) -> torch.Tensor:
    """Distinct values, so that a window's position in the stream can be read off its values."""
    return torch.arange(1000, 1000 + n)


@pytest.mark.parametrize(("B", "T"), [(1, 1), (4, 16), (8, 5)])
def test_get_batch_shapes_and_shift(B, T):
    data = stream()
    x, y = get_batch(data, B, T, seed=0)
    assert x.shape == y.shape == (B, T) and x.dtype == data.dtype
    for b in range(B):
        start = int(x[b, 0]) - 1000
        assert 0 <= start <= len(data) - T - 1
        assert torch.equal(x[b], data[start : start + T])  # a contiguous window of the stream
        assert torch.equal(y[b], data[start + 1 : start + T + 1])  # the same window, one later


def test_get_batch_on_real_tokens_has_y_as_next_tokens():
    g = torch.Generator().manual_seed(0)
    data = torch.randint(10, (300,), generator=g)  # repeated values: check via the stream
    x, y = get_batch(data, 6, 7, seed=1)
    windows = data.unfold(0, 8, 1)  # (N - 7, 8): every window of T + 1 tokens
    for b in range(6):
        matches = (windows[:, :7] == x[b]).all(1) & (windows[:, 1:] == y[b]).all(1)
        assert matches.any()


def test_get_batch_reaches_the_last_token():
    data = stream(12)
    seen = set()
    for seed in range(200):
        x, y = get_batch(data, 4, 5, seed=seed)
        seen |= set(y[:, -1].tolist())
    assert max(seen) == int(data[-1])  # the final window is possible
    assert min(seen) == int(data[5])  # and the first one


def test_get_batch_is_reproducible():
    data = stream()
    x1, y1 = get_batch(data, 8, 10, seed=123)
    x2, y2 = get_batch(data, 8, 10, seed=123)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _ = get_batch(data, 8, 10, seed=124)
    assert not torch.equal(x1, x3)
    # a Generator is used as given: the same seed gives the same draws, and it advances
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a1, _ = get_batch(data, 8, 10, generator=g1)
    a2, _ = get_batch(data, 8, 10, generator=g2)
    assert torch.equal(a1, a2)
    b1, _ = get_batch(data, 8, 10, generator=g1)
    assert not torch.equal(a1, b1)
    # an int seed means the same as a Generator seeded with it
    assert torch.equal(get_batch(data, 8, 10, generator=torch.Generator().manual_seed(123))[0], x1)


def test_get_batch_device():
    x, y = get_batch(stream(), 2, 3, seed=0, device="cpu")
    assert x.device.type == y.device.type == "cpu"


def test_get_batch_errors():
    message = (
        r"the data has 8 tokens, but one training window needs context_length \+ 1 = 9; "
        "use more text or a shorter context_length"
    )
    with pytest.raises(ValueError, match=message):
        get_batch(stream(8), 2, 8)
    get_batch(stream(9), 2, 8)  # exactly one window is enough
    with pytest.raises(ValueError, match=r"expected a 1-D tensor of token ids, got shape \(2, 5\)"):
        get_batch(torch.zeros(2, 5, dtype=torch.long), 1, 2)
    with pytest.raises(ValueError, match="batch_size and context_length must be positive, got 0"):
        get_batch(stream(), 0, 4)
    with pytest.raises(ValueError, match="must be positive, got 2, 0"):
        get_batch(stream(), 2, 0)


# ---- train_val_split ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "fraction", "n_train"),
    [(100, 0.1, 90), (77_919, 0.1, 70_127), (10, 0.25, 7), (3, 0.5, 1)],
)
def test_train_val_split_sizes_and_order(n, fraction, n_train):
    data = torch.arange(n)
    train, val = train_val_split(data, fraction)
    assert len(train) == n_train and len(val) == n - n_train
    assert torch.equal(torch.cat([train, val]), data)  # no shuffling: the start, then the end


def test_train_val_split_errors():
    with pytest.raises(ValueError, match=r"expected a 1-D tensor of token ids, got shape \(2, 2\)"):
        train_val_split(torch.zeros(2, 2))
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=f"val_fraction must be between 0 and 1.*got {bad}"):
            train_val_split(torch.arange(10), bad)


# ---- local files -----------------------------------------------------------------------------


def test_load_corpus_reads_a_local_text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("héllo, wörld\nsecond line\n", encoding="utf-8")
    assert load_corpus(path) == "héllo, wörld\nsecond line\n"
    assert load_corpus(str(path)) == "héllo, wörld\nsecond line\n"


def test_load_corpus_missing_path(tmp_path):
    missing = tmp_path / "nope.txt"
    message = r"nope.txt' is neither a known corpus name \(sales-textbook\) nor an existing text"
    with pytest.raises(FileNotFoundError, match=message):
        load_corpus(missing)
    with pytest.raises(FileNotFoundError, match="neither a known corpus name"):
        load_corpus(tmp_path)  # a folder is not a text file


def test_load_corpus_rejects_non_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text .*convert it to UTF-8 first"):
        load_corpus(path)


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPTLIB_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.delenv("GPTLIB_DATA_DIR")
    assert data_dir() == Path.home() / ".cache" / "gptlib"


def test_atomic_write_bytes(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "file.bin"
    atomic_write_bytes(target, b"first")
    assert target.read_bytes() == b"first"
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["file.bin"]

    def fail(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(gf.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"third")
    assert target.read_bytes() == b"second"  # the old file is untouched
    assert os.listdir(target.parent) == ["file.bin"]  # and the temporary file is gone


def test_atomic_write_syncs_the_file_and_then_its_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}") if os.path.exists("/proc") else fd)
        real_fsync(fd)

    monkeypatch.setattr(gf.os, "fsync", record)
    gf.atomic_write(tmp_path / "f.bin", lambda f: f.write(b"data"))
    assert (tmp_path / "f.bin").read_bytes() == b"data"
    assert len(synced) == 2  # the file's bytes, then the folder that records the rename
    if os.path.exists("/proc"):
        assert synced == [False, True]


# ---- downloads from a loopback server ---------------------------------------------------------

PAYLOAD = "A tiny corpus served over loopback.\nSecond line: ünïcode.\n".encode()
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {"/corpus.txt": PAYLOAD}

    def do_GET(self):  # noqa: N802 (the name http.server expects)
        misbehave = {"/trickle": self.trickle, "/endless": self.endless, "/cut": self.cut}
        if self.path in misbehave:
            try:
                misbehave[self.path]()
            except OSError:  # the client hung up, as it should
                pass
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def trickle(self):
        """One byte every 50 ms of a 1,000-byte answer: 50 s in all, unless the client gives up."""
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.05)

    def endless(self):
        """No length, and 64 KiB after 64 KiB (stops at 256 MiB so that the test is bounded)."""
        self.send_response(200)
        self.end_headers()
        block = b"y" * (1 << 16)
        for _ in range(4096):
            self.wfile.write(block)

    def cut(self):
        """Announces 1,000 bytes, sends 10, closes."""
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"z" * 10)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Loopback requests must go straight to 127.0.0.1, never through a configured proxy."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "*")


@pytest.fixture
def server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (a free port), in a thread, stopped after the test."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def test_corpus(monkeypatch, tmp_path) -> Path:
    """A corpus entry whose checksum matches PAYLOAD, cached in an empty GPTLIB_DATA_DIR."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPTLIB_DATA_DIR", str(cache))
    spec = CorpusSpec(url="http://127.0.0.1:9/unused", sha256=PAYLOAD_SHA, filename="test.txt")
    monkeypatch.setitem(gd.CORPORA, "test-corpus", spec)
    return cache


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_success_writes_the_file(server, test_corpus):
    text = load_corpus("test-corpus", url=f"{server}/corpus.txt", timeout=5)
    assert text == PAYLOAD.decode()
    path = test_corpus / "test.txt"
    assert path.read_bytes() == PAYLOAD
    assert os.listdir(test_corpus) == ["test.txt"]  # no temporary files left
    # the next call reads the cache (no server needed: a closed port would fail)
    assert load_corpus("test-corpus", url=f"http://127.0.0.1:{closed_port()}/x") == text


def test_download_function_directly(server, tmp_path):
    dest = tmp_path / "deep" / "copy.txt"
    assert download(f"{server}/corpus.txt", dest, PAYLOAD_SHA, timeout=5) == dest
    assert dest.read_bytes() == PAYLOAD
    other = tmp_path / "unchecked.txt"
    download(f"{server}/corpus.txt", other, None, timeout=5)  # no checksum given: saved as is
    assert other.read_bytes() == PAYLOAD


def test_wrong_checksum_raises_and_leaves_nothing(server, test_corpus, monkeypatch):
    wrong = CorpusSpec(url="unused", sha256="0" * 64, filename="test.txt")
    monkeypatch.setitem(gd.CORPORA, "test-corpus", wrong)
    message = f"has sha256 {PAYLOAD_SHA}, expected {'0' * 64}; it was not saved"
    with pytest.raises(ChecksumError, match=message):
        load_corpus("test-corpus", url=f"{server}/corpus.txt", timeout=5)
    assert not test_corpus.exists() or list(test_corpus.iterdir()) == []


def test_cached_file_with_wrong_checksum(test_corpus):
    test_corpus.mkdir()
    (test_corpus / "test.txt").write_bytes(PAYLOAD + b"tampered")
    with pytest.raises(ChecksumError, match="does not have the expected sha256 .*delete it"):
        load_corpus("test-corpus")


def test_http_error_is_a_clear_error(server, test_corpus):
    with pytest.raises(CorpusUnavailableError, match="could not download .*/missing.txt"):
        load_corpus("test-corpus", url=f"{server}/missing.txt", timeout=5)
    assert not (test_corpus / "test.txt").exists()


def test_unreachable_host_names_where_to_put_the_file(test_corpus):
    url = f"http://127.0.0.1:{closed_port()}/corpus.txt"
    expected = test_corpus / "test.txt"
    with pytest.raises(CorpusUnavailableError) as info:
        load_corpus("test-corpus", url=url, timeout=5)
    message = str(info.value)
    assert f"could not download {url}" in message
    assert f"place it at {expected}" in message
    assert not expected.exists()


def test_timeout_gives_the_clear_error(test_corpus):
    # a listening socket that never accepts: the connection opens, no answer ever comes
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/corpus.txt"
        message = r"could not download .*timed out.*place it at"
        with pytest.raises(CorpusUnavailableError, match=message):
            load_corpus("test-corpus", url=url, timeout=0.3)
    assert not (test_corpus / "test.txt").exists()


def test_a_trickling_server_hits_the_overall_deadline(server, tmp_path):
    dest = tmp_path / "cache" / "slow.txt"
    start = time.monotonic()
    with pytest.raises(CorpusUnavailableError, match=r"longer than its deadline.*place it at"):
        download(f"{server}/trickle", dest, None, timeout=5, deadline=0.5)
    assert time.monotonic() - start < 3  # not the 50 s the server would take
    assert list(dest.parent.iterdir()) == []  # the partial temporary file is gone


def test_an_endless_response_stops_at_the_size_limit(server, tmp_path):
    dest = tmp_path / "cache" / "huge.txt"
    with pytest.raises(CorpusUnavailableError, match=r"grew past the limit of 1,048,576 bytes"):
        download(f"{server}/endless", dest, None, timeout=5, max_bytes=1 << 20)
    assert list(dest.parent.iterdir()) == []


def test_a_named_corpus_is_limited_to_its_known_size(server, test_corpus, monkeypatch):
    spec = CorpusSpec(url="unused", sha256=PAYLOAD_SHA, filename="test.txt", size=len(PAYLOAD))
    monkeypatch.setitem(gd.CORPORA, "test-corpus", spec)
    with pytest.raises(CorpusUnavailableError, match=f"limit of {len(PAYLOAD)} bytes"):
        load_corpus("test-corpus", url=f"{server}/endless", timeout=5)
    assert load_corpus("test-corpus", url=f"{server}/corpus.txt", timeout=5) == PAYLOAD.decode()


def test_an_announced_size_over_the_limit_is_refused_at_once(server, tmp_path):
    with pytest.raises(CorpusUnavailableError, match="announces 1,000 bytes, more than the limit"):
        download(f"{server}/trickle", tmp_path / "t.txt", None, timeout=5, max_bytes=999)


def test_a_response_cut_short_is_a_clear_error(server, tmp_path):
    dest = tmp_path / "cache" / "cut.txt"
    with pytest.raises(CorpusUnavailableError) as info:
        download(f"{server}/cut", dest, None, timeout=5)
    assert "could not download" in str(info.value) and "place it at" in str(info.value)
    assert "10 of 1,000 bytes" in str(info.value) or "IncompleteRead" in str(info.value)
    assert list(dest.parent.iterdir()) == []


def test_a_wrong_checksum_is_one_of_the_unavailable_errors(server, tmp_path):
    with pytest.raises(CorpusUnavailableError, match="has sha256 .* it was not saved"):
        download(f"{server}/corpus.txt", tmp_path / "c.txt", "0" * 64, timeout=5)
    assert list(tmp_path.iterdir()) == []


def test_the_download_streams_into_a_temporary_file_beside_the_cache(server, tmp_path, monkeypatch):
    seen = []
    real_stream = gd._stream

    def spy(response, f, limits, bar):
        seen.append(Path(f.name))
        return real_stream(response, f, limits, bar)

    monkeypatch.setattr(gd, "_stream", spy)
    dest = tmp_path / "cache" / "c.txt"
    download(f"{server}/corpus.txt", dest, PAYLOAD_SHA, timeout=5, progress=True)
    assert seen[0].parent == dest.parent and seen[0].name.startswith(".c.txt.")
    assert dest.read_bytes() == PAYLOAD and not seen[0].exists()


def test_a_bad_url_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusUnavailableError, match="could not download nope://x"):
        download("nope://x", tmp_path / "x.txt")
