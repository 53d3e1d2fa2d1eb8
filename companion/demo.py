"""``companion demo``: three companions hold a conversation you can watch.

Three parts, each usable on its own:

- :class:`Transcript` follows a conversation as a bystander sees it (messages and states
  arrays) and explains each turn: who spoke, to whom, why they were chosen, and the closing
  stage. It runs the companions' own state machine (:class:`~companion.conversation.Conversation`)
  as a bystander, so it follows the thread and accepts arrays by the same rules. It also counts
  double speech (two replies to one message), which must never happen.
- :class:`MemoryGroup` runs companions in one process on the in-memory transport, with a
  transcript, fault hooks and a model-call count per turn (tests, the benchmark and
  ``companion demo --in-memory``).
- :func:`run_demo` starts every companion as its own ``companion run CARD`` process on
  127.0.0.1 (a libp2p node with the conversation engine; its standard output says when it
  listens and whom it sees), joins them with a bridge node, sends the opening line and prints
  the transcript until ``terminal`` or the turn cap.
"""

from __future__ import annotations

import logging
import math
import signal
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import trio

from .card import LoadedCard, load_card
from .cli.run import parse_sees
from .conversation import (
    ClosingSettings,
    Conversation,
    Decision,
    Effect,
    MessageSeen,
    StatesSeen,
    Tick,
    present_diff,
    read_signal,
)
from .engine import ConversationEngine, EngineEvent, EngineTimings
from .log import log_event
from .models.base import CompanionModel, ParamsRequest, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from .protocol import MESSAGES, Action, ClosingStage, Message, Metadata, Payload
from .store import MemoryStore
from .transport import Inbound, MemoryEndpoint, MemoryHub
from .turns import turn_info

__all__ = [
    "CountingModel",
    "DemoOptions",
    "Member",
    "MemoryGroup",
    "Transcript",
    "TranscriptEvent",
    "default_cards",
    "kickoff_text",
    "render_text",
    "run_demo",
    "run_in_memory",
]

logger = logging.getLogger("companion.demo")

USER_ID: Final = "user_demo"
"""The sender of the opening line (a client, not a companion)."""


# --- the transcript -----------------------------------------------------------------------------


EventKind = Literal["message", "decision", "end"]


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    """One line of the transcript. ``speaker`` is the sender of a message, or the companion a
    decision chose (``None``: nobody)."""

    kind: EventKind
    speaker: str | None
    recipients: tuple[str, ...] = ()
    text: str = ""
    emotion: str | None = None
    why: str = ""
    closing: ClosingStage = "none"
    turn: int = 0
    message_id: str | None = None
    in_reply_to: str | None = None
    reason: str = ""
    """For ``decision``: the rule that decided; for ``end``: terminal, turn_cap, idle or timeout."""

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.kind,
            "speaker": self.speaker,
            "recipients": list(self.recipients),
            "text": self.text,
            "emotion": self.emotion,
            "why": self.why,
            "closing": self.closing,
            "turn": self.turn,
            "message_id": self.message_id,
            "in_reply_to": self.in_reply_to,
            "reason": self.reason,
        }


