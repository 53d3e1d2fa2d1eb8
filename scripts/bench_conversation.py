"""One conversation of N companions on loopback: start-up, reply latency, idle CPU, memory.

For each size (default 3, 10, 20, 30) and layout (``process``: one ``companion run`` process per
companion; ``one``: every companion in one ``companion run`` process), the companions run the
offline scripted model from cards written to a temporary folder. A client (a bare libp2p peer in
this script, connected to every node, which every companion keeps as an allowed bridge, see
``Options.client_key``) sends ``user_bench``'s message to all N companions and
follows the conversation it starts (``--turns`` replies, the cards' ``max_turns``) to its end;
one warm-up round, then ``--rounds`` measured ones. Printed per size and layout:

- start -> all present: from the first spawn until every node's ``<id> sees ...`` line lists all
  N companions (or the ``--present-timeout``, reported as such; the rounds run anyway);
- message -> first reply p50/p90 (p99 from 100 samples), as the client receives them, and
  reply -> next reply between companions; replies per message (exactly 1: double speech and
  unanswered messages are counted) and rounds that never reached their end;
- idle CPU of the whole network (all its processes over ``--idle`` seconds after the rounds, from
  /proc/PID/stat) in cores, and per node in % of a core; the network's CPU while talking, and
  per reply;
- RSS per companion (/proc/PID/status VmRSS; in one process: the process's RSS / N);
- connections per node (the ``stats`` event SIGUSR1 makes ``companion run`` log), and the churn
  the nodes logged: connections lost, companions that left, takeovers, payloads dropped by reason;
- where a turn's time went (:data:`STAGES`): publish -> the leader has the message -> its states
  array published -> the chosen speaker has it -> its reply published -> the client has the reply,
  p50/p90 over every measured turn, from the nodes' own log stamps (needs ``--log-level INFO``,
  the default).

Beside each, measured in the same run, two reference networks of the same size whose nodes do
only the three publishes a turn takes (message, a states array from a leader, the reply from the
speaker it names), and the ratios:

- ``bare``: py-libp2p alone (bench_support.bare_*: the project's gossipsub parameters, nothing
  else), in the same layout;
- ``js``: the JavaScript peer of ``tests/js`` (js-libp2p 2.9 set up as aikyo 1.6 sets it up,
  its gossipsub defaults included), one process per node (``process`` layout only), each
  dialling up to :data:`JS_DIALS` earlier ones at random, none past :data:`JS_MAX_LINKS` links
  (as the project's node keeps 8): what aikyo's own network stack costs on the same machine. Needs
  Node.js and npm (the dependencies are installed on first use); skipped with a note without.

The goals of issue 12 are printed, not asserted.

    python scripts/bench_conversation.py --sizes 3 10 --rounds 10
    python scripts/bench_conversation.py --sizes 10 --layouts one --hold 60  # py-spy the PIDs
    python scripts/bench_conversation.py --sizes 30 --bootstrap chain --json

Bootstrap (``--bootstrap``): ``hub`` (default) gives every process the first one's address and
lets the DHT do the rest (spawned together); ``chain`` gives each process every earlier one's
address (spawned one after the other, as ``companion run`` connects cards in one process). The
reference networks are spawned one node after the other (they have no discovery), so their
start-up is not printed.

``BENCH_NODE_CONFIG='{"health_check_interval": 30, "degree_high": 8}'`` replaces NodeConfig fields
on every node, the companions' and the bare ones' (a settings experiment; the package is not
changed); environment variables such as ``PY_YAMUX_RELEASE_ON_READ=0`` reach every process.

Every process is stopped by its PID (SIGTERM, then SIGKILL after a grace) when a case ends,
however it ends; every wait has a deadline. A case that cannot finish prints what it got and why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import bare_host, bare_pubsub, cpu_seconds, percentile, rss_bytes

from companion.tasks import OwnsTasks, innermost  # trio and the standard library only: cheap for the children

if TYPE_CHECKING:
    from companion.protocol import Message  # for annotations only: this script imports companion lazily

USER: Final = "user_bench"
NODE_CONFIG_ENV: Final = "BENCH_NODE_CONFIG"
LEADER_KEY: Final = "bench_leader"
SPEAKER_KEY: Final = "bench_speaker"
"""The reference networks' turn: the client names a leader, which publishes a states array
naming the speaker, which replies (keys in ``params.metadata``; ``tests/js/peer.mjs`` reads the
same ones)."""
REFERENCES: Final = ("bare", "js")
JS_DIALS: Final = 4
"""How many earlier nodes each js reference node dials (chosen at random, seeded by the size)."""
JS_MAX_LINKS: Final = 8
"""The most links a js reference node has to others (the client's is one more). js-libp2p's
gossipsub scores down peers that share an IP address past 10 (``IPColocationFactorThreshold``,
weight -5 per surplus squared): on loopback every peer is 127.0.0.1, and a node with 14 peers
(13 nodes and the client) ranked them all below its publish threshold and published to no one
(measured: 2 of 15 rounds unanswered at 30). The project's nodes keep 8 connections too."""
GOALS: Final = (
    "goals (issue 12): 30 companions, p50 <= 150 ms, p90 <= 400 ms, idle CPU of the network <= 0.3 cores"
)
CHURN_EVENTS: Final = (
    "peer_disconnected",
    "companion_left",
    "peer_metadata_unavailable",
    "takeover",
    "speaker_silent",
    "message_stale",
)
"""Log events counted per case: connections lost and what follows from it."""
IDLE_EVENTS: Final = (*CHURN_EVENTS, "peer_connected", "connection_trimmed", "ring_dialled")
"""Log events counted during the idle window: an idle network that still dials and trims spends
its idle CPU on that (and on the presence announcements each new connection triggers)."""
QUESTIONS: Final = (
    "What was the best part of your day so far?",
    "Which book would you take to a lighthouse for a winter?",
    "What do you cook when it rains all afternoon?",
    "Where would you walk if the trains stopped for a week?",
    "Which sound do you miss from when you were small?",
    "What would you plant on a balcony facing north?",
    "Which star would you name after a friend?",
    "What is the oddest thing you have ever repaired?",
)

CARD: Final = """\
metadata:
  id: {id}
  name: {name}
  personality: warm, curious and brief
  story: {name} lives on 127.0.0.1 and is measured by a benchmark; it likes short conversations.
  sample: "Hello, I am {name}."
role: Keep replies to one or two sentences.
actions: [speak]
events:
  params:
    type: object
    properties:
      mood:
        type: string
        enum: [calm, curious]
    required: [mood]
  conditions:
    - expression: "true"
      execute:
        - tool: speak
          instruction: Reply briefly to what was just said.
settings:
  max_turns: {turns}
"""


def companion_ids(size: int, kind: str) -> list[str]:
    return [f"companion_{kind}{i:02d}" for i in range(size)]


def write_cards(folder: Path, ids: Sequence[str], turns: int) -> list[Path]:
    paths = []
    for index, cid in enumerate(ids):
        path = folder / f"{cid}.yaml"
        path.write_text(CARD.format(id=cid, name=f"Bench {index}", turns=turns), encoding="utf-8")
        paths.append(path)
    return paths


# --- the bare reference network (``--bare-worker``: this script, one or more nodes a process) ----


def bare_worker(names: Sequence[str], peers: Sequence[str]) -> None:
    """Bare nodes in one process until SIGTERM; stdout as ``companion run`` prints it, except
    that ``<name> connected <count>`` stands for the ``sees`` line (bare nodes know no ids)."""

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            local: list[str] = []
            for name in names:
                addr = await nursery.start(bare_node, name, [*peers, *local], stop)
                local.append(addr)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            stop.set()
            with trio.move_on_after(10):
                while nursery.child_tasks:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)


