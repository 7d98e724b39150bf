"""A training run's output folder: checked before the first step, one run at a time, tidy.

Three things go wrong with an output folder only after hours of training unless they are checked
at the start (appendix: using gptlib on your own text):

* it cannot be written (a file in its place, a dangling link, a read-only disk):
  :func:`check_writable` creates it and writes and removes a probe file before anything else;
* two runs write into it at once and mix their files: :class:`RunLock` takes an exclusive lock
  (``fcntl.flock``) that names the run holding it. The operating system releases it when that
  process ends, even when it is killed, so a crashed run never blocks the next one;
* a run killed while saving leaves hidden temporary files behind:
  :func:`remove_stale_temporaries` deletes those of the same run's files (safe once the lock is
  held: no other run can be writing them).

:func:`disk_full_error` turns a save that ran out of space into one line that says how much is
needed.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
import time
from pathlib import Path

try:  # POSIX; Windows has msvcrt's byte-range locks instead
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None  # type: ignore[assignment]
    import msvcrt

LOCK_NAME = ".gptlib.lock"  # inside the run folder; holds "pid host start-time" of the owner


class RunFolderError(OSError):
    """The output folder cannot be used: not writable, or in use by another run."""

    def __str__(self) -> str:  # one line, without OSError's "[Errno ...]" prefix
        return str(self.args[0])


def check_writable(folder: str | os.PathLike) -> Path:
    """Create ``folder`` (and its parents) and prove it writable by writing and removing a probe
    file; raise :class:`RunFolderError` saying what is in the way."""
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise RunFolderError(
            f"the output folder {folder} is a symbolic link to {os.readlink(folder)}, which does "
            "not exist; remove the link or point it at an existing folder"
        )
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(
            f"the output folder {folder} is a file, not a folder; choose another --out"
        )
    probe = folder / f".gptlib-probe.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"gptlib checks that the output folder can be written")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise RunFolderError(
            f"cannot write into the output folder {folder} ({err.strerror or err}); nothing was "
            "trained. Choose a folder you can write to (--out)"
        ) from None
    return folder


def _try_lock(fd: int) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:  # pragma: no cover
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


class RunLock:
    """``with RunLock(folder):`` one run at a time in ``folder``.

    The lock file records who holds it (process id, host, start time), so a second run can say
    which run is in its way. The lock belongs to the open file: it is released when the ``with``
    ends, and by the operating system when the process dies, however it dies.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            owner = os.read(fd, 300).decode("utf-8", "replace").strip() or "an unknown process"
            os.close(fd)
            raise RunFolderError(
                f"another run is using {self.path.parent} ({owner}); wait for it to finish or "
                "choose another --out. A run that was killed releases the folder by itself"
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file releases the lock
            self.fd = None


def remove_stale_temporaries(folder: str | os.PathLike, names: tuple[str, ...]) -> list[Path]:
    """Delete the hidden temporary files that an interrupted atomic write of any of ``names``
    left in ``folder`` (``.NAME.<pid>.<random>.tmp``); returns what was removed. Call it only
    while holding the folder's :class:`RunLock`."""
    removed = []
    for name in names:
        for tmp in Path(folder).glob(f".{name}.*.tmp"):
            try:
                tmp.unlink()
            except FileNotFoundError:
                continue
            removed.append(tmp)
    return removed


def _out_of_space(err: BaseException | None) -> bool:
    """Whether ``err`` or an exception it came from says the disk (or quota) is full."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(err, RuntimeError) and "unexpected pos" in str(err):
            return True  # torch's zip writer, when a write came up short
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def disk_full_error(err: BaseException, path: Path, needed: int) -> OSError | None:
    """A one-line OSError for a save of about ``needed`` bytes to ``path`` that failed with
    ``err`` because the disk is full (None when ``err`` is something else)."""
    if not _out_of_space(err):
        return None
    free = shutil.disk_usage(path.parent).free
    return OSError(
        errno.ENOSPC,
        f"the disk is full: saving {path} needs about {needed / 1e6:,.1f} MB, and "
        f"{free / 1e6:,.1f} MB are free on its disk. The previous file, if any, is intact; free "
        "some space (or choose another --out) and resume",
    )
