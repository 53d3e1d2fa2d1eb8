"""The ``companion`` command as a user runs it: the console script pip installed next to this
Python, in a process of its own (its own process group, so a test can press Ctrl-C on it the way
a terminal does: SIGINT to the whole foreground group), from a working directory of the test's
choosing, always stopped by its PID."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.network import child_env
from support.warm import popen as warm_popen

REPO = Path(__file__).resolve().parents[2]

__all__ = ["Started", "companion_argv", "companion_popen", "run_companion", "run_demo", "started_companion"]


def companion_argv() -> list[str]:
    """The installed ``companion`` script (``python -m companion`` if pip put none here)."""
    script = shutil.which("companion", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "companion"]


def companion_popen(
    args: Sequence[str], *, warm: bool, cwd: Path, env: dict[str, str] | None, **options: Any
) -> subprocess.Popen[str]:
    """``companion ARGS``: the console script in a fresh interpreter, or with ``warm``
    ``python -m companion`` forked from the worker's warm-start server (:mod:`support.warm`),
    for a test that reads what the command does once it runs, not how it starts."""
    if not warm:
        return subprocess.Popen([*companion_argv(), *args], cwd=cwd, env=env, text=True, **options)
    argv = [sys.executable, "-m", "companion", *args]
    return warm_popen(argv, env=child_env(base=env), cwd=str(cwd), text=True, **options)


def run_companion(
    args: Sequence[str],
    *,
    cwd: Path,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    warm: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``companion ARGS`` to its end (at most ``timeout`` seconds) and capture its output;
    ``warm``: see :func:`companion_popen`."""
    process = companion_popen(
        args,
        warm=warm,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:  # by its PID: the process this call started
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@dataclass
class Started:
    process: subprocess.Popen[str]
    out_path: Path
    err_path: Path

    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_output(self, needle: str, timeout: float) -> bool:
        """Whether ``needle`` shows up on standard output within ``timeout`` seconds (``False``
        at once when the process ended without it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.stdout():
                return True
            if self.process.poll() is not None:
                return needle in self.stdout()
            time.sleep(0.1)
        return False

    def wait_for_stderr(self, needle: str, timeout: float) -> bool:
        """Whether ``needle`` shows up on standard error within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if needle in self.stderr():
                return True
            time.sleep(0.1)
        return needle in self.stderr()

    def ctrl_c(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to the command's process group (its children
        included), which this test created for it."""
        os.killpg(self.process.pid, signal.SIGINT)


@contextlib.contextmanager
def started_companion(
    args: Sequence[str],
    *,
    cwd: Path,
    logs: Path,
    env: dict[str, str] | None = None,
    warm: bool = False,
) -> Iterator[Started]:
    """``companion ARGS`` running in its own process group with an open standard input (a pipe
    the test holds), output in files under ``logs``; ``warm``: see :func:`companion_popen`.
    On the way out anything of it still running is killed by its process group's id."""
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / "stdout.txt", logs / "stderr.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = companion_popen(
            args,
            warm=warm,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.PIPE,  # open, as a terminal's is (``listen`` quits at end of input)
            start_new_session=True,
        )
    try:
        yield Started(process, out_path, err_path)
    finally:
        # The group outlives its leader while any child of it runs (and Linux gives no new
        # process that id meanwhile), so this reaches only what this test started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if process.stdin is not None:
            process.stdin.close()


def run_demo(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`companion demo --json` run to its end from the checkout (kept in ``tmp_path/run`` unless
    ``env`` is given): the finished process and its transcript, one event a line. Forked warm:
    what these tests read is the transcript, not the start-up."""
    keep = [] if env is not None else ["--keep", str(tmp_path / "run")]
    args = ["demo", "--json", "--pace", "0.1", "--timeout", "120", "--log-level", "INFO", *keep, *extra]
    done = run_companion(args, cwd=REPO, timeout=240, env=env, warm=True)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done, events