async def bare_node(name: str, peers: Sequence[str], stop: trio.Event, task_status: Any) -> None:
    from multiaddr import Multiaddr

    from companion.node.discovery import parse_peer_addr
    from companion.node.notifee import ConnectionNotifee
    from companion.protocol import MESSAGES, STATES

    host = bare_host()
    pubsub, router = bare_pubsub(host, node_config())
    me = host.get_id()

    class Count(ConnectionNotifee):
        async def connected(self, network: Any, conn: Any) -> None:
            print(f"{name} connected {len(network.connections)}", flush=True)

        async def disconnected(self, network: Any, conn: Any) -> None:
            print(f"{name} connected {len(network.connections)}", flush=True)

    host.get_network().register_notifee(Count())

    async def on_messages(sub: Any) -> None:
        while True:
            msg = await sub.get()
            if msg.from_id == me.to_bytes():
                continue
            try:
                params = json.loads(msg.data)["params"]
                meta = params.get("metadata") or {}
                if meta.get(LEADER_KEY) != name:
                    continue
                speaker = meta[SPEAKER_KEY]
                states = [
                    {
                        "jsonrpc": "2.0",
                        "method": "state.send",
                        "params": {
                            "from": cid,
                            "state": "speak" if cid == speaker else "listen",
                            "importance": 5,
                            "selected": cid == speaker,
                            "closing": "none",
                        },
                    }
                    for cid in params["to"]
                ]
                body = {"for": params["id"], "sender": params["from"], "speaker": speaker, "states": states}
            except (ValueError, KeyError, TypeError):
                continue
            await pubsub.publish(STATES, json.dumps(body).encode())

    async def on_states(sub: Any) -> None:
        import uuid

        while True:
            msg = await sub.get()
            try:
                body = json.loads(msg.data)
                if body.get("speaker") != name:
                    continue
                reply = {
                    "jsonrpc": "2.0",
                    "method": "message.send",
                    "params": {
                        "id": str(uuid.uuid4()),
                        "from": name,
                        "to": [body["sender"]],
                        "message": f"{name} answers: a short reply of about the length companions give.",
                        "metadata": {"in_reply_to": body["for"], "turn": 1, "closing": "none"},
                    },
                }
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            await pubsub.publish(MESSAGES, json.dumps(reply).encode())

    async def dial(addr: str) -> None:
        for _attempt in range(20):  # bounded: 20 tries, each within 10 s
            with trio.move_on_after(10):
                try:
                    await host.connect(parse_peer_addr(addr))
                    return
                except Exception:
                    pass
            await trio.sleep(0.5)

    async with (
        host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
        background_trio_service_of(pubsub),
        background_trio_service_of(router),
    ):
        await pubsub.wait_until_ready()
        messages = await pubsub.subscribe(MESSAGES)
        states = await pubsub.subscribe(STATES)
        addrs = [str(a) for a in host.get_addrs()]
        print(f"{name} peer {me.to_base58()}", flush=True)
        for addr in addrs:
            print(f"  {addr}", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_messages, messages)
            nursery.start_soon(on_states, states)
            for addr in peers:
                nursery.start_soon(dial, addr)
            task_status.started(addrs[0])
            await stop.wait()
            with trio.move_on_after(5):
                await host.close()
            nursery.cancel_scope.cancel()


def background_trio_service_of(service: Any) -> Any:
    from libp2p.tools.anyio_service import background_trio_service

    return background_trio_service(service)


# --- the processes of one network ------------------------------------------------------------------


@dataclass
class NodeView:
    """One node as its process's standard output shows it."""

    name: str
    peer_id: str
    addrs: list[str] = field(default_factory=list)
    sees: frozenset[str] = frozenset()
    connected: int = 0
    peers: set[str] = field(default_factory=set)
    """The js peer's connected peers (it prints each connect and disconnect, not a count)."""


@dataclass
class Child:
    """One process of the network: its stdout is read line by line, its stderr goes to a file."""

    label: str
    process: trio.Process
    stderr_path: Path
    nodes: list[str] = field(default_factory=list)
    exited: int | None = None
    errors: list[str] = field(default_factory=list)
    """``error`` events the js peer printed (a failed dial or publish)."""


