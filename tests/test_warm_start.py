"""A warm-started process (:mod:`support.warm`) is what its test asked for: a child of this
process, with its own PID, pipes, environment, arguments, exit status and signals; anything a
warm start cannot serve starts cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def _start(*args: str, new_session: bool = False, **extra: str) -> subprocess.Popen[str]:
    options: dict[str, Any] = {"start_new_session": True} if new_session else {}
    return warm.popen(
        [sys.executable, "-m", PROBE, *args],
        env=_env(**extra),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,
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
    start, which a forked child does not redo; an option such as ``start_new_session`` acts in
    a child the server makes, not this process."""
    process = _start(new_session=True) if what == "Popen option" else _start(PYTHONHASHSEED="3")
    assert type(process) is subprocess.Popen
    out, _err = process.communicate("", timeout=60)
    assert process.returncode == 7
    assert json.loads(out)["pid"] == process.pid


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
