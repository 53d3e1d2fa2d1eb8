"""A live companion network for client tests: companions with the conversation engine (each its
own process, offline scripted model) and a bridge, all on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import trio

from companion.app.lines import BRIDGE_LINE, parse_sees
from companion.conversation.transcript import Transcript, TranscriptEvent
from companion.memory import Inbound
from companion.protocol import ACTIONS, MESSAGES, QUERIES, STATES, Payload, PayloadError, parse_payload
from support.cards import speaking_card, write_card
from support.live_bridge import start_bridge
from support.network import Network, Proc

PIM, OSTRA = "companion_pim", "companion_ostra"
BOTH = frozenset({PIM, OSTRA})


@dataclass
class Live:
    bridge: Proc
    port: int
    companions: dict[str, Proc]


def spawn_run(
    net: Network, name: str, cards: list[Path], *peers: str, seed: int = 0, extra: tuple[str, ...] = ()
) -> Proc:
    """``companion run CARD...`` on 127.0.0.1 (scripted models, JSON logs on stderr), not waiting
    for it to start (to start many at once)."""
    argv = [
        sys.executable,
        "-m",
        "companion.cli.run",
        *map(str, cards),
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(net.tmp / f"data-{name}"),
        "--seed",
        str(seed),
        "--log-format",
        "json",
        "-v",  # the events these tests wait for are INFO
        *extra,
    ]
    for peer in peers:
        argv += ["--peer", peer]
    proc = Proc(name, argv, warm=net.warm)
    net.procs.append(proc)
    return proc


def start_run(
    net: Network, name: str, cards: list[Path], *peers: str, seed: int = 0, extra: tuple[str, ...] = ()
) -> Proc:
    """:func:`spawn_run`, returning once every node has started."""
    proc = spawn_run(net, name, cards, *peers, seed=seed, extra=extra)
    proc.wait_for(  # one ``started`` event per node
        lambda e: e.get("event") == "started" and proc.count("started") >= len(cards),
        30,
        "every node started",
    )
    return proc


def start_companion(
    net: Network, key: str, name: str, tool: str, *peers: str, seed: int = 0, extra: tuple[str, ...] = ()
) -> tuple[Proc, str]:
    """One companion with the engine (``companion run``, scripted model); returns its address."""
    card = write_card(net.tmp, key, speaking_card(key, name, tool))
    proc = start_run(net, key, [card], *peers, seed=seed, extra=extra)
    return proc, proc.event("started", 1)["addrs"][0]


def stdout_line(proc: Proc, predicate: Callable[[str], bool], timeout: float, *, since: int = 0) -> str:
    """The first line (already printed or coming) that satisfies ``predicate``, from line
    ``since`` on (``len(proc.lines)`` taken before an action: what only the action can have
    caused); fails after ``timeout``. (``Proc`` records every output line.)"""
    return proc.first(proc.lines, predicate, timeout, "matching output line", since)


def start_pim_and_ostra(
    net: Network, pace: float, *, ws: bool = True, extra: tuple[str, ...] = ()
) -> tuple[Proc, str]:
    """``companion run pim ostra`` (the shipped cards, offline models, data in
    ``net.tmp/data-home``) with ``--ws``, or without it beside a ``companion bridge`` it dials;
    returns the process and the bridge's URL once both companions see each other and the
    bridge sees both. ``extra``: more arguments of ``companion run`` (a model)."""
    extra = ("--pace", str(pace), *extra)
    cards = [Path("pim"), Path("ostra")]
    if ws:
        proc = start_run(net, "home", cards, extra=(*extra, "--ws", "127.0.0.1:0", "--no-webrtc"))
        line = stdout_line(proc, lambda s: s.startswith(BRIDGE_LINE), 30)
        url = line[len(BRIDGE_LINE) :].strip()
    else:
        bridge, port, started = start_bridge(net, "bridge")
        proc = start_run(net, "home", cards, str(started["addrs"][0]), extra=extra)
        for cid in BOTH:
            bridge.event("companion_joined", 30, companion_id=cid)
        url = f"ws://127.0.0.1:{port}/"
    for cid in BOTH:
        stdout_line(proc, lambda s, cid=cid: parse_sees(s) == (cid, BOTH), 30)  # type: ignore[misc]
    return proc, url


def start_live(net: Network, *, bridge_args: tuple[str, ...] = ()) -> Live:
    """Two companions — Juniper answers through ``speak_with_voice`` (a speak query first), Pim
    through ``speak`` — and a bridge that knows both (``bridge_args``: more arguments of
    ``companion bridge``). The bridge starts first, so the companions can be told to take its
    clients' answers (``--approver``): a separate bridge is just another peer to them otherwise."""
    bridge, port, started = start_bridge(net, "bridge", extra=bridge_args)
    trusted = ("--approver", str(started["peer_id"]))
    b_addr = str(started["addrs"][0])
    juniper, j_addr = start_companion(
        net, "juniper", "Juniper", "speak_with_voice", b_addr, seed=1, extra=trusted
    )
    pim, _ = start_companion(net, "pim", "Pim", "speak", j_addr, b_addr, seed=2, extra=trusted)
    for key in ("juniper", "pim"):
        bridge.event("companion_joined", 30, companion_id=f"companion_{key}")
    juniper.event("companion_joined", 30, companion_id="companion_pim")
    pim.event("companion_joined", 30, companion_id="companion_juniper")  # both see both
    return Live(bridge, port, {"juniper": juniper, "pim": pim})


def payload_of(frame: str) -> Payload | None:
    """A Firehose frame (the raw JSON of a payload) as the typed payload, its topic inferred from
    its shape; ``None`` for error frames and anything else."""
    try:
        obj = json.loads(frame)
    except ValueError:
        return None
    if isinstance(obj, list):
        topic = STATES
    elif not isinstance(obj, dict) or ("error" in obj and "jsonrpc" not in obj):
        return None
    elif obj.get("method") == "message.send":
        topic = MESSAGES
    elif obj.get("method") == "action.send":
        topic = ACTIONS
    else:
        topic = QUERIES
    parsed = parse_payload(topic, frame.encode())
    return None if isinstance(parsed, PayloadError) else parsed


def bridge_url(proc: Proc) -> str:
    """The WebSocket URL from the ``bridge ws://...`` line on standard output."""
    line = stdout_line(proc, lambda s: s.startswith(BRIDGE_LINE), 30)
    url = line[len(BRIDGE_LINE) :].strip()
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/"), line
    return url


class Bystander:
    """A test node's handler: the transcript of the conversation among the companions
    ``present()`` names, and an event that wakes whoever waits for a change."""

    def __init__(self, present: Callable[[], Iterable[str]]) -> None:
        self.present = present
        self.transcript = Transcript()
        self.lines: list[TranscriptEvent] = []
        self.changed = trio.Event()

    async def handle(self, inbound: Inbound) -> None:
        self.lines.extend(self.transcript.feed(inbound.payload, self.present()))
        self.changed.set()
        self.changed = trio.Event()

    async def wait_until(self, predicate: Callable[[Transcript], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate(self.transcript):
                await self.changed.wait()
            return True
        return False