class Network(OwnsTasks):
    """The processes of one case and what their standard output said, with a wake-up on change;
    open for the case (``async with Network(folder) as net:``), its readers' tasks are its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.children: list[Child] = []
        self.nodes: dict[str, NodeView] = {}
        self.first_spawn: float | None = None
        self._changed = trio.Event()

    async def spawn(self, label: str, argv: list[str], commands: Sequence[dict[str, Any]] = ()) -> Child:
        """Start one process; ``commands`` are written to its standard input (one JSON object a
        line, as the js peer reads them), which then stays open: the js peer stops at its end."""
        if self.first_spawn is None:
            self.first_spawn = trio.current_time()
        stderr_path = self.folder / f"{label}.stderr"
        with open(stderr_path, "wb") as stderr:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.PIPE if commands else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        child = Child(label, process, stderr_path)
        self.children.append(child)
        if commands:
            assert process.stdin is not None
            await process.stdin.send_all(b"".join(json.dumps(c).encode() + b"\n" for c in commands))
        self.tasks.start_soon(self._read, child)
        return child

    async def _read(self, child: Child) -> None:
        assert child.process.stdout is not None
        buffer = b""
        current: NodeView | None = None
        async with child.process.stdout:
            while True:
                try:
                    chunk = await child.process.stdout.receive_some(65536)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    chunk = b""
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    raw, buffer = buffer.split(b"\n", 1)
                    current = self._line(child, raw.decode("utf-8", "replace"), current)
                self._wake()
        child.exited = await child.process.wait()
        self._wake()

    def _line(self, child: Child, line: str, current: NodeView | None) -> NodeView | None:
        from companion.app.lines import parse_sees

        if line.startswith("  ") and current is not None:
            current.addrs.append(line.strip())
            return current
        if line.startswith("{"):
            self._js_event(child, line)
            return current
        words = line.split()
        if len(words) == 3 and words[1] == "peer":
            view = NodeView(words[0], words[2])
            self.nodes[view.name] = view
            child.nodes.append(view.name)
            return view
        if len(words) == 3 and words[1] == "connected" and words[0] in self.nodes:
            self.nodes[words[0]].connected = int(words[2])
            return current
        seen = parse_sees(line)
        if seen is not None and seen[0] in self.nodes:
            self.nodes[seen[0]].sees = seen[1]
        return current

    def _js_event(self, child: Child, line: str) -> None:
        """One event of the js peer (``tests/js/peer.mjs``), which runs one node named by its label."""
        try:
            event = json.loads(line)
        except ValueError:
            return
        kind = event.get("event")
        if kind == "started":
            view = NodeView(child.label, str(event.get("peer_id")))
            view.addrs = [str(a) for a in event.get("addrs") or () if "/ip4/127.0.0.1/" in str(a)]
            self.nodes[view.name] = view
            child.nodes.append(view.name)
        elif kind in ("connected", "disconnected") and child.label in self.nodes:
            view = self.nodes[child.label]
            (view.peers.add if kind == "connected" else view.peers.discard)(str(event.get("peer")))
            view.connected = len(view.peers)
        elif kind == "error":
            child.errors.append(f"{event.get('op')}: {event.get('error')}"[:300])

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return True
        return False

    def dead(self) -> list[str]:
        return [f"{c.label} exited {c.exited}" for c in self.children if c.exited is not None]

    def js_errors(self) -> list[str]:
        return [f"{c.label} {e}" for c in self.children for e in c.errors]

    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children if c.exited is None]

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process, SIGKILL those alive after ``grace`` s; by PID, shielded."""
        with trio.CancelScope(shield=True):
            for child in self.children:
                if child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                for child in self.children:
                    await child.process.wait()
            for child in self.children:
                if child.process.returncode is None:
                    child.process.kill()
            with trio.move_on_after(5):
                for child in self.children:
                    await child.process.wait()

    def event_counts(self) -> Counter[str]:
        """How often each JSON log event appears on the processes' stderr so far; for
        ``companion_left`` also per reason (``companion_left:expired``, ...)."""
        counts: Counter[str] = Counter()
        for child in self.children:
            with open(child.stderr_path, "rb") as f:
                for raw in f:
                    if not raw.startswith(b"{"):
                        continue
                    try:
                        event = json.loads(raw)
                    except ValueError:
                        continue
                    counts[str(event.get("event"))] += 1
                    if event.get("event") == "companion_left":
                        counts[f"companion_left:{event.get('reason')}"] += 1
        return counts

    def stderr_tail(self, lines: int = 5) -> list[str]:
        out = []
        for child in self.children:
            if child.exited is not None and child.exited != 0 and child.exited != -signal.SIGTERM:
                text = child.stderr_path.read_text(encoding="utf-8", errors="replace").splitlines()
                out += [f"{child.label}: {line[:300]}" for line in text[-lines:]]
        return out


# --- the client ------------------------------------------------------------------------------------


class Client:
    """A bare libp2p peer in this process that speaks as ``user_bench`` and watches every
    message and states array: arrival time per message id, replies per message, the transcript."""

    def __init__(self, ids: Sequence[str], *, companions: bool, key_pair: Any = None) -> None:
        from companion.conversation.transcript import Transcript

        self.key_pair = key_pair
        self.ids = list(ids)
        self.companions = companions
        self.arrivals: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        """Wall-clock time of each arrival (and of each message sent): the nodes' log stamps
        are wall-clock, and :func:`turn_stages` lines them up with these."""
        self.replies: defaultdict[str, list[str]] = defaultdict(list)
        self.reply_to: dict[str, str] = {}
        self.transcript = Transcript()
        self.host: Any = None
        self.pubsub: Any = None
        self._changed = trio.Event()
        self._stop = trio.Event()
        self._done = trio.Event()
        self.close_error: str | None = None

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from multiaddr import Multiaddr

        from companion.protocol import MESSAGES, STATES

        self.host = bare_host(key_pair=self.key_pair)
        self.pubsub, router = bare_pubsub(self.host)
        try:
            async with (
                self.host.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]),
                background_trio_service_of(self.pubsub),
                background_trio_service_of(router),
            ):
                await self.pubsub.wait_until_ready()
                async with trio.open_nursery() as nursery:
                    for topic in (MESSAGES, STATES):
                        nursery.start_soon(self._drain, topic, await self.pubsub.subscribe(topic))
                    task_status.started()
                    try:
                        await self._stop.wait()
                    finally:
                        with trio.CancelScope(shield=True), trio.move_on_after(5):
                            await self.host.close()
                        nursery.cancel_scope.cancel()
        except Exception as exc:
            if not self._stop.is_set():
                raise
            # py-libp2p 0.8.1 may raise from its swarm while closing ("Nursery is closed to new
            # arrivals"): the measurements are taken by then
            self.close_error = repr(exc)
        finally:
            self._done.set()

    async def close(self, timeout: float = 10.0) -> None:
        """Disconnect before the network stops (else py-libp2p redials the dying nodes)."""
        if self.host is None:
            return
        self._stop.set()
        with trio.CancelScope(shield=True), trio.move_on_after(timeout):
            await self._done.wait()

    async def _drain(self, topic: str, sub: Any) -> None:
        from companion.conversation.rules import turn_info
        from companion.protocol import MESSAGES, Message, PayloadError, parse_payload

        me = self.host.get_id().to_bytes()
        while True:
            msg = await sub.get()
            now = trio.current_time()
            if msg.from_id == me:
                continue
            if topic == MESSAGES:
                payload = parse_payload(MESSAGES, msg.data)
                if not isinstance(payload, Message) or payload.params.id in self.arrivals:
                    continue
                self.arrivals[payload.params.id] = now
                self.wall[payload.params.id] = time.time()
                parent = turn_info(payload).in_reply_to
                if parent is not None:
                    self.replies[parent].append(payload.params.from_)
                    self.reply_to[payload.params.id] = parent
                if self.companions:
                    self.transcript.feed(payload, self.ids)
            elif self.companions:
                payload = parse_payload(topic, msg.data)
                if not isinstance(payload, PayloadError):
                    self.transcript.feed(payload, self.ids)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return True
        return False

    async def connect(self, addrs: Sequence[str], timeout: float) -> int:
        """Dial every address (concurrently, each within ``timeout``); how many connected."""
        from companion.node.discovery import parse_peer_addr

        done = 0

        async def one(addr: str) -> None:
            nonlocal done
            with trio.move_on_after(timeout):
                try:
                    await self.host.connect(parse_peer_addr(addr))
                    done += 1
                except Exception:
                    pass

        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(one, addr)
        return done

    async def wait_subscribed(self, peer_ids: Sequence[str], timeout: float) -> bool:
        """Until every node's subscription to ``messages`` reached this client (polled)."""
        from libp2p.peer.id import ID

        from companion.protocol import MESSAGES

        wanted = {ID.from_base58(p) for p in peer_ids}
        with trio.move_on_after(timeout):
            while not wanted <= set(self.pubsub.peer_topics.get(MESSAGES, ())):
                await trio.sleep(0.1)
            return True
        return False

    async def say(self, text: str, metadata: dict[str, Any] | None = None) -> str:
        from companion.protocol import MESSAGES, Message, encode

        message = Message.create(USER, self.ids, text, metadata)
        data = encode(message)
        self.arrivals[message.params.id] = trio.current_time()  # signing counts as the network's
        self.wall[message.params.id] = time.time()
        await self.pubsub.publish(MESSAGES, data)
        return message.params.id