class Transcript:
    """A bystander's account of a conversation, fed every message and states array.

    The companions' state machine in bystander mode decides what counts: the thread of the
    companions it is given (``active``), and for each message the first array from a leader
    whose slot is due (a late array of an earlier leader replaces it). Give ``publisher`` (the
    authenticated companion id, or any other name of the signer) and ``now`` to :meth:`feed`
    to apply every rule; without them an array counts as the leader's and every slot as due.
    ``max_turns``: the companions' turn limit, if the bystander should apply it too.
    """

    def __init__(self, *, timings: EngineTimings | None = None, max_turns: int | None = None) -> None:
        timings = timings or EngineTimings.offline()
        self.events: list[TranscriptEvent] = []
        self.replies: dict[str, list[str]] = defaultdict(list)
        self._machine = Conversation(
            None,
            takeover_after=timings.takeover_after,
            reply_timeout=timings.reply_timeout,
            settings=ClosingSettings(max_turns, repetition_threshold=math.inf),
        )
        self._decisions: dict[str, tuple[str | None, str, str]] = {}
        """message id -> (speaker, why, reason) of the array that counted."""

    @property
    def double_speech(self) -> dict[str, list[str]]:
        """Messages that got more than one reply: message id -> the repliers, in order."""
        return {mid: senders for mid, senders in self.replies.items() if len(senders) > 1}

    @property
    def reply_count(self) -> int:
        return sum(len(s) for s in self.replies.values())

    @property
    def current(self) -> Message | None:
        """The message the conversation is at."""
        return self._machine.current

    @property
    def over(self) -> bool:
        """Whether the conversation reached ``terminal`` at the message it is at."""
        decision = self._decisions.get(self._machine.thread.current or "")
        return decision is not None and decision[2] == "terminal"

    def feed(
        self,
        payload: Payload,
        active: Iterable[str],
        *,
        publisher: str | None = None,
        now: float | None = None,
    ) -> list[TranscriptEvent]:
        """The transcript lines this payload adds (none for other payloads)."""
        machine, at = self._machine, math.inf if now is None else now
        for change in present_diff(machine.present, active):
            machine.receive(change, at)
        out: list[TranscriptEvent] = []
        if isinstance(payload, Message):
            fresh = not machine.thread.knows(payload.params.id)
            effects = machine.receive(MessageSeen(payload, publisher), at)
            if fresh and machine.thread.knows(payload.params.id):
                out.append(self._message(payload, effects))
            out.extend(self._lines(effects))
        elif isinstance(payload, list):
            out = self._lines(machine.receive(StatesSeen(payload, publisher), at))
        elif isinstance(payload, Action) and (signal := read_signal(payload)) is not None:
            out = self._lines(machine.receive(signal, at))
        elif now is not None:
            out = self._lines(machine.receive(Tick(), at))
        self.events.extend(out)
        return out

    def deadline(self) -> float | None:
        """When an array held for its leader's slot counts (feed :meth:`tick` then)."""
        return self._machine.deadline()

    def tick(self, now: float) -> list[TranscriptEvent]:
        """The lines time alone adds (an array that waited for its slot)."""
        out = self._lines(self._machine.receive(Tick(), now))
        self.events.extend(out)
        return out

    def _message(self, message: Message, effects: list[Effect]) -> TranscriptEvent:
        params = message.params
        info = turn_info(message)
        why = "opened the conversation"
        if info.in_reply_to is not None:
            self.replies[info.in_reply_to].append(params.from_)
            decision = self._decisions.get(info.in_reply_to)
            if decision is None:
                why = "chosen by states this bystander did not see"
            elif decision[0] == params.from_:
                why = decision[1]
            else:
                why = f"spoke although the rule chose {decision[0]}: {decision[1]}"
        for effect in effects:
            if isinstance(effect, Decision) and effect.event == "message_stale":
                if effect.fields.get("placement") == "stale":
                    why += " (it crossed a newer message; the conversation follows that one)"
                else:
                    why += " (its reply overtook it)"
        emotion = (params.metadata or {}).get("emotion")
        return TranscriptEvent(
            "message",
            params.from_,
            tuple(params.to),
            params.message,
            emotion if isinstance(emotion, str) else None,
            why,
            info.closing,
            info.turn,
            params.id,
            info.in_reply_to,
        )

    def _lines(self, effects: list[Effect]) -> list[TranscriptEvent]:
        out: list[TranscriptEvent] = []
        for effect in effects:
            if not isinstance(effect, Decision) or effect.event != "speaker_chosen":
                continue
            f = effect.fields
            message_id, speaker, reason = f["message_id"], f["speaker"], f["reason"]
            self._decisions[message_id] = (speaker, f["why"], reason)
            out.append(
                TranscriptEvent(
                    "decision",
                    speaker,
                    why=f["why"],
                    closing=f["closing"],
                    turn=f["turn"],
                    message_id=message_id,
                    reason=reason,
                )
            )
            if reason == "terminal":
                out.append(
                    TranscriptEvent(
                        "end", None, why=f["why"], closing="terminal", turn=f["turn"], reason="terminal"
                    )
                )
        return out


def render_text(event: TranscriptEvent, names: Mapping[str, str]) -> str | None:
    """A readable line (or a few) for people; ``None`` for events not worth a line."""

    def name(cid: str | None) -> str:
        return "nobody" if cid is None else names.get(cid, cid)

    def named(text: str) -> str:
        for cid in sorted(names, key=len, reverse=True):
            text = text.replace(cid, names[cid])
        return text

    if event.kind == "message":
        to = ", ".join(name(r) for r in event.recipients) or "everyone"
        tags = [t for t in (event.emotion, f"turn {event.turn}" if event.in_reply_to else None) if t]
        if event.closing != "none":
            tags.append(event.closing)
        head = f"{name(event.speaker)} → {to}" + (f"  [{', '.join(tags)}]" if tags else "")
        return f"{head}\n    “{event.text}”\n    why: {named(event.why)}"
    if event.kind == "decision":
        if event.speaker is None and event.reason != "terminal":
            return f"    (nobody speaks: {named(event.why)})"
        return None
    if event.reason == "terminal":
        return f"— the conversation closed (terminal) after {event.turn} replies"
    return f"— stopped ({event.reason}): {named(event.why)}"


