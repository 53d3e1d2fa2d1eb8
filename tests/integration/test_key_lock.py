"""One process per node key: a second ``companion bridge`` or ``companion relay`` on a data
directory whose key a running one holds would be the same peer id twice on the network. It is
refused at once, exit 2, naming the process that holds it; the first goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import started_companion

pytestmark = pytest.mark.integration

READY_WITHIN = 60.0
LISTEN = ("--listen", "/ip4/127.0.0.1/tcp/0")


@pytest.mark.parametrize(
    ("command", "ready", "lock"),
    [
        (
            ["bridge", "--no-mdns", "--ws", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0"],
            "ws://",
            "bridge",
        ),
        (["relay", "--listen", "/ip4/127.0.0.1/tcp/0"], "relay peer ", "relay"),
    ],
    ids=["bridge", "relay"],
)
def test_a_second_process_on_a_held_key_exits_2_and_the_first_goes_on(
    command: list[str], ready: str, lock: str, tmp_path: Path
) -> None:
    args = [*command, "--data-dir", str(tmp_path / "data")]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "first") as first:
        assert first.wait_for_output(ready, READY_WITHIN), first.stderr()
        second = subprocess.run(
            [sys.executable, "-m", "companion", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert second.returncode == 2, second.stderr
        said = [line for line in second.stderr.splitlines() if "in use" in line]
        assert len(said) == 1, second.stderr
        assert f"in use by process {first.process.pid}" in said[0]
        assert f"companion {lock} is running there already" in said[0]
        assert "Traceback" not in second.stderr
        assert first.process.poll() is None  # the first goes on
        assert (tmp_path / "data" / "keys" / f"{lock}.lock").exists()