# --- one case ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    rounds: int
    turns: int
    idle: float
    settle: float
    present_timeout: float
    reply_timeout: float
    round_timeout: float
    bootstrap: str
    max_connections: int | None
    log_level: str
    hold: float
    case_timeout: float
    js_command: tuple[str, ...] = ()
    """How to start the js peer (``support.js.js_peer_command``); empty: no js reference."""
    client_key: Any = None
    """The client's libp2p key pair (every case's client has it): companions are told its peer
    id as an allowed bridge (``--answerer``), so they never trim it, as a real client's bridge
    is kept. Unprotected, it was trimmed at each node's bound and redialled (1-4 connections
    replaced per idle minute); keeping it changed nothing in the idle figure (measured at 10 and
    30), but the idle window now shows the network's own churn only."""


def node_config() -> Any:
    """The NodeConfig every node of this run gets: the defaults, with ``BENCH_NODE_CONFIG``'s
    fields (a JSON object, as for bench_network.py) replaced."""
    from companion.node.config import NodeConfig

    return NodeConfig(**json.loads(os.environ.get(NODE_CONFIG_ENV) or "{}"))


def run_companion(argv: Sequence[str]) -> int:
    """``companion run ARGV`` with ``BENCH_NODE_CONFIG`` applied to every node it starts (a
    settings experiment without editing the package)."""
    import dataclasses

    from companion.node import CompanionNode

    overrides = json.loads(os.environ.get(NODE_CONFIG_ENV) or "{}")
    original = CompanionNode.__init__

    def configured(self: Any, metadata: Any, config: Any = None, **kwargs: Any) -> None:
        original(self, metadata, dataclasses.replace(config or node_config(), **overrides), **kwargs)

    CompanionNode.__init__ = configured  # type: ignore[method-assign]
    from companion.cli.run import standalone

    return standalone(list(argv))


def companion_argv(
    cards: Sequence[Path], data: Path, seed: int, peers: Sequence[str], options: Options
) -> list[str]:
    size = len(cards)
    command = ["-m", "companion.cli.run"]
    if os.environ.get(NODE_CONFIG_ENV):
        command = [str(Path(__file__).resolve()), "--run-companion"]
    argv = [
        sys.executable,
        *command,
        *map(str, cards),
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(data),
        "--seed",
        str(seed),
        "--log-format",
        "json",
        "--log-level",
        options.log_level,
        "--max-connections",
        str(options.max_connections or max(8, size)),
    ]
    if options.client_key is not None:
        argv += ["--answerer", client_peer_id(options)]
    for peer in peers:
        argv += ["--peer", peer]
    return argv


def client_peer_id(options: Options) -> str:
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(options.client_key.public_key).to_base58())


def bare_argv(names: Sequence[str], peers: Sequence[str]) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--bare-worker", *names]
    for peer in peers:
        argv += ["--peer", peer]
    return argv


async def start_network(
    net: Network, kind: str, layout: str, ids: list[str], folder: Path, options: Options
) -> None:
    """Spawn the processes of a case; returns once each has printed its nodes' addresses."""

    def printed(names: Sequence[str]) -> Callable[[], bool]:
        return lambda: all(n in net.nodes and net.nodes[n].addrs for n in names) or bool(net.dead())

    async def expect(names: Sequence[str]) -> None:
        if not await net.wait_until(printed(names), 90) or net.dead():
            raise RuntimeError(f"no address from {names[-1]} within 90 s {net.dead()}")

    if kind == "companion":
        data = folder / "data"
        cards = write_cards(folder, ids, options.turns)
        if layout == "one":
            await net.spawn("run", companion_argv(cards, data, 0, [], options))
            await expect(ids)
        elif options.bootstrap == "hub":
            await net.spawn(ids[0], companion_argv(cards[:1], data, 0, [], options))
            await expect(ids[:1])
            hub = net.nodes[ids[0]].addrs[0]
            for index in range(1, len(ids)):
                await net.spawn(
                    ids[index], companion_argv(cards[index : index + 1], data, index, [hub], options)
                )
            await expect(ids)
        else:
            for index, cid in enumerate(ids):
                earlier = [net.nodes[c].addrs[0] for c in ids[:index]]
                await net.spawn(cid, companion_argv(cards[index : index + 1], data, index, earlier, options))
                await expect([cid])
    elif kind == "js":
        if layout != "process":
            raise RuntimeError("the js peer runs one node per process: it has no 'one' layout")
        dials = js_dials(ids)
        for cid in ids:
            commands = [
                {"op": "bench_turn", "name": cid},
                *({"op": "dial", "addr": net.nodes[c].addrs[0]} for c in dials[cid]),
            ]
            await net.spawn(cid, [*options.js_command, json.dumps(js_metadata(cid))], commands)
            await expect([cid])
    elif layout == "one":
        await net.spawn("bare", bare_argv(ids, []))
        await expect(ids)
    else:
        for index, cid in enumerate(ids):
            await net.spawn(cid, bare_argv([cid], [net.nodes[c].addrs[0] for c in ids[:index]]))
            await expect([cid])