# --- counting model calls -------------------------------------------------------------------------


class CountingModel:
    """Wraps a model and counts its calls by the message each one answers."""

    def __init__(self, inner: CompanionModel, counts: Counter[str] | None = None) -> None:
        self.inner = inner
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.kinds: Counter[str] = Counter()

    @property
    def name(self) -> str:
        return self.inner.name

    def _count(self, kind: str, message: Message) -> None:
        self.counts[message.params.id] += 1
        self.kinds[kind] += 1

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        self._count("decide_states", request.message)
        return await self.inner.decide_states(request)

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        self._count("fill_params", request.message)
        return await self.inner.fill_params(request)

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        self._count("speak", request.message)
        await self.inner.speak(request, call_tool)


# --- in memory ------------------------------------------------------------------------------------


@dataclass
class Member:
    """One companion of a :class:`MemoryGroup`."""

    loaded: LoadedCard
    model: CountingModel
    engine: ConversationEngine
    endpoint: MemoryEndpoint
    directory: dict[str, Metadata]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def id(self) -> str:
        return self.loaded.card.metadata.id


class MemoryGroup:
    """Companions in one process on a :class:`~companion.transport.MemoryHub`, watched by a
    :class:`Transcript`. ``hub.fault`` injects faults per receiver (the bystander endpoint is
    named ``bystander``, or ``name/bystander`` for a named group). Several groups may share a
    hub (give each a ``name`` and its own ``user``): each holds its own conversation."""

    BYSTANDER: Final = "bystander"

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        timings: EngineTimings | None = None,
        hub: MemoryHub | None = None,
        on_event: Callable[[TranscriptEvent], None] | None = None,
        on_engine_event: Callable[[EngineEvent], None] | None = None,
        name: str | None = None,
        user: str = USER_ID,
        max_turns: int | None = None,
    ) -> None:
        """``max_turns``: the transcript applies this turn limit too (the cards' own, if all share it)."""
        self.nursery = nursery
        self.hub = hub or MemoryHub(nursery=nursery)
        if self.hub.nursery is None:
            self.hub.nursery = nursery
        self.timings = timings or EngineTimings.offline()
        self.members: dict[str, Member] = {}
        self.transcript = Transcript(timings=self.timings, max_turns=max_turns)
        self.model_calls: Counter[str] = Counter()
        self.peers: dict[str, tuple[Metadata, MemoryEndpoint, bool]] = {}
        """Companions that run no engine here (an aikyo node, a hostile one): metadata, endpoint,
        whether they take part in the conversation."""
        self.user = user
        self._on_event = on_event
        self._on_engine_event = on_engine_event
        self._changed = trio.Event()
        self._bystander = self.hub.endpoint(self.BYSTANDER if name is None else f"{name}/{self.BYSTANDER}")
        self._user = self.hub.endpoint(user)
        nursery.start_soon(self._watch)

    @property
    def active(self) -> list[str]:
        """The companions of the conversation that are connected (peers that take part included)."""
        members = [cid for cid, m in self.members.items() if m.endpoint.connected]
        return members + [
            cid for cid, (_, ep, takes_part) in self.peers.items() if takes_part and ep.connected
        ]

    def add_peer(self, metadata: Metadata, *, takes_part: bool = True) -> MemoryEndpoint:
        """A companion driven by the caller, not by an engine: every member sees it present (as
        if it proved its id), and it gets an endpoint to publish and receive on."""
        endpoint = self.hub.endpoint(metadata.id)
        self.peers[metadata.id] = (metadata, endpoint, takes_part)
        for member in self.members.values():
            if member.endpoint.connected:
                member.directory[metadata.id] = metadata
        return endpoint

    async def add(self, loaded: LoadedCard, model: CompanionModel) -> Member:
        """Start a companion; every member (and it) learns of the others at once."""
        cid = loaded.card.metadata.id
        if cid in self.members:
            raise ValueError(f"{cid} is already in the group")
        endpoint = self.hub.endpoint(cid)
        directory = {m.id: m.loaded.card.metadata for m in self.members.values() if m.endpoint.connected}
        directory.update({pid: meta for pid, (meta, ep, _) in self.peers.items() if ep.connected})
        directory[cid] = loaded.card.metadata
        counted = CountingModel(model, self.model_calls)
        engine = ConversationEngine(
            loaded,
            counted,
            endpoint,
            directory,
            store=MemoryStore(),
            timings=self.timings,
            observer=self._on_engine_event,
        )
        member = Member(loaded, counted, engine, endpoint, directory)
        for other in self.members.values():
            if other.endpoint.connected:
                other.directory[cid] = loaded.card.metadata
        self.members[cid] = member
        await self.nursery.start(self._serve, member)
        return member

    async def _serve(self, member: Member, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with member.scope:
            async with trio.open_nursery() as nursery:
                member.engine.attach(nursery)
                task_status.started()
                async for inbound in member.endpoint.receive_channel:
                    await member.engine.handle(inbound)

    def kill(self, cid: str, *, leave: bool = True) -> None:
        """Crash a companion: it stops at once. With ``leave``, the others notice it is gone
        (as membership does after a disconnect); without, they still count it as present."""
        member = self.members[cid]
        member.endpoint.disconnect()
        member.scope.cancel()
        if leave:
            self.leave(cid)

    def leave(self, cid: str) -> None:
        for other in self.members.values():
            if other.id != cid:
                other.directory.pop(cid, None)

    async def say(
        self, text: str, *, to: Sequence[str] | None = None, metadata: dict[str, Any] | None = None
    ) -> Message:
        """Send a message from the user (a client) to ``to`` (default: every companion present)."""
        message = Message.create(self.user, list(to if to is not None else self.active), text, metadata)
        await self._user.publish(MESSAGES, message)
        return message

    async def _watch(self) -> None:
        while True:
            deadline = self.transcript.deadline()
            inbound: Inbound | None = None
            with trio.move_on_at(math.inf if deadline is None else deadline):
                inbound = await self._bystander.receive_channel.receive()
            now = trio.current_time()
            if inbound is None:
                lines = self.transcript.tick(now)
            else:
                lines = self.transcript.feed(
                    inbound.payload, self.active, publisher=inbound.sender_peer, now=now
                )
            for event in lines:
                if self._on_event is not None:
                    self._on_event(event)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[Transcript], bool], timeout: float) -> bool:
        """Wait until ``predicate(transcript)`` holds after some payload; ``False`` on timeout."""
        with trio.move_on_after(timeout):
            while not predicate(self.transcript):
                await self._changed.wait()
            return True
        return False

    def calls_per_turn(self) -> dict[str, int]:
        """Model calls by the message they answered (one entry per turn)."""
        return dict(self.model_calls)


