"""`companion listen` as a person runs it against a `companion bridge` process: on a
pseudo-terminal, with the bridge and a raw peer claiming companion_juniper beside it."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import trio

from support.live_bridge import blocking, start_bridge
from support.network import Network, Proc


class PtyListener:
    """``companion listen`` with its standard output on a pseudo-terminal (120 columns); the
    bytes it writes are collected as they come. ``keyboard``: its standard input is the same
    terminal, as when a person runs it (:meth:`type` is the person typing); else a pipe.
    Stopped by its PID."""

    def __init__(self, argv: list[str], *, keyboard: bool = False) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.popen = subprocess.Popen(
            argv,
            stdin=slave if keyboard else subprocess.PIPE,
            stdout=slave,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return  # the child closed the terminal
            if not chunk:
                return
            with self._lock:
                self.output += chunk

    def text(self) -> str:
        with self._lock:
            return self.output.decode("utf-8", "replace")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode("utf-8"))

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        os.close(self.master)


async def until(what: str, check: object, timeout: float) -> None:
    """Wait (bounded) until ``check()`` is true."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await trio.sleep(0.05)


async def bridge_with_juniper(net: Network) -> tuple[Proc, int, Proc]:
    """A ``companion bridge`` process and a raw libp2p peer claiming companion_juniper connected
    to it: (bridge, its WebSocket port, the raw peer)."""
    bridge, port, started = await blocking(start_bridge, net, "bridge")
    raw, _ = await blocking(net.raw, "juniper")
    raw.send({"op": "connect", "addr": started["addrs"][0]})
    await blocking(raw.event, "connected", 15)
    await blocking(bridge.event, "companion_joined", 30, companion_id="companion_juniper")
    return bridge, port, raw


def listen_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "companion",
        "listen",
        "--ws",
        f"ws://127.0.0.1:{port}/",
        "--as",
        "user_mika",
    ]