def js_dials(ids: Sequence[str]) -> dict[str, list[str]]:
    """Which earlier nodes each js reference node dials: up to :data:`JS_DIALS` at random
    (seeded by the size, so every run lays the same graph) among those with fewer than
    :data:`JS_MAX_LINKS` links."""
    pick = random.Random(len(ids))
    links = dict.fromkeys(ids, 0)
    dials: dict[str, list[str]] = {}
    for index, cid in enumerate(ids):
        open_ = [c for c in ids[:index] if links[c] < JS_MAX_LINKS]
        dials[cid] = pick.sample(open_, min(len(open_), JS_DIALS))
        for c in dials[cid]:
            links[c] += 1
        links[cid] += len(dials[cid])
    return dials


def js_metadata(cid: str) -> dict[str, str]:
    return {"id": cid, "name": cid, "personality": "bench", "story": "bench", "sample": "bench"}


def present(net: Network, kind: str, ids: list[str]) -> Callable[[], bool]:
    everyone = frozenset(ids)
    if kind == "companion":
        return lambda: all(n in net.nodes and net.nodes[n].sees >= everyone for n in ids)
    if kind == "bare":  # a full mesh
        return lambda: all(n in net.nodes and net.nodes[n].connected >= len(ids) - 1 for n in ids)
    links = Counter[str]()
    for cid, dialled in js_dials(ids).items():
        links[cid] += len(dialled)
        links.update(dialled)
    return lambda: all(n in net.nodes and net.nodes[n].connected >= links[n] for n in ids)


