"""What presence costs an idle network: no pass/fail, just numbers.

For each size (10 and 30 node processes by default) it starts one companion node per process,
each given only the first node's address (``--peer HUB``), waits until every directory holds
every companion, lets the connection bound settle, and then measures an idle spell: CPU per
node (% of one core), presence traffic per node (announcement bytes published, and received by
its validator: each message once, so copies from several mesh peers are not counted),
connections per node, and what each node's pubsub sent per second (writes, announcements
forwarded, gossipsub control). The same network with presence off (``NodeConfig(presence=False)``) is
the reference, measured in the same run: its directories are not full (that is the point),
but its idle cost is what the rest of the node costs.

    python scripts/bench_presence.py                    # 10 and 30 nodes, about 4 minutes
    python scripts/bench_presence.py --sizes 10 --idle 20
    BENCH_NODE_CONFIG='{"presence_interval": 20, "presence_ttl": 60}' python scripts/bench_presence.py

Each node is this script in ``--worker`` mode, started and stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the support package

WORKER_LIFETIME = 900.0
"""A worker never outlives a forgotten benchmark."""
START_TIMEOUT = 120.0
FULL_TIMEOUT = 60.0
SENT_KINDS = ("writes", "rpcs", "publish:companion-presence/1", "ihave", "iwant", "graft", "prune")
"""What the node's pubsub wrote (``stats()["sent"]``): socket writes, RPCs, announcements
forwarded or published, and gossipsub's control entries (an idle node's CPU goes mostly to
its writes)."""
SETTLE = 15.0
"""Seconds after every directory is full before measuring: the trim grace (10 s) and a margin."""


# --- worker: one node process ---------------------------------------------------------------------


def worker(index: int, peers: list[str], presence: bool) -> None:
    import trio

    from companion.log import configure_logging
    from companion.memory import Inbound
    from companion.node import CompanionNode, NodeConfig
    from companion.protocol import Metadata
    from support.commands import serve_commands

    configure_logging("WARNING")
    me = f"companion_bench{index:02d}"
    metadata = Metadata(
        id=me, name=f"Bench {index}", personality="patient", story="a benchmark node", sample="hello"
    )
    overrides = json.loads(os.environ.get("BENCH_NODE_CONFIG", "{}"))
    config = NodeConfig(
        listen=("/ip4/127.0.0.1/tcp/0",), peers=peers, name=me, presence=presence, **overrides
    )
    node = CompanionNode(metadata, config)

    def emit(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, "node": index, **fields}), flush=True)

    class Nobody:
        async def handle(self, inbound: Inbound) -> None:
            return None

    async def command(sent: dict[str, Any]) -> None:
        if sent["op"] == "sample":
            emit("sample", cpu=time.process_time(), wall=time.monotonic(), stats=node.stats())

    async def main() -> None:
        with trio.fail_after(WORKER_LIFETIME):
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run, Nobody())
                emit("started", addr=node.listen_addrs[0])
                node.add_membership_listener(lambda e: emit("members", count=len(node.directory)))
                emit("members", count=len(node.directory))
                await serve_commands(command)
                nursery.cancel_scope.cancel()

    trio.run(main)


# --- driver -------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, index: int, peers: list[str], presence: bool) -> None:
        self.index = index
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        argv = [
            sys.executable,
            __file__,
            "--worker",
            str(index),
            *(["--no-presence"] if not presence else []),
        ]
        for peer in peers:
            argv += ["--peer", peer]
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.events.append(event)
                self.cond.notify_all()

    def last(self, name: str) -> dict[str, Any] | None:
        with self.cond:
            return next((e for e in reversed(self.events) if e["event"] == name), None)

    def wait(self, name: str, timeout: float, after: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [e for e in self.events[after:] if e["event"] == name]
                if found:
                    return found[-1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"node {self.index}: no {name} within {timeout} s")
                self.cond.wait(left)

    def sample(self) -> dict[str, Any]:
        with self.cond:
            mark = len(self.events)
        assert self.popen.stdin is not None
        self.popen.stdin.write('{"op": "sample"}\n')
        self.popen.stdin.flush()
        event = self.wait("sample", 30, after=mark)
        return event

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


def run_case(size: int, presence: bool, idle: float) -> dict[str, Any]:
    workers: list[Worker] = []
    try:
        workers.append(Worker(0, [], presence))
        hub = workers[0].wait("started", START_TIMEOUT)["addr"]
        workers += [Worker(i, [hub], presence) for i in range(1, size)]
        for w in workers:
            w.wait("started", START_TIMEOUT)
        started = time.monotonic()
        full_after = None
        while time.monotonic() - started < FULL_TIMEOUT:
            if all((w.last("members") or {}).get("count") == size for w in workers):
                full_after = time.monotonic() - started
                break
            time.sleep(0.2)
        time.sleep(SETTLE)
        first = [w.sample() for w in workers]
        time.sleep(idle)
        second = [w.sample() for w in workers]
    finally:
        for w in workers:
            w.stop()
    cpu, pres_in, pres_out, conns, seen, trims = [], [], [], [], [], []
    sent: dict[str, list[float]] = {kind: [] for kind in SENT_KINDS}
    for a, b in zip(first, second, strict=True):
        span = b["wall"] - a["wall"]
        for kind, rates in sent.items():
            rates.append((b["stats"]["sent"].get(kind, 0) - a["stats"]["sent"].get(kind, 0)) / span)
        cpu.append((b["cpu"] - a["cpu"]) / span * 100)
        pres_in.append((b["stats"]["presence_bytes_in"] - a["stats"]["presence_bytes_in"]) / span)
        pres_out.append((b["stats"]["presence_bytes_out"] - a["stats"]["presence_bytes_out"]) / span)
        trims.append(b["stats"].get("trimmed", 0) - a["stats"].get("trimmed", 0))
        conns.append(b["stats"]["connected_peers"])
        seen.append(len(b["stats"]["companions"]))
    return {
        "size": size,
        "presence": presence,
        "full_after": full_after,
        "cpu_pct_mean": statistics.mean(cpu),
        "cpu_pct_max": max(cpu),
        "presence_in_bps": statistics.mean(pres_in),
        "presence_out_bps": statistics.mean(pres_out),
        "trims_during": sum(trims),
        "connections_mean": statistics.mean(conns),
        "connections_max": max(conns),
        "directory_min": min(seen),
        "sent_per_s": {kind: statistics.mean(rates) for kind, rates in sent.items()},
    }


def describe(r: dict[str, Any]) -> str:
    full = f"{r['full_after']:.1f} s" if r["full_after"] is not None else "never"
    return (
        f"{r['size']:>3} nodes, presence {'on ' if r['presence'] else 'off'}: directories full after {full}, "
        f"smallest {r['directory_min']}; idle CPU per node {r['cpu_pct_mean']:.2f} % of a core "
        f"(max {r['cpu_pct_max']:.2f}); presence in {r['presence_in_bps']:.0f} B/s, out "
        f"{r['presence_out_bps']:.0f} B/s per node; connections {r['connections_mean']:.1f} "
        f"(max {r['connections_max']}), {r['trims_during']} trimmed while measuring\n"
        "      pubsub sent per node per second: "
        + ", ".join(f"{kind} {rate:.2f}" for kind, rate in r["sent_per_s"].items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--no-presence", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured (default 30)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.peer, not args.no_presence)
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    for size in args.sizes:
        results = [run_case(size, presence, args.idle) for presence in (False, True)]
        for result in results:
            print(describe(result), flush=True)
        off, on = results
        if off["cpu_pct_mean"] > 0:
            print(
                f"{size:>3} nodes: presence on / off idle CPU {on['cpu_pct_mean'] / off['cpu_pct_mean']:.2f}x"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
