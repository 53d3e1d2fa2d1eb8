"""Processes as the tests see them: a child Python process killed at a point it reached (what a
crash leaves on disk), and whether a companion process a test saw started still runs."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def killed_after(code: str, *args: str, says: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run ``python -c code args...`` until it printed the line ``says`` (its stdin stays open,
    so it can wait for its kill reading it), run the block, then SIGKILL it by pid and reap it."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == says
        yield
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL


def proc_stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command's name (state first, parent PID second); ``None``
    once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def companion_running(pid: int) -> bool:
    """Whether the companion process ``pid`` still runs: not a zombie, and not a reused PID
    running something else. One forked warm by a test (support.zygote) keeps that process's
    command line."""
    stat = proc_stat(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    ours = b"companion" in cmdline or b"support.zygote" in cmdline
    return stat is not None and stat[0] != "Z" and ours