def network_cpu(pids: Sequence[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        value = cpu_seconds(pid)
        if value is not None:
            out[pid] = value
    return out


async def read_stats(net: Network, names: Sequence[str], timeout: float = 15.0) -> dict[str, dict[str, Any]]:
    """SIGUSR1 every process and collect the ``stats`` event each node logs (by node name)."""
    marks = {c.label: c.stderr_path.stat().st_size for c in net.children}
    for child in net.children:
        if child.exited is None:
            child.process.send_signal(signal.SIGUSR1)
    found: dict[str, dict[str, Any]] = {}
    deadline = trio.current_time() + timeout
    while set(names) - set(found) and trio.current_time() < deadline:
        await trio.sleep(0.25)
        for child in net.children:
            with open(child.stderr_path, "rb") as f:
                f.seek(marks[child.label])
                for raw in f.read().splitlines():
                    if b'"stats"' not in raw:
                        continue
                    try:
                        event = json.loads(raw)
                    except ValueError:
                        continue
                    if event.get("event") == "stats":
                        found[str(event.get("node"))] = event
    return found


async def run_case(size: int, layout: str, kind: str, options: Options) -> dict[str, Any]:
    """One network, measured; what it got and why it stopped early, if it did."""
    ids = companion_ids(size, "bench" if kind == "companion" else kind)
    result: dict[str, Any] = {"size": size, "layout": layout, "kind": kind, "notes": []}
    notes: list[str] = result["notes"]
    dead: list[str] = []
    tails: list[str] = []
    js_errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-conv-") as tmp:
        try:
            async with trio.open_nursery() as nursery, Network(Path(tmp)) as net:
                client = Client(ids, companions=kind == "companion", key_pair=options.client_key)
                try:
                    with trio.fail_after(options.case_timeout), trio.CancelScope() as STOP.scope:
                        await run_phases(net, client, nursery, ids, kind, layout, Path(tmp), options, result)
                    if STOP.scope.cancelled_caught:
                        notes.append(f"stopped early: {STOP.why}")
                finally:
                    await client.close()
                    dead = net.dead()
                    tails = net.stderr_tail()
                    js_errors = net.js_errors()
                    await net.stop()
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # a case that cannot finish reports what it got, and why
            leaf = innermost(exc)
            why = (
                f"--case-timeout {options.case_timeout:.0f} s passed"
                if isinstance(leaf, trio.TooSlowError)
                else repr(leaf)
            )
            notes.append(f"stopped early: {why}")
    if dead:
        notes.append("exited during the case: " + ", ".join(dead))
    notes.extend(tails)
    if js_errors:
        notes.append(f"{len(js_errors)} errors from the js peers, e.g. {js_errors[0]}")
    return result


async def run_phases(
    net: Network,
    client: Client,
    nursery: trio.Nursery,
    ids: list[str],
    kind: str,
    layout: str,
    folder: Path,
    options: Options,
    result: dict[str, Any],
) -> None:
    notes: list[str] = result["notes"]
    size = len(ids)
    await start_network(net, kind, layout, ids, folder, options)
    # for a profiler (py-spy record -p PID): the PIDs, on stderr so the table stays clean
    print(f"# {kind} {size} {layout}: PIDs {' '.join(map(str, net.pids()))}", file=sys.stderr, flush=True)
    everyone_present = await net.wait_until(present(net, kind, ids), options.present_timeout)
    assert net.first_spawn is not None
    if everyone_present:
        result["present_s"] = trio.current_time() - net.first_spawn
    else:
        result["present_s"] = None
        seen = [len(net.nodes[n].sees) if kind == "companion" else net.nodes[n].connected + 1 for n in ids]
        notes.append(
            f"not all present within {options.present_timeout:.0f} s: each node sees "
            f"min {min(seen)} / median {statistics.median(seen):.0f} of {size}"
        )
    await nursery.start(client.run)
    connected = await client.connect([net.nodes[n].addrs[0] for n in ids], 15)
    if connected < size:
        notes.append(f"client connected to {connected} of {size} nodes")
    if not await client.wait_subscribed([net.nodes[n].peer_id for n in ids], 30):
        notes.append("not every node's subscription reached the client within 30 s")
    await trio.sleep(2.0)  # two heartbeats: the client joins the meshes

    measured_from = await talk(net, client, ids, kind, options, result)
    if kind == "companion":
        result["stages_ms"] = turn_stages([c.stderr_path for c in net.children], client, measured_from)
        notes.append(describe_stages(result["stages_ms"]))
    await trio.sleep(options.settle)
    pids = net.pids()
    idle_from = net.event_counts() if kind == "companion" else Counter()
    sent_from = await read_stats(net, ids) if kind == "companion" else {}
    before = network_cpu(pids)
    await trio.sleep(options.idle)
    after = network_cpu(pids)
    idle_churn = net.event_counts() - idle_from if kind == "companion" else Counter()
    per_process = [after[p] - before[p] for p in before if p in after]
    nodes_per_process = size / max(1, len(per_process))
    result.update(
        idle_cores=sum(per_process) / options.idle,
        idle_node_percent=[x / options.idle * 100 / nodes_per_process for x in per_process],
        rss_mb_per_companion=[
            (rss_bytes(p) or 0) / 2**20 / nodes_per_process for p in pids if rss_bytes(p) is not None
        ],
        processes=len(pids),
    )
    if kind == "companion":
        stats = await read_stats(net, ids)
        result["connections"] = [stats[n]["connected_peers"] for n in ids if n in stats]
        drops: Counter[str] = Counter()
        for s in stats.values():
            drops.update({str(k): int(v) for k, v in (s.get("drops") or {}).items()})
        result["drops"] = dict(drops)
        lost: Counter[str] = Counter()
        for s in stats.values():
            lost.update({str(k): int(v) for k, v in (s.get("disconnects") or {}).items()})
        result["disconnect_reasons"] = dict(lost)
        result["presence_per_node"] = {
            key: statistics.mean(float(s.get(key, 0)) for s in stats.values()) if stats else 0.0
            for key in ("presence_published", "presence_accepted", "presence_bytes_in")
        }
        if len(stats) < size:
            notes.append(f"stats from {len(stats)} of {size} nodes")
        events = net.event_counts()
        minutes = (trio.current_time() - (net.first_spawn or 0.0)) / 60
        churn = {name: events.get(name, 0) for name in CHURN_EVENTS}
        result["events"] = churn
        left = {k.split(":", 1)[1]: v for k, v in events.most_common() if k.startswith("companion_left:")}
        result["left_reasons"] = left
        dropped = ", ".join(f"{k} {v}" for k, v in drops.most_common()) or "none"
        notes.append(
            f"churn over {minutes:.1f} min: {churn['peer_disconnected']} disconnects "
            f"({churn['peer_disconnected'] / size / max(minutes, 1e-9):.1f} per node per minute), "
            + ", ".join(f"{v} {k}" for k, v in churn.items() if k != "peer_disconnected")
            + f"; payloads dropped: {dropped}"
            + "; disconnects by reason: "
            + (", ".join(f"{k} {v}" for k, v in lost.most_common()) or "none")
            + "; companions left by reason: "
            + (", ".join(f"{k} {v}" for k, v in left.items()) or "none")
            + "; presence per node: {presence_published:.0f} published, {presence_accepted:.0f} accepted,"
            " {presence_bytes_in:.0f} bytes heard".format(**result["presence_per_node"])
        )
        result["idle_events"] = {name: idle_churn.get(name, 0) for name in IDLE_EVENTS}
        sent: Counter[str] = Counter()
        for name, s in stats.items():
            sent.update(s.get("sent") or {})
            sent.subtract((sent_from.get(name) or {}).get("sent") or {})
        per_node_s = max(1, len(stats)) * options.idle
        result["idle_sent_per_node_s"] = {k: v / per_node_s for k, v in sent.items() if v > 0}
        notes.append(
            f"during the {options.idle:.0f} s idle window: "
            + (", ".join(f"{v} {k}" for k, v in result["idle_events"].items() if v) or "no churn")
            + "; written per node per second: "
            + (", ".join(f"{v:.1f} {k}" for k, v in result["idle_sent_per_node_s"].items()) or "nothing")
        )
    else:
        result["connections"] = [net.nodes[n].connected for n in ids]
    if options.hold > 0:
        print(
            f"# holding the network for {options.hold:.0f} s: PIDs {' '.join(map(str, net.pids()))}",
            flush=True,
        )
        await trio.sleep(options.hold)


async def talk(
    net: Network, client: Client, ids: list[str], kind: str, options: Options, result: dict[str, Any]
) -> float:
    """One warm-up round, then ``options.rounds`` measured ones; ``result`` is brought up to date
    after every round, so a case stopped by its deadline still reports the rounds it had. Returns
    the wall-clock time the measured rounds began."""
    size = len(ids)
    first: list[float] = []
    chain: list[float] = []
    unanswered = stalled = 0
    user_ids: list[str] = []
    cpu_before = network_cpu(net.pids())
    talk_started = trio.current_time()
    measured_from = time.time()

    def tally() -> None:
        talked = trio.current_time() - talk_started
        cpu_after = network_cpu(net.pids())
        talk_cpu = sum(cpu_after.get(p, 0.0) - v for p, v in cpu_before.items())
        counted = [len(client.replies.get(m, ())) for m in user_ids]
        every_reply = [len(v) for k, v in client.replies.items() if k in client.arrivals]
        result.update(
            rounds=len(user_ids),
            first_ms=[round(x * 1000, 2) for x in first],
            chain_ms=[round(x * 1000, 2) for x in chain],
            answered_once=sum(1 for c in counted if c == 1),
            unanswered=unanswered,
            double_speech=sum(1 for c in every_reply if c > 1),
            stalled=stalled,
            talk_cpu_per_reply_ms=talk_cpu / (len(first) + len(chain)) * 1000 if first else None,
            talk_cores=talk_cpu / talked if talked > 0 else None,
        )

    for round_no in range(options.rounds + 1):  # round 0 warms up and is not counted
        metadata = None
        if kind != "companion":
            metadata = {LEADER_KEY: ids[round_no % size], SPEAKER_KEY: ids[(round_no + 1) % size]}
        text = f"Round {round_no}, everyone: {QUESTIONS[round_no % len(QUESTIONS)]}"
        if round_no == 1:
            cpu_before = network_cpu(net.pids())
            talk_started = trio.current_time()
            measured_from = time.time()
        mid = await client.say(text, metadata)
        if round_no > 0:
            user_ids.append(mid)
        answered = await client.wait_until(replied(client, mid), options.reply_timeout)
        if answered and kind == "companion":
            over = await client.wait_until(ended_at(client, mid), options.round_timeout)
            stalled += (not over) and round_no > 0
        if answered:
            await trio.sleep(0.5)  # a second (double) reply would arrive within this
        if round_no > 0:
            if answered:
                reply = next(r for r, p in client.reply_to.items() if p == mid)
                first.append(client.arrivals[reply] - client.arrivals[mid])
                chain += chain_latencies(client, reply)
            else:
                unanswered += 1
                result["notes"].append(f"round {round_no} unanswered within {options.reply_timeout:.0f} s")
            tally()
    return measured_from


STAGES: Final = {
    "to_leader": "publish -> leader",
    "leader": "leader -> states published",
    "to_speaker": "states -> speaker",
    "speaker": "speaker -> reply published",
    "to_client": "reply -> client",
}
"""A turn's path (each stage by key, as printed), timed from the nodes' own log stamps (wall
clock, 1 ms): the message's publish -> the leader's ``inbound`` of it; -> the leader's
``states_published``; -> the chosen speaker's ``speaker_chosen`` (the array reached it); -> its
``replied`` (model calls, tools, the store's commit); -> the reply's arrival at the client. A
message is published at the client's send or at its speaker's ``replied``."""


def turn_stages(logs: Sequence[Path], client: Client, since: float) -> dict[str, list[float]]:
    """Where each measured turn's time went: :data:`STAGES`, in ms, one value per message the
    client saw sent or answered since ``since`` (every turn of the conversation, not only the
    client's messages). Reads every node's JSON log; a turn missing an event is skipped."""
    heard: dict[tuple[str, str], float] = {}  # (node, message id) -> its first inbound there
    published: dict[str, tuple[str, float]] = {}  # message id -> (leader, states_published)
    chosen: dict[tuple[str, str], float] = {}  # (node, message id) -> its speaker_chosen naming itself
    replied: dict[str, tuple[str, str, float]] = {}  # message id -> (reply id, speaker, replied)
    for path in logs:
        with open(path, "rb") as f:
            for raw in f:
                if b'"event"' not in raw:
                    continue
                try:
                    e = json.loads(raw)
                except ValueError:
                    continue
                kind, ts = e.get("event"), e.get("ts")
                if not isinstance(ts, float | int):
                    continue
                mid = e.get("message_id")
                if kind == "inbound" and e.get("topic") == "messages":
                    heard.setdefault((str(e.get("node")), str(e.get("id"))), float(ts))
                elif kind == "states_published" and mid:
                    published.setdefault(mid, (str(e.get("companion")), float(ts)))
                elif kind == "speaker_chosen" and mid and e.get("speaker") == e.get("companion"):
                    chosen.setdefault((str(e.get("companion")), mid), float(ts))
                elif kind == "replied" and mid:
                    replied.setdefault(mid, (str(e.get("reply_id")), str(e.get("companion")), float(ts)))
    sent_at = {reply: at for reply, _, at in replied.values()}
    out: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for mid, wall in client.wall.items():
        start = sent_at.get(mid, wall)
        if wall < since or mid not in published or mid not in replied:
            continue
        leader, states_at = published[mid]
        reply, speaker, replied_at = replied[mid]
        got, spoke_at, arrived = heard.get((leader, mid)), chosen.get((speaker, mid)), client.wall.get(reply)
        if got is None or spoke_at is None or arrived is None:
            continue
        steps = (
            got - start,
            states_at - got,
            spoke_at - states_at,
            replied_at - spoke_at,
            arrived - replied_at,
        )
        for stage, seconds in zip(STAGES, steps, strict=True):
            out[stage].append(round(seconds * 1000, 1))
    return out


def describe_stages(stages: dict[str, list[float]]) -> str:
    count = len(stages["to_leader"])
    if not count:
        return "where a turn's time went: no turn had every event logged (--log-level INFO?)"
    parts = [f"{STAGES[k]} {percentile(v, 0.5):.0f}/{percentile(v, 0.9):.0f}" for k, v in stages.items()]
    return f"where a turn's time went (ms p50/p90 of {count} turns, node log stamps): " + ", ".join(parts)


def replied(client: Client, mid: str) -> Callable[[], bool]:
    """For ``Client.wait_until``: whether message ``mid`` has a reply."""
    return lambda: bool(client.replies.get(mid))


def ended_at(client: Client, mid: str) -> Callable[[], bool]:
    """For ``Client.wait_until``: whether the conversation is over, at a message descending from ``mid``."""
    return lambda: client.transcript.over and chain_root(client, client.transcript.current) == mid


def chain_root(client: Client, message: Message | None) -> str | None:
    """The user message a conversation's current message descends from."""
    if message is None:
        return None
    mid = message.params.id
    for _ in range(1000):
        parent = client.reply_to.get(mid)
        if parent is None:
            return mid
        mid = parent
    return None


def chain_latencies(client: Client, reply: str) -> list[float]:
    """Reply -> next reply arrival gaps along the conversation that follows ``reply``."""
    children: dict[str, list[str]] = defaultdict(list)
    for child, parent in client.reply_to.items():
        children[parent].append(child)
    out = []
    current = reply
    for _ in range(1000):
        nxt = children.get(current)
        if not nxt:
            break
        out.append(client.arrivals[nxt[0]] - client.arrivals[current])
        current = nxt[0]
    return out


# --- the table ---------------------------------------------------------------------------------------


def quantiles(values_ms: Sequence[float]) -> tuple[str, str, str]:
    if not values_ms:
        return "-", "-", "-"
    p99 = f"{percentile(values_ms, 0.99):.0f}" if len(values_ms) >= 100 else "-"
    return f"{percentile(values_ms, 0.5):.0f}", f"{percentile(values_ms, 0.9):.0f}", p99


def spread(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{format(statistics.mean(values), fmt)}/{format(max(values), fmt)}"


LEGEND: Final = """\
# present: spawn -> every node sees all N (s); first: client's message -> first reply (ms);
# next: reply -> next reply (ms); once/double/unans: client messages answered once, messages
# answered more than once, client messages never answered; stall: rounds that never ended;
# idle cores: the whole network; node %: idle CPU per node mean/max (% of a core); talk cores:
# network CPU while talking; ms/reply: that CPU per reply (ms of a core); RSS MB: per companion
# mean/max; conns: connections per node min-max (the client's included)"""
HEADER: Final = (
    f"{'N':>3} {'layout':<7} {'network':<9} {'present s':>9} {'first p50':>9} {'p90':>6} {'p99':>6} "
    f"{'next p50':>8} {'p90':>6} {'once':>5} {'double':>6} {'unans':>5} {'stall':>5} "
    f"{'idle cores':>10} {'node %':>11} {'talk cores':>10} {'ms/reply':>8} {'RSS MB':>11} {'conns':>9}"
)


def row(r: dict[str, Any]) -> str:
    f50, f90, f99 = quantiles(r.get("first_ms", []))
    c50, c90, _ = quantiles(r.get("chain_ms", []))
    if r["kind"] != "companion":
        present = "-"
    else:
        present = "timeout" if r.get("present_s") is None else f"{r['present_s']:.1f}"
    conns = r.get("connections") or []
    idle = r.get("idle_cores")
    talk = r.get("talk_cores")
    per_reply = r.get("talk_cpu_per_reply_ms")
    return (
        f"{r['size']:>3} {r['layout']:<7} {r['kind']:<9} {present:>9} {f50:>9} {f90:>6} {f99:>6} "
        f"{c50:>8} {c90:>6} {r.get('answered_once', '-'):>5} {r.get('double_speech', '-'):>6} "
        f"{r.get('unanswered', '-'):>5} {r.get('stalled', '-'):>5} "
        f"{'-' if idle is None else f'{idle:.3f}':>10} {spread(r.get('idle_node_percent', []), '.2f'):>11} "
        f"{'-' if talk is None else f'{talk:.2f}':>10} "
        f"{'-' if per_reply is None else f'{per_reply:.0f}':>8} "
        f"{spread(r.get('rss_mb_per_companion', []), '.0f'):>11} "
        f"{(f'{min(conns)}-{max(conns)}' if conns else '-'):>9}"
    )


def ratios(ours: dict[str, Any], ref: dict[str, Any]) -> str:
    def ratio(a: float | None, b: float | None) -> str:
        if a is None or b is None or b <= 0 or math.isnan(a):
            return "-"
        return f"{a / b:.1f}x"

    def q(r: dict[str, Any], p: float) -> float | None:
        values = r.get("first_ms") or []
        return percentile(values, p) if values else None

    idle = ratio(ours.get("idle_cores"), ref.get("idle_cores"))
    per_reply = ratio(ours.get("talk_cpu_per_reply_ms"), ref.get("talk_cpu_per_reply_ms"))
    return (
        f"    companion/{ref['kind']} ({ours['size']}, {ours['layout']}): first reply "
        f"p50 {ratio(q(ours, 0.5), q(ref, 0.5))}  p90 {ratio(q(ours, 0.9), q(ref, 0.9))}  "
        f"idle CPU {idle}  network CPU per reply {per_reply}"
    )


def describe(r: dict[str, Any]) -> list[str]:
    return [f"    {r['kind']} {r['size']} {r['layout']}: {note}" for note in r.get("notes", [])]


class _Stop:
    """SIGTERM or SIGINT ends the case running now (it reports what it got) and the benchmark."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.why = ""

    async def watch(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.why = signal.Signals(signum).name
                self.scope.cancel()


STOP: Final = _Stop()


async def bench(
    sizes: Sequence[int],
    layouts: Sequence[str],
    options: Options,
    references: Sequence[str],
    as_json: bool,
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(STOP.watch)
        await bench_cases(sizes, layouts, options, references, as_json)
        nursery.cancel_scope.cancel()


async def bench_cases(
    sizes: Sequence[int],
    layouts: Sequence[str],
    options: Options,
    references: Sequence[str],
    as_json: bool,
) -> None:
    if not as_json:
        load = os.getloadavg()
        print(f"# {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at start")
        print(f"# {GOALS}")
        for name in (NODE_CONFIG_ENV, "PY_YAMUX_RELEASE_ON_READ"):
            if os.environ.get(name):
                print(f"# {name}={os.environ[name]}")
        print(LEGEND)
        print(HEADER, flush=True)
    for size in sizes:
        for layout in layouts:
            if STOP.why:
                break
            ours = await run_case(size, layout, "companion", options)
            theirs = []
            for kind in references:
                if STOP.why or (kind == "js" and layout != "process"):
                    continue
                theirs.append(await run_case(size, layout, kind, options))
            for r in (ours, *theirs):
                if as_json:
                    print(json.dumps(r), flush=True)
                else:
                    print(row(r), flush=True)
            if not as_json:
                for r in (ours, *theirs):
                    for line in describe(r):
                        print(line, flush=True)
                for r in theirs:
                    print(ratios(ours, r), flush=True)
    if not as_json:
        load = os.getloadavg()
        print(f"# load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; {GOALS}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--run-companion"]:
        return run_companion(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--bare-worker", nargs="+", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[3, 10, 20, 30], help="companions (3 10 20 30)"
    )
    parser.add_argument("--layouts", nargs="+", choices=("process", "one"), default=["process", "one"])
    parser.add_argument("--rounds", type=int, default=10, help="measured messages from the client (10)")
    parser.add_argument(
        "--turns", type=int, default=3, help="replies a round's conversation has (max_turns, 3)"
    )
    parser.add_argument("--idle", type=float, default=20.0, help="idle window in seconds (20)")
    parser.add_argument("--settle", type=float, default=3.0, help="quiet seconds before the idle window (3)")
    parser.add_argument(
        "--present-timeout", type=float, default=120.0, help="start -> all present bound (120 s)"
    )
    parser.add_argument(
        "--reply-timeout", type=float, default=30.0, help="message -> first reply bound (30 s)"
    )
    parser.add_argument(
        "--round-timeout", type=float, default=60.0, help="bound on one round's conversation (60 s)"
    )
    parser.add_argument("--case-timeout", type=float, default=900.0, help="bound on one whole case (900 s)")
    parser.add_argument("--bootstrap", choices=("hub", "chain"), default="hub")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="companion run --max-connections (default: max(8, companions in the process), "
        "so 8 with one companion per process)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="companion run --log-level (default INFO: the events read here)",
    )
    parser.add_argument("--no-bare", action="store_true", help="skip the bare py-libp2p reference")
    parser.add_argument(
        "--no-js", action="store_true", help="skip the js-libp2p reference (needs Node.js and npm)"
    )
    parser.add_argument("--hold", type=float, default=0.0, help="keep each network up this long at the end")
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args(argv)
    if args.bare_worker is not None:
        bare_worker(args.bare_worker, args.peer)
        return 0
    if min(args.sizes) < 2 or args.rounds < 1 or args.turns < 1 or args.idle <= 0:
        parser.error("sizes >= 2, rounds >= 1, turns >= 1 and idle > 0")
    from libp2p.crypto.ed25519 import create_new_key_pair

    references = [r for r in REFERENCES if not getattr(args, f"no_{r}")]
    js_command: list[str] | None = []
    if "js" in references:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the support package
        from support.js import js_peer_command

        js_command = js_peer_command()
        if js_command is None:
            print("# js reference skipped: no Node.js and npm on this machine", flush=True)
            references.remove("js")
    options = Options(
        rounds=args.rounds,
        turns=args.turns,
        idle=args.idle,
        settle=args.settle,
        present_timeout=args.present_timeout,
        reply_timeout=args.reply_timeout,
        round_timeout=args.round_timeout,
        bootstrap=args.bootstrap,
        max_connections=args.max_connections,
        log_level=args.log_level,
        hold=args.hold,
        case_timeout=args.case_timeout,
        js_command=tuple(js_command or ()),
        client_key=create_new_key_pair(),
    )
    import companion.node.node  # noqa: F401  (py-libp2p resets its loggers on import: import it first)
    from companion.log import configure_logging

    configure_logging("ERROR")  # the client's py-libp2p would print every reset connection
    trio.run(bench, args.sizes, args.layouts, options, references, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
