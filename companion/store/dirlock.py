"""One process per companion: an OS lock on the companion's data directory.

Why: two processes with the same companion's directory share its key, so they are one peer id
twice on the network (every line said twice, peers log ``invalid-signed-record``), and both
write its history. The default data directory is shared, so a second terminal does it by
accident. :class:`DirectoryLock` takes ``flock`` on a ``lock`` file in the directory: the kernel
releases it when the process ends, however it ends (a crash or SIGKILL never leaves a stale
lock to clean up by hand), and a second process is refused at once, with the holder's pid
(which the holder writes into the file once it has the lock).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import Final

__all__ = ["LOCK_FILENAME", "DirectoryInUse", "DirectoryLock"]

LOCK_FILENAME: Final = "lock"
MAX_PID_BYTES: Final = 32


class DirectoryInUse(OSError):
    """Another process holds the directory; the message names it and that process."""

    def __str__(self) -> str:
        return str(self.strerror)


class DirectoryLock:
    """The lock of ``directory`` (created if needed), held from :meth:`acquire` until
    :meth:`release` or the end of the process. ``filename`` names the lock where one directory
    holds the keys of several processes (``keys/bridge.lock`` beside ``keys/bridge.key``). Not
    reentrant within a process: a second lock object on the same directory is refused too
    (``flock`` locks belong to an open file)."""

    def __init__(self, directory: Path, *, what: str = "", filename: str = LOCK_FILENAME) -> None:
        self.directory = directory
        self.path = directory / filename
        self._what = what or directory.name
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        """Take the lock, or raise :class:`DirectoryInUse` at once (never waits)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OSError(exc.errno, f"cannot lock {self.path}: {exc.strerror}") from None
            by = f"process {holder}" if holder else "another process"
            raise DirectoryInUse(
                exc.errno,
                f"{self.directory} is in use by {by} ({self._what} is running there already); "
                "stop that one first, or give this one another --data-dir",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing releases the lock; the file stays (removing it would race)

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, if it wrote one yet."""
    try:
        text = os.pread(fd, MAX_PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