def names_of(cards: Iterable[LoadedCard]) -> dict[str, str]:
    """Display names by id: the companions', and "User" for the demo's opening line."""
    names = {c.card.metadata.id: c.card.metadata.name for c in cards}
    names[USER_ID] = "User"
    return names


def kickoff_text(cards: Sequence[LoadedCard]) -> str:
    """An opening line in the cards' language."""
    samples = " ".join(c.card.metadata.sample for c in cards)
    if any("\u3040" <= ch <= "\u9fff" for ch in samples):
        return "みなさん、こんにちは!今日はどんな一日でしたか?"
    return "Hello everyone! What has been the best part of your day so far?"


async def run_in_memory(
    cards: Sequence[LoadedCard],
    *,
    seed: int,
    max_replies: int,
    timeout: float,
    emit: Callable[[TranscriptEvent], None],
    pace: float = 0.0,
    text: str | None = None,
    model: str = "scripted",
    base_url: str | None = None,
) -> TranscriptEvent:
    """The demo in one process, no sockets. Returns the final ``end`` event."""
    from .models.factory import make_model

    offline = model.startswith("scripted")
    timings = EngineTimings.offline(pace) if offline else EngineTimings(pace=pace)
    async with trio.open_nursery() as nursery:
        group = MemoryGroup(nursery, timings=timings, on_event=emit)
        for index, loaded in enumerate(cards):
            await group.add(loaded, make_model(model, base_url=base_url, seed=seed + index))
        await group.say(text or kickoff_text(cards))
        done = await group.wait_until(lambda t: t.over or t.reply_count >= max_replies, timeout)
        end = _end_event(group.transcript, done, max_replies)
        if not group.transcript.over:
            emit(end)
        nursery.cancel_scope.cancel()
    return end


