"""Start-up: spawn -> first connection for ``companion run CARD --no-mdns``, against a bare py-libp2p
node process measured in the same run; and spawn -> exit of ``companion --help``.

A listener (a bare py-libp2p host in this process, 127.0.0.1) notes the moment each dialling
peer's connection is up (security and muxer negotiated). Each run spawns a process told to dial
it: ``companion run CARD --no-mdns --peer LISTENER`` (the offline scripted model, a fresh data
directory), or this script's ``--bare-node LISTENER`` (py-libp2p alone: import, key, host, dial),
alternately, so both see the same machine; one untimed warm-up run of each first. Children run
without ``PYTHONDONTWRITEBYTECODE``: an installed package has its modules compiled (without
them, every start compiles the package's ~90 modules from source; a third kind of run shows that
cost: ``companion run`` with ``PYTHONDONTWRITEBYTECODE=1``, as this machine sets it). Printed: the
median and spread of several runs, the ratio companion/bare, the CPU time each process had used
by then (from ``/proc``: less sensitive to a loaded machine than the wall clock), ``--help``,
and interpreters that only import what each kind of start imports before it dials (what is
py-libp2p's and what is the package's).

    python scripts/bench_startup.py [--runs 5] [--card cards/juniper.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def bare_node(peer: str) -> None:
    """The reference process: a bare py-libp2p host that dials ``peer`` and waits to be stopped."""
    import multiaddr
    import trio
    from libp2p.peer.peerinfo import info_from_p2p_addr

    sys.path.insert(0, str(HERE))
    from bench_support import bare_host  # py-libp2p only: nothing of the package

    async def main() -> None:
        host = bare_host()
        async with host.run(listen_addrs=host.get_addrs() or []):
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(peer)))
            await trio.sleep_forever()

    trio.run(main)


_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""Children may write and read compiled modules, as an installed package has them (pip compiles
on install; an editable checkout does on its first run, which :func:`measure` makes untimed)."""


def _spawn(argv: list[str], env: dict[str, str] = _ENV) -> subprocess.Popen[bytes]:
    out = subprocess.DEVNULL
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    from bench_support import stop_process

    stop_process(proc)


async def measure(card: Path, runs: int, timeout: float) -> dict[str, list[float]]:
    import trio

    sys.path.insert(0, str(HERE))
    from bench_support import bare_host, cpu_seconds

    listener = bare_host()
    kinds = ("bare", "companion", "uncompiled")
    out: dict[str, list[float]] = {k: [] for kind in kinds for k in (kind, f"{kind}_cpu")}
    async with listener.run(listen_addrs=[__import__("multiaddr").Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        addr = f"{listener.get_addrs()[0]}/p2p/{listener.get_id()}"
        network = listener.get_network()
        with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
            for n in range(-1, runs):  # run -1 warms up (compiled modules, the page cache): untimed
                for kind in kinds:
                    before = set(network.connections)
                    if kind == "bare":
                        argv = [sys.executable, str(Path(__file__).resolve()), "--bare-node", addr]
                    else:
                        data = Path(tmp) / f"data-{kind}-{n}"
                        argv = [sys.executable, "-m", "companion", "run", str(card), "--no-mdns"]
                        argv += ["--listen", "/ip4/127.0.0.1/tcp/0", "--peer", addr, "--data-dir", str(data)]
                    env = {**_ENV, "PYTHONDONTWRITEBYTECODE": "1"} if kind == "uncompiled" else _ENV
                    start = time.monotonic()
                    proc = _spawn(argv, env)
                    try:
                        with trio.fail_after(timeout):
                            while not set(network.connections) - before:
                                await trio.sleep(0.002)
                        elapsed, cpu = time.monotonic() - start, cpu_seconds(proc.pid)
                        if n >= 0:
                            out[kind].append(elapsed)
                            out[f"{kind}_cpu"].append(cpu if cpu is not None else float("nan"))
                    finally:
                        _stop(proc)
                    with trio.move_on_after(5):
                        while set(network.connections) - before:
                            await trio.sleep(0.01)
    return out


IMPORTS: dict[str, str] = {
    "python -c pass": "pass",
    "import trio, libp2p (the bare node's)": "import trio, libp2p",
    "imports of companion run before its dial": "import gc; gc.disable(); import companion.cli.run, "
    "companion.app.run, companion.node, companion.node.discovery, companion.app.clients",
}
"""What each start spends on imports alone (spawn -> exit): ours minus libp2p's is the package's.
``companion run`` imports with the cyclic collector paused (companion/app/collector.py), as here.
Each figure includes the interpreter's teardown of what it imported, so ``import trio, libp2p``
takes longer than the bare node's whole spawn -> first connection, which never exits."""


def help_times(runs: int) -> dict[str, list[float]]:
    """Spawn -> exit of ``companion --help`` and of interpreters that only import (:data:`IMPORTS`)."""
    out: dict[str, list[float]] = {"companion --help": [], **{label: [] for label in IMPORTS}}
    for _ in range(runs):
        commands = [([sys.executable, "-m", "companion", "--help"], out["companion --help"])]
        commands += [([sys.executable, "-c", code], out[label]) for label, code in IMPORTS.items()]
        for argv, into in commands:
            start = time.monotonic()
            subprocess.run(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60, env=_ENV
            )
            into.append(time.monotonic() - start)
    return out


def _row(label: str, values: list[float]) -> float:
    median = statistics.median(values)
    spread = f"min {min(values):6.3f}  max {max(values):6.3f}"
    print(f"  {label:<42} median {median:6.3f} s  {spread}  (n={len(values)})")
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--card", type=Path, default=HERE.parent / "cards" / "juniper.yaml")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--bare-node", metavar="MULTIADDR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_node:
        bare_node(args.bare_node)
        return 0
    import logging

    import trio

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)  # the listener's notes on closed peers
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[0]} ({args.runs} runs each, alternating)")
    times: dict[str, Any] = trio.run(measure, args.card, args.runs, args.timeout)
    print("spawn -> first connection:")
    companion = _row("companion run CARD --no-mdns", times["companion"])
    bare = _row("bare py-libp2p node", times["bare"])
    print(f"  ratio companion/bare: {companion / bare:.2f}x   (goal: companion <= 0.8 s)")
    _row("the same, PYTHONDONTWRITEBYTECODE=1", times["uncompiled"])
    print("CPU seconds used by the process by its first connection:")
    companion_cpu = _row("companion run CARD --no-mdns", times["companion_cpu"])
    bare_cpu = _row("bare py-libp2p node", times["bare_cpu"])
    _row("the same, PYTHONDONTWRITEBYTECODE=1", times["uncompiled_cpu"])
    print(f"  ratio companion/bare: {companion_cpu / bare_cpu:.2f}x")
    print("spawn -> exit (imports, then the interpreter's teardown of what they loaded):")
    for label, values in help_times(args.runs).items():
        _row(label, values)
    with open("/proc/loadavg") as f:
        print(f"load average at end: {f.read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
