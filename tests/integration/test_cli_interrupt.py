"""Ctrl-C on every long-running command, as a terminal delivers it: SIGINT to the command's
whole process group while it runs. Each exits with 130 within seconds, prints no traceback, and
leaves nothing running (the demo's companion processes included, found by their PIDs)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from support.cli import Started, started_companion
from support.processes import companion_running

pytestmark = pytest.mark.integration

READY_WITHIN = 60.0
STOP_WITHIN = 20.0


def _stops_with_130(started: Started) -> None:
    rc = started.process.wait(timeout=STOP_WITHIN)
    assert rc == 130, started.stderr()
    assert "Traceback" not in started.stderr() and "ExceptionGroup" not in started.stderr()


@pytest.mark.parametrize(
    ("command", "ready"),
    [
        (["run", "pim", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0"], "companion_pim sees "),
        (["bridge", "--no-mdns", "--ws", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0"], "ws://"),
        (["relay", "--listen", "/ip4/127.0.0.1/tcp/0"], "relay peer "),
    ],
)
def test_ctrl_c_ends_a_node_command_with_130(command: list[str], ready: str, tmp_path: Path) -> None:
    args = [*command, "--data-dir", str(tmp_path / "data")]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "logs", warm=True) as started:
        assert started.wait_for_output(ready, READY_WITHIN), started.stderr()
        started.ctrl_c()
        _stops_with_130(started)


def test_ctrl_c_ends_listen_with_130(tmp_path: Path) -> None:
    bridge_args = ["bridge", "--no-mdns", "--ws", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")]
    with started_companion(bridge_args, cwd=tmp_path, logs=tmp_path / "bridge", warm=True) as bridge:
        assert bridge.wait_for_output("ws://", READY_WITHIN), bridge.stderr()
        time.sleep(0.5)  # the rest of its URL lines
        url = re.search(r"ws://\S+", bridge.stdout())
        assert url is not None
        listen_args = ["listen", "--ws", url.group(0), "--as", "user_mika"]
        with started_companion(listen_args, cwd=tmp_path, logs=tmp_path / "listen", warm=True) as listen:
            assert listen.wait_for_output("connected to ", READY_WITHIN), listen.stderr()
            listen.ctrl_c()
            _stops_with_130(listen)


def _companion_pids(stderr: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"companion_process_started .*?pid=(\d+)", stderr)]


@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c", "sigint-to-the-demo-only"])
def test_ctrl_c_ends_the_demo_and_its_companion_processes(whole_group: bool, tmp_path: Path) -> None:
    """A reply on screen, then Ctrl-C: the terminal signals the demo and its children at once
    (or only the demo, as ``kill -INT``): either way every companion process is gone."""
    # a pace of 3 s keeps the conversation going while Ctrl-C comes (at 0.2 s a quiet machine
    # finished the whole demo first, exit 0)
    args = ["demo", "--pace", "3", "--log-level", "INFO"]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "logs", warm=True) as demo:
        assert demo.wait_for_output("why: ", READY_WITHIN), demo.stderr()
        children = _companion_pids(demo.stderr())
        assert len(children) == 3 and all(companion_running(pid) for pid in children)
        if whole_group:
            demo.ctrl_c()
        else:
            os.kill(demo.process.pid, signal.SIGINT)
        _stops_with_130(demo)
        deadline = time.monotonic() + 5
        while any(companion_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in children if companion_running(pid)] == []
        # each child is signalled once: by the terminal (it stops on its own, 130), or, when
        # only the demo got SIGINT, by the demo's SIGTERM (0); never a second signal (143)
        exited = dict(re.findall(r"companion_process_exited .*?pid=(\d+) status=(-?\d+)", demo.stderr()))
        assert sorted(map(int, exited)) == sorted(children), demo.stderr()
        assert set(exited.values()) == {"130" if whole_group else "0"}, demo.stderr()
        assert "companion_process_killed" not in demo.stderr()
