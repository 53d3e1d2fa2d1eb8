"""What ``companion run`` prints on standard error while it runs, as a person at a terminal sees
it: warnings and errors only by default, every event with ``-v``; a bootstrap peer that is down
shows once, as a warning that says why (py-libp2p's own ERROR for each failed dial is left out),
and nothing comes as Python's bare last-resort lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.cli import started_companion

pytestmark = pytest.mark.integration

DOWN_PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWM4CYuemtu2TXBUDyT2acQyns7FAgERURHpFKcLRHG4wU"
LINE = re.compile(r"^\d\d:\d\d:\d\d (debug|info|warning|error|critical) +\S+")


def _stderr_of_run(tmp_path: Path, *flags: str) -> list[str]:
    args = ["run", "pim", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--peer", DOWN_PEER]
    args += ["--data-dir", str(tmp_path / "data"), *flags]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "logs") as run:
        assert run.wait_for_output("companion_pim sees ", 60), run.stderr()
        down = run.wait_for_stderr(" bootstrap_dial_failed ", 30)
        run.ctrl_c()
        assert run.process.wait(timeout=20) == 130
        lines = [line for line in run.stderr().splitlines() if line.strip()]
    assert down, lines
    assert [line for line in lines if not LINE.match(line)] == []  # no bare py-libp2p lines
    (warning,) = [line for line in lines if " bootstrap_dial_failed " in line and " warning " in line]
    assert "Connection refused" in warning, warning
    assert [line for line in lines if " libp2p message=" in line] == []
    return lines


def test_run_logs_warnings_only_by_default(tmp_path: Path) -> None:
    lines = _stderr_of_run(tmp_path)
    assert [line for line in lines if line.split()[1] in ("debug", "info")] == []


def test_dash_v_logs_every_event(tmp_path: Path) -> None:
    lines = _stderr_of_run(tmp_path, "-v")
    assert any(line.split()[1:3] == ["info", "started"] for line in lines)
    assert not any(line.split()[1] == "debug" for line in lines)
