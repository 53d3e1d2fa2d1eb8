"""A listen address that is already taken, as a user meets it: another program holds the port
on 127.0.0.1 and the user starts a command on it. Every command refuses with one line naming
the address (exit 2) and no traceback, before any peer id is printed (``run --ws`` takes the
bridge's address before any node starts)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cli import run_companion

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on (this test's own socket)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["run", "pim", "--no-mdns"], "--listen"),
        (["run", "pim", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0"], "--ws"),
        (["bridge", "--no-mdns", "--ws", "127.0.0.1:0"], "--listen"),
        (["bridge", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0"], "--ws"),
        (["relay"], "--listen"),
    ],
)
def test_an_address_in_use_is_an_error_naming_it(
    command: list[str], flag: str, taken_port: int, tmp_path: Path
) -> None:
    address = f"/ip4/127.0.0.1/tcp/{taken_port}" if flag == "--listen" else f"127.0.0.1:{taken_port}"
    args = [*command, flag, address, "--data-dir", str(tmp_path / "data")]
    done = run_companion(args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    refusal = done.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"companion {command[0]}: cannot listen on {address} ({flag}): ")
    assert "already in use" in refusal and "Traceback" not in done.stderr
    assert " peer 12D3KooW" not in done.stdout  # it never claimed to run
