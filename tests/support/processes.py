"""A child Python process killed at a point it reached: what a crash leaves on disk."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


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
