"""Network figures for companion nodes on loopback: no pass/fail, just numbers.

For 2 and for 10 node processes (a full mesh through ``--peer``-style bootstrap addresses) it
prints: start-up to first connection, publish-to-delivery latency p50/p99 at a steady rate,
loss, and CPU per message (all processes together, and per receiving process). ``--idle S``
adds, per node count, the CPU each node spends in ``S`` seconds of an idle network (connected,
nothing published), as a percentage of one core.

    python scripts/bench_network.py                 # both cases, about a minute
    python scripts/bench_network.py --nodes 10 --rate 10 --seconds 10
    python scripts/bench_network.py --nodes 10 --idle 30 --seconds 0   # idle CPU only
    BENCH_DEBUG=1 BENCH_NODE_CONFIG='{"health_check_interval": 60}' python scripts/bench_network.py

``BENCH_NODE_CONFIG`` overrides NodeConfig fields on every node; ``BENCH_DEBUG`` prints each
node's received count, mesh size and drops.

Each node is this script in ``--worker`` mode, started and stopped by PID. Latency is receive
wall time minus the send wall time carried in the message (one machine, one clock).
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

from bench_support import percentile

WORKER_DEADLINE = 60.0


# --- worker: one node process -------------------------------------------------------------------


def worker(index: int, spawned: float, peers: list[str]) -> None:
    import trio

    from companion.log import configure_logging
    from companion.node import CompanionNode, NodeConfig
    from companion.protocol import MESSAGES, Message, Metadata
    from companion.transport import Inbound

    configure_logging("WARNING")
    me = f"companion_bench{index}"
    metadata = Metadata(id=me, name=me, personality="bench", story="bench", sample="bench")
    overrides = json.loads(os.environ.get("BENCH_NODE_CONFIG", "{}"))  # e.g. {"health_check_interval": 10}
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), peers=peers, name=me, **overrides)
    node = CompanionNode(metadata, config)
    latencies: list[float] = []
    seen: set[int] = set()

    def emit(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, "node": index, **fields}), flush=True)

    class Receiver:
        async def handle(self, inbound: Inbound) -> None:
            payload = inbound.payload
            if inbound.sender_peer == node.peer_id or not isinstance(payload, Message):
                return
            body = json.loads(payload.params.message)
            if body.get("kind") == "warm":
                emit("warm", seq=body["seq"])
            elif body.get("seq") not in seen:
                seen.add(body["seq"])
                latencies.append(time.time() - body["t"])

    async def first_connection() -> None:
        if await node.wait_for(lambda: bool(node.connected_peers), WORKER_DEADLINE):
            emit("first_connection", after=time.time() - spawned)

    async def blast(rate: float, count: int) -> None:
        start = trio.current_time()
        for seq in range(count):
            await trio.sleep_until(start + seq / rate)
            text = json.dumps({"seq": seq, "t": time.time()})
            await node.publish(MESSAGES, Message.create(me, [], text))
        emit("blasted", count=count)

    async def commands(nursery: trio.Nursery) -> None:
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        buffer = b""
        cpu_start = time.process_time()
        control_start: dict[str, int] = {}
        while True:
            chunk = await stdin.receive_some(65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command = json.loads(line)
                if command["op"] == "warm":
                    text = json.dumps({"kind": "warm", "seq": command["seq"]})
                    await node.publish(MESSAGES, Message.create(me, [], text))
                elif command["op"] == "begin":
                    cpu_start = time.process_time()
                    control_start = dict(node.stats()["control"])
                    latencies.clear()
                    seen.clear()
                elif command["op"] == "blast":
                    nursery.start_soon(blast, float(command["rate"]), int(command["count"]))
                elif command["op"] == "report":
                    emit(
                        "report",
                        latencies=latencies,
                        cpu=time.process_time() - cpu_start,
                        stats=(stats := node.stats()),
                        control={k: v - control_start.get(k, 0) for k, v in stats["control"].items()},
                        mesh=len(node._pubsub.router.mesh.get("messages", ())) if node._pubsub else -1,
                    )

    async def main() -> None:
        with trio.fail_after(600):  # a worker never outlives a forgotten benchmark
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run, Receiver())
                emit("started", addr=node.listen_addrs[0], after=time.time() - spawned)
                nursery.start_soon(first_connection)
                node.add_membership_listener(lambda e: emit("members", count=len(node.directory)))
                await commands(nursery)
                nursery.cancel_scope.cancel()

    trio.run(main)


# --- driver ---------------------------------------------------------------------------------------


class Worker:
    def __init__(self, index: int, peers: list[str]) -> None:
        self.index = index
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        argv = [sys.executable, __file__, "--worker", str(index), "--spawned", repr(time.time())]
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

    def wait(self, name: str, timeout: float, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for event in reversed(self.events):
                    if event["event"] == name and all(event.get(k) == v for k, v in fields.items()):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"node {self.index}: no {name} {fields} within {timeout} s")
                self.cond.wait(left)

    def wait_after(self, name: str, mark: int, timeout: float) -> dict[str, Any]:
        """The first ``name`` event after the first ``mark`` events."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for event in self.events[mark:]:
                    if event["event"] == name:
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"node {self.index}: no {name} within {timeout} s")
                self.cond.wait(left)

    def has(self, name: str, **fields: Any) -> bool:
        with self.cond:
            return any(
                e["event"] == name and all(e.get(k) == v for k, v in fields.items()) for e in self.events
            )

    def send(self, command: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


def start_network(nodes: int) -> list[Worker]:
    """``nodes`` workers, each bootstrapped to every earlier one (a full mesh), all seeing each
    other; the caller stops them."""
    workers: list[Worker] = []
    for i in range(nodes):
        workers.append(Worker(i, [w.wait("started", 60)["addr"] for w in workers]))
    for w in workers:
        w.wait("started", 60)
    deadline = time.monotonic() + 60
    while not all(w.has("members", count=nodes) for w in workers):
        if time.monotonic() > deadline:
            raise TimeoutError("the nodes did not all see each other within 60 s")
        time.sleep(0.05)
    return workers


def report_all(workers: list[Worker]) -> list[dict[str, Any]]:
    marks = [len(w.events) for w in workers]
    for w in workers:
        w.send({"op": "report"})
    return [w.wait_after("report", mark, 30) for w, mark in zip(workers, marks, strict=True)]


def drained(
    workers: list[Worker], expected: int, quiet: float = 2.0, limit: float = 30.0
) -> list[dict[str, Any]]:
    """Reports once deliveries stop: nothing new for ``quiet`` seconds, or all ``expected`` in,
    or ``limit`` seconds (a late message counts as delivered, with its latency; a missing one
    as lost)."""
    deadline = time.monotonic() + limit
    reports = report_all(workers)
    delivered = sum(len(r["latencies"]) for r in reports)
    while delivered < expected and time.monotonic() < deadline:
        time.sleep(quiet)
        reports = report_all(workers)
        now = sum(len(r["latencies"]) for r in reports)
        if now == delivered:
            break
        delivered = now
    return reports


def run_case(nodes: int, rate: float, seconds: float) -> dict[str, Any]:
    workers: list[Worker] = []
    try:
        workers = start_network(nodes)
        first = [w.wait("first_connection", 30)["after"] for w in workers[1:]]
        # warm up until every receiver got one message through the mesh (bounded)
        publisher, receivers = workers[0], workers[1:]
        for seq in range(100):
            publisher.send({"op": "warm", "seq": seq})
            time.sleep(0.1)
            if all(w.has("warm") for w in receivers):
                break
        for w in workers:
            w.send({"op": "begin"})
        count = int(rate * seconds)
        publisher.send({"op": "blast", "rate": rate, "count": count})
        publisher.wait("blasted", seconds + 30)
        reports = drained(workers, count * (nodes - 1))
    finally:
        for w in workers:
            w.stop()
    latencies = [x for r in reports[1:] for x in r["latencies"]]
    if os.environ.get("BENCH_DEBUG"):
        for r in reports:
            print(r["node"], len(r["latencies"]), "mesh", r["mesh"], r["stats"]["drops"], file=sys.stderr)
    expected = count * (nodes - 1)
    cpu_total = sum(r["cpu"] for r in reports)
    return {
        "nodes": nodes,
        "rate": rate,
        "messages": count,
        "first_connection_median_s": statistics.median(first),
        "first_connection_max_s": max(first),
        "delivered": len(latencies),
        "expected": expected,
        "loss": 1 - len(latencies) / expected,
        "p50_ms": percentile(latencies, 0.5) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else None,
        "cpu_ms_per_message_all_nodes": cpu_total / count * 1000,
        "cpu_ms_per_message_per_receiver": statistics.mean(r["cpu"] for r in reports[1:]) / count * 1000,
    }


def idle_case(nodes: int, seconds: float, settle: float = 5.0) -> dict[str, Any]:
    """CPU per node of a connected network that publishes nothing, after ``settle`` seconds."""
    workers: list[Worker] = []
    try:
        workers = start_network(nodes)
        time.sleep(settle)  # identify, metadata, subscriptions and the first GRAFTs are done
        for w in workers:
            w.send({"op": "begin"})
        time.sleep(seconds)
        reports = report_all(workers)
    finally:
        for w in workers:
            w.stop()
    percent = [r["cpu"] / seconds * 100 for r in reports]
    return {
        "nodes": nodes,
        "idle_seconds": seconds,
        "idle_cpu_percent_mean": statistics.mean(percent),
        "idle_cpu_percent_max": max(percent),
        "disconnects": sum(sum(r["stats"]["disconnects"].values()) for r in reports),
        "prunes_per_node_per_minute": statistics.mean(r["control"].get("prune_received", 0) for r in reports)
        * 60
        / seconds,
        "mesh_sizes": sorted(r["mesh"] for r in reports),
    }


def describe(result: dict[str, Any]) -> str:
    p50 = "-" if result["p50_ms"] is None else f"{result['p50_ms']:.1f}"
    p99 = "-" if result["p99_ms"] is None else f"{result['p99_ms']:.1f}"
    return (
        f"{result['nodes']:>3} nodes  {result['rate']:>5.0f} msg/s  {result['messages']:>4} msgs  "
        f"first connection {result['first_connection_median_s']:.2f} s "
        f"(max {result['first_connection_max_s']:.2f})  "
        f"latency p50 {p50} ms  p99 {p99} ms  "
        f"loss {result['loss'] * 100:.1f}% ({result['delivered']}/{result['expected']})  "
        f"CPU/msg {result['cpu_ms_per_message_all_nodes']:.2f} ms all nodes, "
        f"{result['cpu_ms_per_message_per_receiver']:.2f} ms per receiver"
    )


def describe_idle(result: dict[str, Any]) -> str:
    return (
        f"{result['nodes']:>3} nodes  idle {result['idle_seconds']:.0f} s  "
        f"CPU per node {result['idle_cpu_percent_mean']:.3f} % of a core "
        f"(max {result['idle_cpu_percent_max']:.3f} %)  disconnects {result['disconnects']}  "
        f"PRUNEs {result['prunes_per_node_per_minute']:.1f} per node per minute  mesh {result['mesh_sizes']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--peer", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, action="append", help="node counts (default: 2 and 10)")
    parser.add_argument(
        "--rate", type=float, default=None, help="messages per second (default: 50 for 2 nodes, 5 for more)"
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="publishing time (default: 6 / 10; 0: no publishing case)"
    )
    parser.add_argument("--idle", type=float, default=0.0, help="also measure S seconds of idle CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object per case")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.spawned, args.peer)
        return 0
    for nodes in args.nodes or [2, 10]:
        rate = args.rate or (50.0 if nodes <= 2 else 5.0)
        seconds = (6.0 if nodes <= 2 else 10.0) if args.seconds is None else args.seconds
        if seconds > 0:
            result = run_case(nodes, rate, seconds)
            print(json.dumps(result) if args.json else describe(result), flush=True)
        if args.idle > 0:
            idle = idle_case(nodes, args.idle)
            print(json.dumps(idle) if args.json else describe_idle(idle), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
