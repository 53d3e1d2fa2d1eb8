"""What the benchmark scripts share: percentiles, readings of a process from ``/proc``, stopping
one by its PID, and a bare py-libp2p gossipsub peer, the reference the project's node is measured against.

The bare peer is py-libp2p 0.8.1 with nothing of the project on top: TCP, Noise, Yamux and
gossipsub with the project's gossipsub parameters (so a ratio against it shows what the node
adds: health checks, the DHT, membership, validation, the engine, the store, logging), and
js-libp2p's message ids (so it gossips with the project's nodes without duplicates). No health
monitoring, no metadata protocol, no validators.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "bare_host",
    "bare_pubsub",
    "cpu_seconds",
    "data_bytes",
    "exit_on_sigterm",
    "fd_count",
    "free_port",
    "machine",
    "percentile",
    "rss_bytes",
    "stop_process",
    "thread_count",
]

_TICKS = os.sysconf("SC_CLK_TCK")


def machine() -> str:
    """The machine a figure was measured on: its cores, its CPU's model name and its load now.
    A real model's timings, and the ratios between them, move with the CPU: SmolLM2's first
    words / whole line went from 0.60 to 0.63 between two 2-core machines (docs/figures.md)."""
    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return f"{os.cpu_count()} cores ({name}), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def free_port() -> int:
    """A loopback TCP port nothing listens on now, for a server the bench starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stop ``proc`` by its PID: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def exit_on_sigterm() -> None:
    """Make SIGTERM end this benchmark with ``SystemExit``: its ``finally`` blocks run, so the
    processes it started (a model server, companions) are stopped by their PIDs too. Without
    it a benchmark stopped by its PID left its llama-cpp-python server running (3.4 GB). Inside
    a trio run the exit is abrupt (trio warns of a run abandoned), but the children go."""

    def stop(signum: int, _frame: object) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of a non-empty sample."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU of a process, all its threads (``/proc/PID/stat``); ``None`` once
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15)


def _status(pid: int, field: str) -> int | None:
    """The number after ``field:`` in ``/proc/PID/status``; ``None`` once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (``VmRSS``); ``None`` once gone."""
    kib = _status(pid, "VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes(pid: int) -> int | None:
    """The most resident memory a process has held (``VmHWM``); ``None`` once gone."""
    kib = _status(pid, "VmHWM")
    return None if kib is None else kib * 1024


def thread_count(pid: int) -> int | None:
    """Threads of a process (``Threads``); ``None`` once gone."""
    return _status(pid, "Threads")


def fd_count(pid: int) -> int | None:
    """Open file descriptors of a process (entries of ``/proc/PID/fd``); ``None`` once gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def data_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder`` (0 when missing); files that vanish while it is
    walked (a SQLite journal) are skipped."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def bare_host(listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",), key_pair: Any = None) -> Any:
    """A py-libp2p host (TCP, Noise, Yamux, ``key_pair`` or a fresh key) with py-libp2p's
    connection defaults."""
    import multiaddr
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
    from libp2p.network import swarm
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE
    from libp2p.security.noise.transport import Transport as NoiseTransport

    swarm._HAPPY_EYEBALLS_DELAY = 0  # as the project's node does: no 250 ms wait per dial
    key_pair = key_pair or create_new_key_pair()
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE: noise},
        muxer_preference="YAMUX",
        listen_addrs=[multiaddr.Multiaddr(a) for a in listen],
    )


def bare_pubsub(host: Any, config: Any = None) -> tuple[Any, Any]:
    """``(pubsub, router)`` for ``host``: strict signing, the gossipsub parameters of ``config``
    (a ``NodeConfig``; default: the project's)."""
    from libp2p.pubsub.pubsub import Pubsub

    from companion.node.config import NodeConfig, make_gossipsub
    from companion.node.msgid import js_message_id

    router = make_gossipsub(config or NodeConfig())
    return Pubsub(host, router, strict_signing=True, msg_id_constructor=js_message_id), router
