"""A warm-started process (:mod:`support.warm`) is what its test asked for: a child of this
process, with its own PID, pipes, environment, arguments, exit status and signals; anything a
warm start cannot serve starts cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import warm
from support.network import child_env

PROBE = "support.warm_probe"


@pytest.fixture(autouse=True)
def _warm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the warm start itself: they run it even in a cold suite."""
    monkeypatch.delenv("COMPANION_TEST_COLD", raising=False)


def _env(**extra: str) -> dict[str, str]:
    return {**child_env(), **extra}


def _start(
    *args: str, options: dict[str, Any] | None = None, cwd: str | None = None, **extra: str
) -> subprocess.Popen[str]:
    return warm.popen(
        [sys.executable, "-m", PROBE, *args],
        env=_env(**extra),
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **(options or {}),
    )


def test_a_warm_child_is_ours_with_its_own_arguments_environment_and_exit_status() -> None:
    process = _start("a", "b c", COMPANION_PROBE="42")
    assert type(process).__name__ == "_WarmPopen"
    out, err = process.communicate("from stdin\n", timeout=30)
    assert process.returncode == 7, err  # waitpid() on a process not our child would say 0
    said = json.loads(out)
    assert said["pid"] == process.pid
    assert said["argv"][1:] == ["a", "b c"] and said["argv"][0].endswith("warm_probe.py")
    assert said["env"] == "42" and said["name"] == "__main__"
    assert said["stdin"] == "from stdin\n"
    assert err == "to stderr\n"


def test_a_warm_child_is_signalled_and_reaped_by_its_pid() -> None:
    process = _start("wait")
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "waiting"
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM


@pytest.mark.parametrize("what", ["interpreter environment", "Popen option"])
def test_what_a_warm_start_cannot_serve_starts_cold(what: str) -> None:
    """Another interpreter environment (here ``PYTHONHASHSEED``) is read at the interpreter's
    start, which a forked child does not redo; an option such as ``restore_signals`` acts in
    a child the server makes, not this process."""
    if what == "Popen option":
        process = _start(options={"restore_signals": False})
    else:
        process = _start(PYTHONHASHSEED="3")
    assert type(process) is subprocess.Popen
    out, _err = process.communicate("", timeout=60)
    assert process.returncode == 7
    assert json.loads(out)["pid"] == process.pid


def test_a_warm_child_runs_in_the_folder_and_session_it_was_started_in(tmp_path: Path) -> None:
    """Elsewhere than the worker's folder (a command run from a user's folder), in a session of
    its own (a terminal's foreground group, which a test presses Ctrl-C on): what
    ``Popen(cwd=..., start_new_session=True)`` gives a fresh interpreter, module path included."""
    process = _start(cwd=str(tmp_path), options={"start_new_session": True})
    assert type(process).__name__ == "_WarmPopen"
    out, _err = process.communicate("", timeout=30)
    said = json.loads(out)
    assert (said["cwd"], said["path0"], said["session_leader"]) == (str(tmp_path), str(tmp_path), True)
    plain = _start()
    said = json.loads(plain.communicate("", timeout=30)[0])
    assert (said["cwd"], said["session_leader"]) == (os.getcwd(), False)


def test_a_server_that_stopped_answering_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    server = warm._Server(_env())
    try:
        monkeypatch.setattr(warm, "_server", server)
        server.process.kill()  # by its PID: the server this test started
        server.process.wait(30)
        for _ in range(2):
            process = _start()
            assert type(process) is subprocess.Popen  # started cold, and works
            out, _err = process.communicate("", timeout=60)
            assert process.returncode == 7 and json.loads(out)["pid"] == process.pid
        assert server.broken
    finally:
        server.close()
