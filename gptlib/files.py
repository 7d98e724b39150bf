"""Writing files so that a crash never leaves half of one: what checkpoints, downloads and the
training command's history share.

:func:`atomic_write` writes to a temporary file next to the target, flushes it to disk and renames
it over the target; a reader sees the old file or the whole new one. :func:`sha256_of` checks a
file against a known digest.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 digest of a file, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it to ``path``.

    Readers see the old file or the complete new one, never a part: the temporary file is flushed
    to disk (``fsync``) before :func:`os.replace` (atomic within a file system) puts it in place,
    the folder is then synced so that the rename itself survives a crash, and the temporary file
    is removed if anything fails. Permissions follow the umask, like a plain ``open``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never
    half (see :func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data))
