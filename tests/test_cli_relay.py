"""``companion relay`` as a user runs it: a separate process that prints its peer id and
addresses, answers SIGUSR1 with stats, and exits 130 on Ctrl-C (SIGINT) and 0 on SIGTERM, without
a traceback; a bad flag is one line and exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from companion.app.lines import RELAY_LINE


def start(tmp: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "companion.cli.relay", "--listen", "/ip4/127.0.0.1/tcp/0"]
    argv += ["--data-dir", str(tmp), "--log-format", "json"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_lines(proc: subprocess.Popen[str], count: int, timeout: float) -> list[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while len(lines) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    return lines


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_relay_prints_its_address_and_stops_cleanly(tmp_path: Path, signum: int, code: int) -> None:
    proc = start(tmp_path)
    try:
        head, addr = first_lines(proc, 2, 30)
        assert head.startswith(RELAY_LINE)
        peer_id = head[len(RELAY_LINE) :]
        assert addr.startswith("  /ip4/127.0.0.1/tcp/") and addr.endswith(f"/p2p/{peer_id}")
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == code
    assert "Traceback" not in err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "stats" in names and names[-1] == "stopped"
    # the key was created once; a restart keeps the peer id
    assert (tmp_path / "keys" / "relay.key").exists()


def test_bad_max_reservations_is_one_line_and_exit_2(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "companion.cli.relay",
        "--max-reservations",
        "0",
        "--data-dir",
        str(tmp_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "companion relay: --max-reservations must be at least 1"
