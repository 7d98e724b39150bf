"""Datasets: download (checked and atomic), split, and sample training batches.

``load_corpus("sales-textbook")`` fetches the book's dataset once into a cache folder and reads it
from there afterwards. The folder is ``$GPTLIB_DATA_DIR`` when that variable is set, otherwise
``~/.cache/gptlib``. Offline, put the file at the path the error message names.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from gptlib.checks import check_window_fits
from gptlib.files import atomic_write_bytes, sha256_of


@dataclass(frozen=True)
class CorpusSpec:
    """Where a named corpus comes from and how to check it."""

    url: str
    sha256: str
    filename: str


CORPORA: dict[str, CorpusSpec] = {
    "sales-textbook": CorpusSpec(
        url=(
            "https://huggingface.co/datasets/goendalf666/"
            "sales-textbook_for_convincing_and_selling/raw/main/sales_textbook.txt"
        ),
        sha256="1994f20f5becd3f0b3d7a632e5a68513cc38cf6c9737a9f38243f1b652e962da",
        filename="sales_textbook.txt",
    ),
}


class CorpusUnavailableError(RuntimeError):
    """A corpus is not cached and could not be downloaded."""


class ChecksumError(RuntimeError):
    """Downloaded bytes do not match the expected sha256 (nothing is written)."""


def data_dir() -> Path:
    """The cache folder for downloaded corpora (``$GPTLIB_DATA_DIR`` or ``~/.cache/gptlib``)."""
    env = os.environ.get("GPTLIB_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gptlib"


def download(url: str, dest: str | os.PathLike, sha256: str | None = None, timeout: float = 30.0):
    """Download ``url`` to ``dest`` atomically, checking its sha256 when given.

    On a wrong checksum nothing is written and :class:`ChecksumError` is raised; when the server
    cannot be reached :class:`CorpusUnavailableError` says where to put the file by hand.
    """
    dest = Path(dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise CorpusUnavailableError(
            f"could not download {url} ({reason}). If you are offline, download the file on a "
            f"machine with network access and place it at {dest}"
        ) from err
    if sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise ChecksumError(
                f"the file downloaded from {url} has sha256 {got}, expected {sha256}; it was not "
                f"saved. The download may be truncated or the file may have changed upstream."
            )
    atomic_write_bytes(dest, data)
    return dest


def corpus_path(name: str) -> Path:
    """Where the named corpus is (or will be) cached."""
    return data_dir() / CORPORA[name].filename


def load_corpus(
    name_or_path: str | os.PathLike = "sales-textbook",
    *,
    url: str | None = None,
    timeout: float = 30.0,
) -> str:
    """Return the text of a named corpus (downloading it once) or of any local text file.

    ``name_or_path`` is a key of :data:`CORPORA` or a path to a UTF-8 text file. ``url`` overrides
    where a named corpus is downloaded from (a mirror, or a test server).
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
            download(url or spec.url, path, spec.sha256, timeout=timeout)
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
