"""Gossip figures on loopback for three implementations side by side: no pass/fail, just numbers.

Implementations (``--impl``, default all three, measured in the same run, one after the other
for each network shape):

- ``companion``: the project's node (``CompanionNode``: health checks, DHT, membership, the edge's
  validation and replay guard), one process per node, ``max_connections`` set to the
  topology's neighbour count so discovery adds no connections;
- ``bare``: py-libp2p 0.8.1 alone (``bench_support.bare_host`` / ``bare_pubsub``: TCP, Noise,
  Yamux, gossipsub with the project's gossipsub parameters and js-libp2p's message ids), one
  process per node: what the project's node adds on top of the library;
- ``js``: the JavaScript peer of ``tests/js`` (js-libp2p 2.9 as aikyo 1.6 configures it:
  gossipsub + identify), one ``node`` process per node: the reference.

Topologies (``--topology``, default both): ``mesh``, every node dials every earlier one;
``sparse``, a ring plus chords, node i dials i+1 and i+K (mod N, K about N/3) so each node has
4 neighbours (with 5 nodes or fewer this is the full mesh). The same dials for every
implementation, sent once all nodes listen.

For each (implementation, topology, node count) one network is started, warmed up (until one
message reached every node) and left to settle ``--settle`` seconds (default 5, for every
implementation: the project's node announces itself and bootstraps its DHT in its first
seconds; ``--settle 0`` measures through that); then, for each rate,
node 0 publishes ``rate x seconds`` aikyo ``message.send`` envelopes on ``messages`` (the same
bytes for all three, the text a JSON ``{"bench", "run", "seq", "t"}``) and every other node
records, per message, its arrival wall clock minus ``t`` (one machine, one clock). After the
publishing, reports are drained until every message arrived, nothing new came for 2 s, or 30 s
passed. Figures per case:

- ``p50`` / ``p99``: latency of the delivered messages over all receivers (nearest rank), ms;
- ``loss``: 1 - delivered / (messages x receivers), after the drain;
- ``CPU/msg``: CPU (user + system, all threads, /proc/PID/stat) of all the network's processes
  from the start of publishing to the last report, divided by the messages published, ms; and
  the same per receiving process;
- ``start``: spawn -> listening, median over the nodes, s; ``conn``: connections per node at the
  last report (min-max), ``mesh``: gossipsub mesh peers on ``messages`` (min-max); RSS per node.

For each (topology, nodes, rate) the ratios companion/js and companion/bare of p99 and of CPU
per message follow, and at the end one line says whether the goals of issue 12 held: no loss
at 20 msg/s with 10 nodes (companion, each topology), and companion p99 <= 2 x js p99 in every
case measured for both.

``--idle S`` adds, for each network, the CPU each node spends in S seconds of an idle network
(connected, nothing published, after 5 s of settling), in % of one core; for the project's node
also the connections lost and the PRUNEs received per node per minute in that time (a churning
mesh shows there). ``disconnects`` / ``dropped`` on a publishing line: the project's node's
connections lost and payloads it dropped, all nodes, since start, with the count per reason
(``replay``: a copy of a message already handled, ``outbound_queue_full``: a peer's send queue
was full, ...; every reason is in docs/network.md, "What is dropped, and why").

    python scripts/bench_network.py                                 # 36 cases, 12 networks
    python scripts/bench_network.py --nodes 2 --rate 5 --seconds 3  # a short check
    python scripts/bench_network.py --impl companion js --topology sparse --nodes 10 --rate 20
    python scripts/bench_network.py --impl companion --topology mesh --nodes 10 --seconds 0 --idle 30
    BENCH_NODE_CONFIG='{"health_check_interval": 60}' python scripts/bench_network.py --impl companion

``BENCH_NODE_CONFIG`` replaces NodeConfig fields on every companion node (and the gossipsub
parameters of the bare ones); ``BENCH_DEBUG=1`` prints each node's report summary on stderr.

Every node is a child process started by this script and stopped by its PID (``stop`` command,
then SIGTERM, then SIGKILL), however a case ends (an error, Ctrl-C, SIGTERM); every wait has a
deadline. A case that fails prints its error and the figures it had.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_support import bare_host, bare_pubsub, cpu_seconds, percentile, rss_bytes

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("companion", "bare", "js")
TOPOLOGIES = ("mesh", "sparse")
SPARSE_NEIGHBOURS = 4
START_TIMEOUT = 90.0
"""Spawn -> listening, all nodes of a network (ten companions on a loaded 2-core box take ~20 s)."""
DIAL_TIMEOUT = 30.0
WARM_TIMEOUT = 30.0
REPORT_TIMEOUT = 30.0
WORKER_LIFETIME = 1800.0
"""A worker never outlives a forgotten benchmark."""
GOAL_NODES, GOAL_RATE, GOAL_P99_RATIO = 10, 20.0, 2.0


# --- the payload every implementation sends ------------------------------------------------------


def envelope(sender: str, body: dict[str, Any]) -> bytes:
    """An aikyo ``message.send`` envelope carrying ``body`` as its text (as peer.mjs builds it)."""
    import uuid

    text = json.dumps(body, separators=(",", ":"))
    params = {"id": str(uuid.uuid4()), "from": sender, "to": [], "message": text}
    return json.dumps(
        {"jsonrpc": "2.0", "method": "message.send", "params": params}, separators=(",", ":")
    ).encode()


def bench_body(text: str) -> dict[str, Any] | None:
    """The bench body of a message's text, or ``None`` for anything else."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("bench"), str) else None


