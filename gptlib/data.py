"""Datasets: download (checked and atomic), split, and sample training batches.

``load_corpus("sales-textbook")`` fetches the book's dataset once into a cache folder and reads it
from there afterwards. The folder is ``$GPTLIB_DATA_DIR`` when that variable is set, otherwise
``~/.cache/gptlib``. Offline, put the file at the path the error message names.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from tqdm.auto import tqdm

from gptlib.checks import check_window_fits
from gptlib.files import atomic_write, sha256_of


@dataclass(frozen=True)
class CorpusSpec:
    """Where a named corpus comes from and how to check it."""

    url: str
    sha256: str
    filename: str
    size: int | None = None  # bytes; a download that grows past it is stopped
    title: str = ""  # how to name it for people ("the sales textbook")


CORPORA: dict[str, CorpusSpec] = {
    "sales-textbook": CorpusSpec(
        url=(
            "https://huggingface.co/datasets/goendalf666/"
            "sales-textbook_for_convincing_and_selling/raw/main/sales_textbook.txt"
        ),
        sha256="1994f20f5becd3f0b3d7a632e5a68513cc38cf6c9737a9f38243f1b652e962da",
        filename="sales_textbook.txt",
        size=460_319,
        title="the sales textbook",
    ),
}


class CorpusUnavailableError(RuntimeError):
    """A corpus is not cached and could not be downloaded."""


class ChecksumError(CorpusUnavailableError):
    """Downloaded or cached bytes do not match the expected sha256 (nothing is written)."""


def data_dir() -> Path:
    """The cache folder for downloaded corpora (``$GPTLIB_DATA_DIR`` or ``~/.cache/gptlib``)."""
    env = os.environ.get("GPTLIB_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gptlib"


DEFAULT_MAX_BYTES = 1 << 30  # a download of unknown size stops at 1 GiB unless told otherwise
DEFAULT_DEADLINE = 600.0  # seconds for a whole download, however slowly the bytes arrive
_CHUNK = 1 << 16


def _unavailable(url: str, dest: Path, reason: object) -> CorpusUnavailableError:
    return CorpusUnavailableError(
        f"could not download {url} ({reason}). If you are offline, download the file on a "
        f"machine with network access and place it at {dest}"
    )


def _stream(response, f: BinaryIO, limits: tuple[int, float], bar) -> str:
    """Copy ``response`` into ``f`` within ``limits`` = (max bytes, deadline on the monotonic
    clock); returns the sha256 of what was read. Raises OSError (with a reason) on a breach."""
    max_bytes, deadline = limits
    declared = response.headers.get("Content-Length")
    declared = int(declared) if declared and declared.isdigit() else None
    if declared is not None and declared > max_bytes:
        raise OSError(f"the server announces {declared:,} bytes, more than the limit {max_bytes:,}")
    bar.reset(total=declared)
    h, got = hashlib.sha256(), 0
    while chunk := response.read1(_CHUNK):  # read1: whatever has arrived, so the clock is seen
        got += len(chunk)
        if got > max_bytes:
            raise OSError(f"the response grew past the limit of {max_bytes:,} bytes")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the download took longer than its deadline ({got:,} bytes read)")
        h.update(chunk)
        f.write(chunk)
        bar.update(len(chunk))
    if declared is not None and got != declared:
        raise OSError(f"the connection closed after {got:,} of {declared:,} bytes")
    return h.hexdigest()


def download(
    url: str,
    dest: str | os.PathLike,
    sha256: str | None = None,
    timeout: float = 30.0,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline: float = DEFAULT_DEADLINE,
    progress: bool | None = None,
) -> Path:
    """Download ``url`` to ``dest`` atomically, checking its sha256 when given.

    The bytes stream into a hidden temporary file beside ``dest`` (never all into memory) and
    replace ``dest`` only when complete and checked. ``timeout`` bounds each wait for the server,
    ``deadline`` the whole download in seconds, ``max_bytes`` its size. Every failure (no server,
    HTTP error, too slow, too large, cut short) raises :class:`CorpusUnavailableError` saying where
    to put the file by hand; a wrong checksum raises :class:`ChecksumError` (one of them). Nothing
    is left behind on failure. ``progress``: a progress bar (default: when stderr is a terminal).
    """
    dest = Path(dest)
    end = time.monotonic() + deadline
    disable = None if progress is None else not progress  # None: tqdm's own terminal test

    def fetch(f: BinaryIO) -> None:
        wait = max(0.001, min(timeout, end - time.monotonic()))
        with (
            urllib.request.urlopen(url, timeout=wait) as response,
            tqdm(desc=dest.name, unit="B", unit_scale=True, disable=disable) as bar,
        ):
            got = _stream(response, f, (max_bytes, end), bar)
        if sha256 is not None and got != sha256:
            raise ChecksumError(
                f"the file downloaded from {url} has sha256 {got}, expected {sha256}; it was not "
                "saved. The download may be truncated or the file may have changed upstream."
            )

    try:
        atomic_write(dest, fetch)
    except ChecksumError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or f"{type(err).__name__}: {err}"
        raise _unavailable(url, dest, reason) from err
    return dest


def corpus_title(name_or_path: str | os.PathLike) -> str:
    """A corpus's name for people: a named corpus's title, or a text file's name."""
    spec = CORPORA.get(str(name_or_path))
    return (spec.title or str(name_or_path)) if spec is not None else Path(name_or_path).name