def _end_event(transcript: Transcript, done: bool, max_replies: int) -> TranscriptEvent:
    last_end = next((e for e in reversed(transcript.events) if e.kind == "end"), None)
    if transcript.over and last_end is not None:
        return last_end
    replies = transcript.reply_count
    if done:
        return TranscriptEvent(
            "end", None, why=f"the turn cap of {max_replies} replies", reason="turn_cap", turn=replies
        )
    return TranscriptEvent(
        "end", None, why=f"no terminal after {replies} replies", reason="timeout", turn=replies
    )


# --- separate processes ---------------------------------------------------------------------------


def default_cards(root: Path | None = None) -> list[Path]:
    """The first three cards in ``cards/`` (next to the package, or the working directory)."""
    candidates = [root] if root else [Path.cwd() / "cards", Path(__file__).resolve().parents[1] / "cards"]
    for folder in candidates:
        if folder.is_dir():
            found = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".yaml", ".yml", ".toml"))
            if found:
                return found[:3]
    raise FileNotFoundError(f"no card files found in {', '.join(str(c) for c in candidates)}")


@dataclass(frozen=True)
class DemoOptions:
    cards: Sequence[Path]
    model: str = "scripted"
    base_url: str | None = None
    seed: int = 0
    max_replies: int = 30
    timeout: float = 180.0
    pace: float = 0.5
    text: str | None = None
    in_memory: bool = False
    keep_dir: Path | None = None
    start_timeout: float = 60.0