# --- worker: one Python node process -------------------------------------------------------------


class Recorder:
    """What a Python worker measures: latencies of the current run, deduplicated by seq."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self.emit = emit
        self.run = -1
        self.latencies: list[float] = []
        self.seen: set[int] = set()

    def received(self, text: str) -> None:
        arrived = time.time()
        body = bench_body(text)
        if body is None:
            return
        if body["bench"] == "warm":
            self.emit("bench_warm", seq=body.get("seq"))
        elif body.get("run") == self.run and body.get("seq") not in self.seen:
            self.seen.add(body["seq"])
            self.latencies.append(arrived - float(body["t"]))

    def begin(self, run: int) -> None:
        self.run, self.latencies, self.seen = run, [], set()


def worker(impl: str, index: int, max_connections: int) -> None:
    import trio

    me = f"companion_bench{index}"

    def emit(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, **fields}), flush=True)

    recorder = Recorder(emit)
    node = (
        CompanionNodeUnderTest(me, max_connections, recorder)
        if impl == "companion"
        else BareNodeUnderTest(recorder)
    )

    async def blast(publish: Callable[[bytes], Any], run: int, rate: float, count: int) -> None:
        start = trio.current_time()
        for seq in range(count):
            await trio.sleep_until(start + seq / rate)
            try:
                await publish(envelope(me, {"bench": "data", "run": run, "seq": seq, "t": time.time()}))
            except Exception as exc:  # counted as loss; the run goes on
                emit("error", op="bench_blast", error=f"{type(exc).__name__}: {exc}"[:200])
        emit("bench_blasted", run=run, count=count)

    async def command(nursery: trio.Nursery, line: bytes) -> bool:
        op = "?"
        try:
            cmd = json.loads(line)
            op = str(cmd["op"])
            if op == "dial":
                with trio.fail_after(DIAL_TIMEOUT / 2):
                    await node.dial(cmd["addr"])
                emit("dialled", addr=cmd["addr"])
            elif op == "bench_warm":
                await node.publish(envelope(me, {"bench": "warm", "seq": cmd["seq"], "t": time.time()}))
            elif op == "bench_begin":
                recorder.begin(int(cmd["run"]))
                emit("bench_begun", run=recorder.run)
            elif op == "bench_blast":
                nursery.start_soon(
                    blast, node.publish, int(cmd["run"]), float(cmd["rate"]), int(cmd["count"])
                )
            elif op == "bench_report":
                emit("bench_report", latencies=recorder.latencies, **node.report())
            elif op == "stop":
                return False
        except Exception as exc:
            emit("error", op=op, error=f"{type(exc).__name__}: {exc}"[:200])
        return True

    async def commands(nursery: trio.Nursery) -> None:
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buffer = b""
        while chunk := await stdin.receive_some(65536):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip() and not await command(nursery, line):
                    return

    async def main() -> None:
        with trio.fail_after(WORKER_LIFETIME):
            async with trio.open_nursery() as nursery:
                addr, peer_id = await nursery.start(node.run)
                emit("started", peer_id=peer_id, addrs=[addr])
                await commands(nursery)  # until "stop" or the end of stdin
                nursery.cancel_scope.cancel()

    trio.run(main)


class CompanionNodeUnderTest:
    """The project's node behind the worker's small interface."""

    def __init__(self, me: str, max_connections: int, recorder: Recorder) -> None:
        from companion.log import configure_logging
        from companion.node import CompanionNode, NodeConfig
        from companion.protocol import Metadata

        configure_logging("WARNING")
        metadata = Metadata(id=me, name=me, personality="bench", story="bench", sample="bench")
        overrides = {
            "max_connections": max_connections,
            **json.loads(os.environ.get("BENCH_NODE_CONFIG", "{}")),
        }
        self.node = CompanionNode(metadata, NodeConfig(name=me, **overrides))
        self.recorder = recorder

    async def handle(self, inbound: Any) -> None:
        from companion.protocol import Message

        if inbound.sender_peer != self.node.peer_id and isinstance(inbound.payload, Message):
            self.recorder.received(inbound.payload.params.message)

    async def run(self, task_status: Any) -> None:
        import trio

        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.run, self)
            task_status.started((self.node.listen_addrs[0], self.node.peer_id))
            await trio.sleep_forever()

    async def dial(self, addr: str) -> None:
        await self.node.connect(addr)

    async def publish(self, data: bytes) -> None:
        from companion.protocol import MESSAGES

        await self.node.publish_raw(MESSAGES, data)

    def report(self) -> dict[str, Any]:
        stats = self.node.stats()
        return {
            "connections": stats["connected_peers"],
            "mesh": stats["mesh"].get("messages", 0),
            "disconnects": sum(stats["disconnects"].values()),
            "dropped": stats["dropped"],
            "drops": stats["drops"],
            "disconnect_reasons": stats["disconnects"],
            "prunes": stats["control"].get("prune_received", 0),
        }


class BareNodeUnderTest:
    """py-libp2p host + gossipsub (bench_support) behind the worker's small interface."""

    def __init__(self, recorder: Recorder) -> None:
        from companion.node.config import NodeConfig

        overrides = json.loads(os.environ.get("BENCH_NODE_CONFIG", "{}"))
        self.host = bare_host()
        self.pubsub, self.router = bare_pubsub(self.host, NodeConfig(**overrides))
        self.recorder = recorder

    async def run(self, task_status: Any) -> None:
        import trio
        from libp2p.tools.anyio_service import background_trio_service
        from multiaddr import Multiaddr

        me = self.host.get_id().to_bytes()
        async with (
            self.host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
            background_trio_service(self.pubsub),
            background_trio_service(self.router),
        ):
            await self.pubsub.wait_until_ready()
            sub = await self.pubsub.subscribe("messages")
            task_status.started((str(self.host.get_addrs()[0]), self.host.get_id().to_base58()))
            try:
                while True:  # drained in its own task: a full subscription drops silently
                    msg = await sub.get()
                    if msg.from_id == me:
                        continue
                    try:
                        text = json.loads(msg.data)["params"]["message"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    self.recorder.received(text)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self.host.close()

    async def dial(self, addr: str) -> None:
        from companion.node.discovery import parse_peer_addr

        await self.host.connect(parse_peer_addr(addr))

    async def publish(self, data: bytes) -> None:
        await self.pubsub.publish("messages", data)

    def report(self) -> dict[str, Any]:
        return {
            "connections": len(self.host.get_network().connections),
            "mesh": len(self.router.mesh.get("messages", ())),
        }


# --- driver ---------------------------------------------------------------------------------------


class Worker:
    """One node process: JSON commands on its stdin, JSON events from its stdout."""

    def __init__(self, impl: str, index: int, argv: list[str]) -> None:
        self.impl, self.index = impl, index
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.spawned = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.pid = self.popen.pid
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                with self.cond:
                    event["at"] = time.monotonic()
                    self.events.append(event)
                    self.cond.notify_all()

    def wait_after(self, mark: int, timeout: float, name: str, **fields: Any) -> dict[str, Any]:
        """The first ``name`` event with ``fields`` after the first ``mark`` events."""

        def match(event: dict[str, Any]) -> bool:
            return event.get("event") == name and all(event.get(k) == v for k, v in fields.items())

        return self.wait_for(mark, timeout, match, f"{name} {fields}")

    def wait_for(
        self, mark: int, timeout: float, match: Callable[[dict[str, Any]], bool], what: str
    ) -> dict[str, Any]:
        """The first event after the first ``mark`` events that ``match`` accepts."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for event in self.events[mark:]:
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or self.popen.poll() is not None:
                    state = "exited" if self.popen.poll() is not None else f"no {what} within {timeout} s"
                    raise TimeoutError(f"{self.impl} node {self.index}: {state}")
                self.cond.wait(min(left, 1.0))

    def warm_seqs(self) -> set[int | None]:
        """The ``seq`` of each warm-up message received (``None``: a report without one)."""
        with self.cond:
            return {e.get("seq") for e in self.events if e.get("event") == "bench_warm"}

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def send(self, command: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(json.dumps(command) + "\n")
            self.popen.stdin.flush()
        except OSError:
            pass  # it exited: its wait fails with the reason

    def kill(self, signum: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def stop_all(workers: Sequence[Worker], grace: float = 5.0) -> None:
    """Stop every process, all at once and by its PID: the ``stop`` command, then SIGTERM, then
    SIGKILL, each step with ``grace`` seconds for all of them."""
    steps: list[Callable[[Worker], None]] = [
        lambda w: w.send({"op": "stop"}),
        lambda w: w.kill(signal.SIGTERM),
        lambda w: w.kill(signal.SIGKILL),
    ]
    for step in steps:
        running = [w for w in workers if w.popen.poll() is None]
        if not running:
            break
        for w in running:
            step(w)
        deadline = time.monotonic() + grace
        for w in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.popen.wait(max(0.0, deadline - time.monotonic()))
    for w in workers:
        w.close()


def dial_answer(addr: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the answer to a dial of ``addr``: ``dialled``, or an ``error`` of a dial."""

    def match(event: dict[str, Any]) -> bool:
        dialled = event.get("event") == "dialled" and event.get("addr") == addr
        return dialled or (event.get("event") == "error" and event.get("op") == "dial")

    return match


def edges(topology: str, nodes: int) -> list[tuple[int, int]]:
    """Who dials whom: ``(i, j)`` means node i dials node j. ``mesh``: every node dials every
    earlier one. ``sparse``: node i dials i+1 and i+K (mod N, K = max(2, N // 3)), so every node
    has 4 neighbours once N > 5 (a ring and its chords); below that, the full mesh."""
    if topology == "mesh" or nodes <= SPARSE_NEIGHBOURS + 1:
        return [(i, j) for i in range(nodes) for j in range(i)]
    chord = max(2, nodes // 3)
    pairs = {frozenset((i, (i + step) % nodes)) for i in range(nodes) for step in (1, chord)}
    return sorted((max(p), min(p)) for p in pairs)


def in_peer_id_order(pairs: Sequence[tuple[int, int]], peer_ids: Sequence[str]) -> list[tuple[int, int]]:
    """The topology's positions laid on the nodes sorted by peer id: the ring of ``sparse`` is
    then the ring the project's node keeps itself (``topology.ring_neighbours``: neighbours in
    peer-id order), so with ``max_connections`` at the topology's degree its connection keeper
    neither dials nor trims, and every implementation runs the very same graph. Without this
    the keeper dialled its own ring neighbours and trimmed the bench's links during the run."""
    order = sorted(range(len(peer_ids)), key=lambda n: peer_ids[n])
    return [(order[i], order[j]) for i, j in pairs]


def neighbours(pairs: Sequence[tuple[int, int]], nodes: int) -> list[int]:
    """How many neighbours each node has."""
    count = [0] * nodes
    for i, j in pairs:
        count[i] += 1
        count[j] += 1
    return count


def worker_argv(impl: str, index: int, max_connections: int, js: list[str] | None) -> list[str]:
    if impl == "js":
        if js is None:
            raise RuntimeError("no Node.js and npm: the js peer cannot run")
        me = f"companion_bench{index}"
        metadata = {"id": me, "name": me, "personality": "bench", "story": "bench", "sample": "bench"}
        return [*js, json.dumps(metadata)]
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        impl,
        "--index",
        str(index),
        "--max-connections",
        str(max_connections),
    ]


class Network:
    """The node processes of one (impl, topology, nodes) case; a context that stops them all."""

    def __init__(self, impl: str, topology: str, nodes: int, js: list[str] | None) -> None:
        self.impl, self.topology, self.nodes, self.js = impl, topology, nodes, js
        self.pairs = edges(topology, nodes)
        self.workers: list[Worker] = []
        self.start_s: list[float] = []

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        stop_all(self.workers)

    def start(self) -> None:
        # every node of both shapes has the same degree; which node takes which position is
        # known only once they run (in_peer_id_order)
        degree = max(1, *neighbours(self.pairs, self.nodes))
        for i in range(self.nodes):
            self.workers.append(Worker(self.impl, i, worker_argv(self.impl, i, degree, self.js)))
        started = [w.wait_after(0, START_TIMEOUT, "started") for w in self.workers]
        self.start_s = [s["at"] - w.spawned for s, w in zip(started, self.workers, strict=True)]
        addrs = [next((a for a in s["addrs"] if "/ip4/127.0.0.1/" in a), s["addrs"][0]) for s in started]
        self.pairs = in_peer_id_order(self.pairs, [str(s["peer_id"]) for s in started])
        self.dial(addrs)

    def dial(self, addrs: Sequence[str], attempts: int = 5) -> None:
        """Every dial of the topology, all at once; failed ones again after a second, at most
        ``attempts`` times (js-libp2p refuses more than 5 inbound connections a second from one
        address, and every node here is 127.0.0.1)."""
        pending = list(self.pairs)
        errors: dict[tuple[int, int], str] = {}
        for attempt in range(attempts):
            if attempt:
                time.sleep(1.0)
            marks = {}
            for i, j in pending:
                marks[i, j] = self.workers[i].mark()
                self.workers[i].send({"op": "dial", "addr": addrs[j]})
            failed = []
            for i, j in pending:
                done = self.workers[i].wait_for(
                    marks[i, j], DIAL_TIMEOUT, dial_answer(addrs[j]), f"dial {addrs[j]}"
                )
                if done.get("event") != "dialled":
                    failed.append((i, j))
                    errors[i, j] = str(done.get("error"))
            pending = failed
            if not pending:
                return
        i, j = pending[0]
        raise RuntimeError(
            f"{self.impl}: {len(pending)} dials failed {attempts} times, e.g. node {i} -> {j}: {errors[i, j]}"
        )

    def warm(self) -> None:
        """Publish warm-up messages from node 0 until one reached every other node (gossipsub
        meshes form at heartbeats)."""
        self.begin(-1)  # bench mode on (the js peer then counts instead of emitting)
        deadline = time.monotonic() + WARM_TIMEOUT
        for seq in range(10**6):
            self.workers[0].send({"op": "bench_warm", "seq": seq})
            time.sleep(0.3)
            if set.intersection(*(w.warm_seqs() for w in self.workers[1:])):
                return  # one warm-up message (any: on a loaded box they take seconds) reached all
            if time.monotonic() > deadline:
                reached = [len(w.warm_seqs()) > 0 for w in self.workers[1:]]
                raise TimeoutError(
                    f"warm-up: no message reached every node within {WARM_TIMEOUT} s"
                    f" ({sum(reached)} of {len(reached)} receivers got any)"
                )
        raise AssertionError("unreachable")

    def begin(self, run: int) -> None:
        """Every node records ``run`` from now on (acknowledged, so no message of it is missed)."""
        marks = [w.mark() for w in self.workers]
        for w in self.workers:
            w.send({"op": "bench_begin", "run": run})
        for w, m in zip(self.workers, marks, strict=True):
            w.wait_after(m, REPORT_TIMEOUT, "bench_begun", run=run)

    def cpu(self) -> list[float]:
        return [cpu_seconds(w.pid) or 0.0 for w in self.workers]

    def report(self) -> list[dict[str, Any]]:
        marks = [w.mark() for w in self.workers]
        for w in self.workers:
            w.send({"op": "bench_report"})
        return [
            w.wait_after(m, REPORT_TIMEOUT, "bench_report") for w, m in zip(self.workers, marks, strict=True)
        ]


def publish_case(net: Network, run: int, rate: float, seconds: float, out: dict[str, Any]) -> None:
    """One rate on a started network; fills ``out`` as it goes (a failure leaves what it had)."""
    count = max(1, int(rate * seconds))
    expected = count * (net.nodes - 1)
    out.update(messages=count, expected=expected)
    net.begin(run)
    cpu0 = net.cpu()
    began = time.monotonic()
    publisher = net.workers[0]
    mark = publisher.mark()
    publisher.send({"op": "bench_blast", "run": run, "rate": rate, "count": count})
    try:
        publisher.wait_after(mark, seconds * 3 + 30, "bench_blasted", run=run)
    except Exception as exc:  # what arrived is still reported
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["publish_s"] = time.monotonic() - began
    reports = drain(net, expected)
    cpu = [b - a for a, b in zip(cpu0, net.cpu(), strict=True)]
    summarise(out, reports, cpu, count)


def drain(net: Network, expected: int, quiet: float = 2.0, limit: float = 30.0) -> list[dict[str, Any]]:
    """Reports once deliveries stop: all ``expected`` in, nothing new for ``quiet`` s, or ``limit``
    s (a late message counts as delivered, with its latency; a missing one as lost)."""
    deadline = time.monotonic() + limit
    reports = net.report()
    delivered = sum(len(r["latencies"]) for r in reports[1:])
    while delivered < expected and time.monotonic() < deadline:
        time.sleep(quiet)
        reports = net.report()
        now = sum(len(r["latencies"]) for r in reports[1:])
        if now == delivered:
            break
        delivered = now
    return reports


def summarise(out: dict[str, Any], reports: list[dict[str, Any]], cpu: list[float], count: int) -> None:
    latencies = [x for r in reports[1:] for x in r["latencies"]]
    out.update(
        delivered=len(latencies),
        loss=1 - len(latencies) / out["expected"],
        p50_ms=percentile(latencies, 0.5) * 1000 if latencies else None,
        p99_ms=percentile(latencies, 0.99) * 1000 if latencies else None,
        cpu_ms_per_message=sum(cpu) / count * 1000,
        cpu_ms_per_message_per_receiver=statistics.mean(cpu[1:]) / count * 1000,
        connections=[r.get("connections") for r in reports],
        mesh=[r.get("mesh") for r in reports],
    )
    if any("disconnects" in r for r in reports):
        out["disconnects"] = sum(r.get("disconnects", 0) for r in reports)
        out["dropped"] = sum(r.get("dropped", 0) for r in reports)
        out["drops"] = drops_by_reason(reports)
        out["disconnect_reasons"] = drops_by_reason(reports, "disconnect_reasons")
    if os.environ.get("BENCH_DEBUG"):
        for i, r in enumerate(reports):
            print(
                out["impl"],
                i,
                len(r["latencies"]),
                {k: v for k, v in r.items() if k not in ("latencies", "at")},
                file=sys.stderr,
            )


def drops_by_reason(reports: Sequence[dict[str, Any]], key: str = "drops") -> dict[str, int]:
    """The payloads the project's nodes dropped since start (or with ``key="disconnect_reasons"``
    the connections they lost), all nodes, by reason (the labels of ``docs/network.md``, "What
    is dropped, and why"), most frequent first."""
    total: dict[str, int] = {}
    for r in reports:
        for reason, n in r.get(key, {}).items():
            total[reason] = total.get(reason, 0) + n
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def describe_drops(drops: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in drops.items()) or "none"


def network_cases(
    impl: str,
    topology: str,
    nodes: int,
    rates: Sequence[float],
    seconds: float,
    idle: float,
    js: list[str] | None,
    settle: float = 0.0,
) -> list[dict[str, Any]]:
    """Start one network, run every rate on it (and the idle case); one result per case, each
    with ``error`` when it failed. ``settle``: seconds between the warm-up and the first rate,
    the same for every implementation."""
    base = {"impl": impl, "topology": topology, "nodes": nodes}
    results: list[dict[str, Any]] = []
    with Network(impl, topology, nodes, js) as net:
        try:
            net.start()
            base.update(
                start_s_median=statistics.median(net.start_s),
                start_s_max=max(net.start_s),
                neighbours=sorted(set(neighbours(net.pairs, nodes))),
            )
            net.warm()
            time.sleep(settle)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return [{**base, "rate": rate, "error": error} for rate in (rates if seconds > 0 else [])] + (
                [{**base, "idle_seconds": idle, "error": error}] if idle > 0 else []
            )
        for run, rate in enumerate(rates if seconds > 0 else []):
            out: dict[str, Any] = {**base, "rate": rate}
            try:
                publish_case(net, run, rate, seconds, out)
            except Exception as exc:
                out.setdefault("error", f"{type(exc).__name__}: {exc}")
            results.append(out)
        if idle > 0:
            out = {**base, "idle_seconds": idle}
            try:
                idle_case(net, idle, out)
            except Exception as exc:
                out["error"] = f"{type(exc).__name__}: {exc}"
            results.append(out)
        rss = statistics.mean((rss_bytes(w.pid) or 0) / 2**20 for w in net.workers)
        for r in results:
            r["rss_mb_per_node"] = rss
    return results


def idle_case(net: Network, seconds: float, out: dict[str, Any], settle: float = 5.0) -> None:
    """CPU per node of the connected network while nothing is published; for the project's
    node also the connections it lost and the PRUNEs it received (a churning mesh shows there)."""
    time.sleep(settle)
    before = net.report()
    cpu0 = net.cpu()
    time.sleep(seconds)
    percent = [(b - a) / seconds * 100 for a, b in zip(cpu0, net.cpu(), strict=True)]
    reports = net.report()
    out.update(
        idle_cpu_percent_mean=statistics.mean(percent),
        idle_cpu_percent_max=max(percent),
        connections=[r.get("connections") for r in reports],
        mesh=[r.get("mesh") for r in reports],
    )
    if all("prunes" in r for r in reports):
        pairs = list(zip(before, reports, strict=True))
        out["disconnects"] = sum(r["disconnects"] - b["disconnects"] for b, r in pairs)
        out["prunes_per_node_per_minute"] = (
            statistics.mean(r["prunes"] - b["prunes"] for b, r in pairs) * 60 / seconds
        )


# --- output -----------------------------------------------------------------------------------------


def span(values: Sequence[Any]) -> str:
    known = [v for v in values if isinstance(v, int)]
    return "-" if not known else f"{min(known)}-{max(known)}" if min(known) != max(known) else str(known[0])


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def describe(r: dict[str, Any]) -> str:
    head = f"{r['impl']:<9} {r['topology']:<6} {r['nodes']:>2} nodes"
    if "idle_seconds" in r:
        head += f"  idle {r['idle_seconds']:.0f} s"
    else:
        head += f"  {r['rate']:>4.0f} msg/s"
    if "start_s_median" in r:
        head += f"  start {r['start_s_median']:.2f} s"
    if "idle_cpu_percent_mean" in r:
        head += (
            f"  CPU per node {r['idle_cpu_percent_mean']:.2f} % of a core"
            f" (max {r['idle_cpu_percent_max']:.2f})"
            f"  conn {span(r['connections'])}  mesh {span(r['mesh'])}"
        )
        if "prunes_per_node_per_minute" in r:
            head += f"  disconnects {r['disconnects']}  PRUNEs {r['prunes_per_node_per_minute']:.1f}/node/min"
    elif "delivered" in r:
        head += (
            f"  p50 {ms(r['p50_ms'])} ms  p99 {ms(r['p99_ms'])} ms"
            f"  loss {r['loss'] * 100:.1f}% ({r['delivered']}/{r['expected']})"
            f"  CPU/msg {r['cpu_ms_per_message']:.2f} ms all,"
            f" {r['cpu_ms_per_message_per_receiver']:.2f} per receiver"
            f"  conn {span(r['connections'])}  mesh {span(r['mesh'])}"
        )
        if "disconnects" in r:
            head += f"  disconnects {r['disconnects']}"
            if r.get("disconnect_reasons"):
                head += f" ({describe_drops(r['disconnect_reasons'])})"
            head += f"  dropped {r['dropped']}"
            if r.get("drops"):
                head += f" ({describe_drops(r['drops'])})"
    if r.get("rss_mb_per_node"):
        head += f"  RSS {r['rss_mb_per_node']:.0f} MB/node"
    if "error" in r:
        head += f"  FAILED: {r['error']}"
    return head


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """companion/js and companion/bare of p99 and CPU per message, per (topology, nodes, rate)."""
    by = {(r["impl"], r["topology"], r["nodes"], r.get("rate")): r for r in results if "delivered" in r}
    rows = []
    for (impl, topology, nodes, rate), ours in by.items():
        if impl != "companion":
            continue
        row: dict[str, Any] = {"ratios": True, "topology": topology, "nodes": nodes, "rate": rate}
        for ref in ("js", "bare"):
            other = by.get((ref, topology, nodes, rate))
            if other is not None:
                row[f"p99_vs_{ref}"] = ratio(ours["p99_ms"], other["p99_ms"])
                row[f"cpu_vs_{ref}"] = ratio(ours["cpu_ms_per_message"], other["cpu_ms_per_message"])
        rows.append(row)
    return rows


def describe_ratios(row: dict[str, Any]) -> str:
    def x(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.2f}x"

    return (
        f"ratios    {row['topology']:<6} {row['nodes']:>2} nodes  {row['rate']:>4.0f} msg/s"
        f"  companion/js p99 {x('p99_vs_js')} CPU {x('cpu_vs_js')}"
        f"  companion/bare p99 {x('p99_vs_bare')} CPU {x('cpu_vs_bare')}"
    )


def goals(results: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 12's goals as measured in this run (``None``: not measured)."""
    loss_cases = [
        r
        for r in results
        if r["impl"] == "companion" and r["nodes"] == GOAL_NODES and r.get("rate") == GOAL_RATE
    ]
    no_loss = None if not loss_cases else all(r.get("loss") == 0 for r in loss_cases)
    p99 = [row["p99_vs_js"] for row in rows if row.get("p99_vs_js") is not None]
    within = None if not p99 else all(v <= GOAL_P99_RATIO for v in p99)
    return {
        "goals": True,
        "no_loss_10_nodes_20_msg_s": no_loss,
        "p99_within_2x_js": within,
        "worst_p99_vs_js": max(p99, default=None),
    }


def describe_goals(g: dict[str, Any]) -> str:
    def verdict(value: bool | None) -> str:
        return "not measured" if value is None else "held" if value else "MISSED"

    worst = "" if g["worst_p99_vs_js"] is None else f" (worst {g['worst_p99_vs_js']:.2f}x)"
    return (
        f"goals (issue 12): companion 0 loss at {GOAL_RATE:.0f} msg/s with {GOAL_NODES} nodes: "
        f"{verdict(g['no_loss_10_nodes_20_msg_s'])}; companion p99 <= {GOAL_P99_RATIO:.0f}x js p99: "
        f"{verdict(g['p99_within_2x_js'])}{worst}"
    )


def emit(obj: dict[str, Any], text: str, as_json: bool) -> None:
    print(json.dumps(obj) if as_json else text, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worker", choices=("companion", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--max-connections", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument(
        "--impl", nargs="+", choices=IMPLS, default=list(IMPLS), help="implementations (default: all three)"
    )
    parser.add_argument(
        "--topology",
        nargs="+",
        choices=TOPOLOGIES,
        default=list(TOPOLOGIES),
        help="network shapes (default: both)",
    )
    parser.add_argument(
        "--nodes",
        nargs="+",
        type=int,
        default=[2, 10],
        help="node counts, each one process per node (default: 2 10)",
    )
    parser.add_argument(
        "--rate",
        nargs="+",
        type=float,
        default=[5.0, 10.0, 20.0],
        help="messages per second node 0 publishes (default: 5 10 20)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="publishing time per rate (default: 6 for 2 nodes, 10 for more; 0: no publishing)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds each network rests after its warm-up before the first rate (default 5: the"
        " project's node announces itself at 1, 2, 4 and 8 s and bootstraps its DHT in its first"
        " seconds; 0 measures that too)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="also measure S seconds of an idle network's CPU per node",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per case, per ratio row and for the goals"
    )
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.nodes) or any(r <= 0 for r in args.rate):
        parser.error("--nodes must be at least 2 and --rate positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.index, args.max_connections)
        sys.stdout.flush()
        os._exit(0)  # the node is closed; py-libp2p's threads would keep the interpreter alive

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # unwinds through every Network, which stops its processes

    signal.signal(signal.SIGTERM, interrupted)
    js = None
    if "js" in args.impl:
        sys.path.insert(0, str(ROOT / "tests"))  # the support package
        from support.js import js_peer_command

        js = js_peer_command()
    results: list[dict[str, Any]] = []
    interrupted_by: str | None = None
    try:
        for topology in args.topology:
            for nodes in args.nodes:
                seconds = (6.0 if nodes <= 2 else 10.0) if args.seconds is None else args.seconds
                for impl in args.impl:  # interleaved: the same load for all three
                    for r in network_cases(
                        impl, topology, nodes, args.rate, seconds, args.idle, js, args.settle
                    ):
                        results.append(r)
                        emit(r, describe(r), args.json)
    except KeyboardInterrupt:  # every process is stopped by now; say what was measured
        interrupted_by = "interrupted: the figures below cover only the cases above"
        print(interrupted_by, file=sys.stderr, flush=True)
    rows = ratios(results)
    for row in rows:
        emit(row, describe_ratios(row), args.json)
    g = goals(results, rows)
    emit(g, describe_goals(g), args.json)
    return 130 if interrupted_by else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