def corpus_path(name: str) -> Path:
    """Where the named corpus is (or will be) cached."""
    return data_dir() / CORPORA[name].filename


def load_corpus(
    name_or_path: str | os.PathLike = "sales-textbook",
    *,
    url: str | None = None,
    timeout: float = 30.0,
    max_bytes: int | None = None,
) -> str:
    """Return the text of a named corpus (downloading it once) or of any local text file.

    ``name_or_path`` is a key of :data:`CORPORA` or a path to a UTF-8 text file. ``url`` overrides
    where a named corpus is downloaded from (a mirror, or a test server); ``timeout`` bounds each
    wait for its server and ``max_bytes`` its size (default: the corpus's known size). See
    :func:`download` for the rest of the rules.
    """
    if str(name_or_path) in CORPORA:
        spec = CORPORA[str(name_or_path)]
        path = corpus_path(str(name_or_path))
        if path.exists():
            if sha256_of(path) != spec.sha256:
                raise ChecksumError(
                    f"the cached file {path} does not have the expected sha256 {spec.sha256}; "
                    "delete it to download it again"
                )
        else:
            limit = max_bytes or spec.size or DEFAULT_MAX_BYTES
            download(url or spec.url, path, spec.sha256, timeout=timeout, max_bytes=limit)
        return path.read_text(encoding="utf-8")
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(CORPORA))
        raise FileNotFoundError(
            f"{str(name_or_path)!r} is neither a known corpus name ({known}) nor an existing text "
            "file; pass a corpus name or the path of a UTF-8 text file"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}); convert it to UTF-8 first") from err


def train_val_split(
    data: torch.Tensor, val_fraction: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a 1-D token stream into its first ``1 - val_fraction`` and the rest (no shuffling,
    so no validation text leaks into training windows)."""
    if data.dim() != 1:
        raise ValueError(f"expected a 1-D tensor of token ids, got shape {tuple(data.shape)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    n_train = int(len(data) * (1.0 - val_fraction))
    return data[:n_train], data[n_train:]


def seeded_generator(
    seed: int | None = None, device: str | torch.device | None = None
) -> torch.Generator:
    """A ``torch.Generator`` (on ``device``) seeded with ``seed``, or from fresh entropy when
    ``seed`` is None. Sampling batches and tokens draws from such a generator, never from
    PyTorch's global one."""
    g = torch.Generator() if device is None else torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    context_length: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows from a 1-D token stream (chapter 1).

    Returns ``x`` and ``y``, both ``(batch_size, context_length)``, where ``y`` is ``x`` shifted
    one token to the left: ``y[b, t]`` is the token that follows ``x[b, t]`` in the text. Pass a
    ``seed`` for a reproducible draw, or a ``generator`` to continue a stream of draws.
    """
    if data.dim() != 1:
        raise ValueError(f"expected a 1-D tensor of token ids, got shape {tuple(data.shape)}")
    if batch_size < 1 or context_length < 1:
        raise ValueError(
            f"batch_size and context_length must be positive, got {batch_size}, {context_length}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {generator!r}; pass seed=...")
    if seed is not None and generator is not None:
        raise ValueError("pass a seed or a generator, not both")
    check_window_fits(len(data), context_length)
    g = generator if generator is not None else seeded_generator(seed)
    starts = torch.randint(len(data) - context_length, (batch_size,), generator=g)  # (B,)
    offsets = torch.arange(context_length)  # (T,)
    x = data[starts[:, None] + offsets]  # (B, T)
    y = data[starts[:, None] + offsets + 1]  # (B, T)
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y