@dataclass
class _Child:
    card: Path
    process: trio.Process
    log_path: Path
    companion_id: str | None = None
    peer_id: str | None = None
    addrs: list[str] = field(default_factory=list)
    """Full multiaddrs, ``/p2p/PEER`` included."""
    directory: set[str] = field(default_factory=set)
    closed: bool = False
    """Its stdout ended: the process is exiting."""
    changed: trio.Event = field(default_factory=trio.Event)

    def note(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def _read_child(child: _Child, stream: trio.abc.ReceiveStream) -> None:
    """Follow a child's stdout: its peer id, its addresses and its directory lines."""
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            sees = parse_sees(line)
            if sees is not None:
                child.directory = set(sees[1])
            elif line.startswith("companion_") and " peer " in line:
                cid, _, peer = line.partition(" peer ")
                child.companion_id, child.peer_id = cid, peer.strip()
            elif line.strip().startswith("/ip4/") and child.peer_id:
                addr = line.strip()
                child.addrs.append(addr if "/p2p/" in addr else f"{addr}/p2p/{child.peer_id}")
            child.note()
    child.closed = True
    child.note()


async def _wait_child(child: _Child, predicate: Callable[[_Child], bool], timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not predicate(child):
            if child.closed:
                code = await child.process.wait()
                raise RuntimeError(
                    f"companion process for {child.card} exited with {code} before {what}; "
                    f"its log: {child.log_path}"
                )
            await child.changed.wait()
        return
    raise TimeoutError(
        f"companion process for {child.card} did not {what} within {timeout:g} s; log: {child.log_path}"
    )


async def _stop_children(children: Sequence[_Child], grace: float = 10.0) -> None:
    """SIGTERM to each, then SIGKILL to any still running after ``grace`` seconds. Only our
    own children, by their PIDs."""
    running = [c.process for c in children if c.process.returncode is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        for process in running:
            await process.wait()
    for process in running:
        if process.returncode is None:
            log_event(logger, "companion_process_killed", logging.WARNING, pid=process.pid, grace=grace)
            process.kill()
            await process.wait()


class _Watcher:
    """The bridge node's handler: feeds the transcript, prints it, notices the end."""

    def __init__(
        self,
        transcript: Transcript,
        directory: Mapping[str, Metadata],
        emit: Callable[[TranscriptEvent], None],
        companion_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.transcript = transcript
        self.directory = directory
        self.emit = emit
        self.companion_of = companion_of
        self.changed = trio.Event()

    async def handle(self, inbound: Inbound) -> None:
        peer = inbound.sender_peer
        publisher = (self.companion_of(peer) if self.companion_of else None) or peer
        lines = self.transcript.feed(
            inbound.payload, self.directory, publisher=publisher, now=trio.current_time()
        )
        for event in lines:
            self.emit(event)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_until(self, predicate: Callable[[Transcript], bool], timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate(self.transcript):
                await self.changed.wait()
            return True
        return False


async def run_demo(options: DemoOptions, emit: Callable[[TranscriptEvent], None]) -> TranscriptEvent:
    """Start one process per card on 127.0.0.1, open the conversation, follow it to the end."""
    from .node import CompanionNode, NodeConfig

    loaded = [load_card(path) for path in options.cards]
    sink, finished = emit, False

    def gated(event: TranscriptEvent) -> None:
        """Nothing after the end line (companions may still talk while they are stopped)."""
        nonlocal finished
        if not finished:
            sink(event)
            finished = event.kind == "end"

    emit = gated
    if options.in_memory:
        return await run_in_memory(
            loaded,
            seed=options.seed,
            max_replies=options.max_replies,
            timeout=options.timeout,
            emit=emit,
            pace=options.pace,
            text=options.text,
            model=options.model,
            base_url=options.base_url,
        )
    ids = [c.card.metadata.id for c in loaded]
    workdir = options.keep_dir or Path(tempfile.mkdtemp(prefix="companion-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    offline = options.model.startswith("scripted")
    timings = EngineTimings.offline(options.pace) if offline else EngineTimings(pace=options.pace)
    transcript = Transcript(timings=timings)
    bridge = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="demo-bridge"))
    watcher = _Watcher(transcript, bridge.directory, emit, bridge.membership.companion_of)
    children: list[_Child] = []
    bridge_scope = trio.CancelScope()

    async def run_bridge(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with bridge_scope:
            await bridge.run(watcher, task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_bridge)
        try:
            bridge_addr = f"{bridge.listen_addrs[0]}/p2p/{bridge.peer_id}"
            for index, card in enumerate(options.cards):
                peers = [bridge_addr, *(c.addrs[0] for c in children)]
                child = await _spawn(nursery, card, index, peers, options, workdir)
                children.append(child)
                await _wait_child(child, lambda c: bool(c.addrs), options.start_timeout, "start listening")
            for child in children:
                await _wait_child(
                    child, lambda c: set(ids) <= c.directory, options.start_timeout, "meet the others"
                )
            if not await bridge.wait_for(lambda: set(ids) <= set(bridge.directory), options.start_timeout):
                raise TimeoutError(
                    f"the bridge did not meet every companion within {options.start_timeout:g} s"
                )
            log_event(logger, "demo_ready", companions=ids, workdir=str(workdir))
            opening = Message.create(USER_ID, ids, options.text or kickoff_text(loaded))
            end = await _converse(bridge, watcher, opening, options)
            if not watcher.transcript.over:
                emit(end)  # (a terminal end is already in the transcript)
            return end
        finally:
            bridge_scope.cancel()  # first, so it does not try to redial companions that stop
            with trio.CancelScope(shield=True):
                await _stop_children(children)
            nursery.cancel_scope.cancel()


async def _converse(
    bridge: Any, watcher: _Watcher, opening: Message, options: DemoOptions
) -> TranscriptEvent:
    """Send the opening line (again with the same id until someone reacts: the gossip mesh
    forms on a heartbeat), then follow the conversation to its end."""
    started = False
    with trio.move_on_after(options.timeout):
        while not started:
            await bridge.publish(MESSAGES, opening)  # the same id: a node that has it ignores it
            started = await watcher.wait_until(lambda t: any(e.kind != "message" for e in t.events), 3.0)
    transcript = watcher.transcript
    if not started:
        return TranscriptEvent("end", None, why="no companion answered the opening line", reason="timeout")
    done = await watcher.wait_until(lambda t: t.over or t.reply_count >= options.max_replies, options.timeout)
    return _end_event(transcript, done, options.max_replies)


async def _spawn(
    nursery: trio.Nursery, card: Path, index: int, peers: list[str], options: DemoOptions, workdir: Path
) -> _Child:
    log_path = workdir / f"{card.stem}.log"
    command = [
        sys.executable,
        "-m",
        "companion.cli.run",
        str(card),
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(workdir / "data"),
        "--model",
        options.model,
        "--seed",
        str(options.seed + index),
        "--pace",
        str(options.pace),
        "--log-format",
        "json",
    ]
    if options.base_url:
        command += ["--base-url", options.base_url]
    for peer in peers:
        command += ["--peer", peer]
    log_file = log_path.open("wb")
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, stderr=log_file)
    log_file.close()
    child = _Child(card, process, log_path)
    assert process.stdout is not None
    nursery.start_soon(_read_child, child, process.stdout)
    log_event(logger, "companion_process_started", card=str(card), pid=process.pid, log=str(log_path))
    return child
