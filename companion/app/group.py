"""Companions in one process on the in-memory transport, watched by a bystander's transcript.

:class:`MemoryGroup` starts one conversation engine per card on a
:class:`~companion.memory.MemoryHub` (no sockets), lets a person speak, feeds a
:class:`~companion.conversation.transcript.Transcript` from a bystander endpoint, injects faults per receiver
and counts model calls per turn. The unit tests, the fault suite, the benchmarks and
``companion demo --in-memory`` run conversations with it, as ``async with MemoryGroup() as
group:``: the group's engines and its transcript run in a nursery of its own until the block ends.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.app.changes import Changes
from companion.card.model import LoadedCard
from companion.conversation.transcript import Transcript, TranscriptEvent
from companion.engine.driver import ConversationEngine, EngineEvent, EngineTimings
from companion.memory import Inbound, MemoryEndpoint, MemoryHub
from companion.models.base import CompanionModel, ModelCall, ModelWrapper
from companion.protocol import MESSAGES, PREVIEWS, Message, Metadata
from companion.store.sqlite import MemoryStore
from companion.tasks import OwnsTasks

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["USER_ID", "CountingModel", "Member", "MemoryGroup"]

USER_ID: Final = "user_demo"
"""The person of a group (the sender of the demo's opening line: a client, not a companion)."""


# --- counting model calls -------------------------------------------------------------------------


class CountingModel(ModelWrapper):
    """Wraps a model and counts its calls by the message each one answers."""

    def __init__(self, inner: CompanionModel, counts: Counter[str] | None = None) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.kinds: Counter[str] = Counter()

    def _around(self, call: ModelCall, message: Message) -> AbstractContextManager[object]:
        self.counts[message.params.id] += 1
        self.kinds[call] += 1
        return nullcontext()


# --- the group ------------------------------------------------------------------------------------


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


class MemoryGroup(OwnsTasks):
    """Companions in one process on a :class:`~companion.memory.MemoryHub`, watched by a
    :class:`Transcript`. ``hub.fault`` injects faults per receiver (the bystander endpoint is
    named ``bystander``, or ``name/bystander`` for a named group). Several groups may share a
    hub (give each a ``name`` and its own ``user``): each holds its own conversation, and the
    hub is opened by whoever made it. Members are added once the group is open
    (``async with group:``); leaving the block stops every engine and the transcript."""

    BYSTANDER: Final = "bystander"

    def __init__(
        self,
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
        self.hub = hub or MemoryHub()
        self._hub_is_ours = hub is None
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
        self._changes = Changes()
        self._bystander = self.hub.endpoint(self.BYSTANDER if name is None else f"{name}/{self.BYSTANDER}")
        self._user = self.hub.endpoint(user)

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The hub too, when the group made it (a shared hub is its maker's to open)."""
        hub: AbstractAsyncContextManager[object] = self.hub if self._hub_is_ours else nullcontext()
        async with hub, super()._lifetime():
            self.tasks.start_soon(self._watch)
            yield

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
        nursery = self.tasks  # (the group is open)
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
                other.engine.directory_changed()  # as a membership listener would
        self.members[cid] = member
        await nursery.start(self._serve, member)
        return member

    async def _serve(self, member: Member, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with member.scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(member.engine.run)
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
                if other.endpoint.connected:
                    other.engine.directory_changed()

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
            elif inbound.topic == PREVIEWS:  # a line still being voiced: shown when its message comes
                continue
            else:
                lines = self.transcript.feed(
                    inbound.payload, self.active, publisher=inbound.sender_peer, now=now
                )
            for event in lines:
                if self._on_event is not None:
                    self._on_event(event)
            self._changes.note()

    async def wait_until(self, predicate: Callable[[Transcript], bool], timeout: float) -> bool:
        """Wait until ``predicate(transcript)`` holds after some payload; ``False`` on timeout."""
        return await self._changes.wait_until(lambda: predicate(self.transcript), timeout)

    def calls_per_turn(self) -> dict[str, int]:
        """Model calls by the message they answered (one entry per turn)."""
        return dict(self.model_calls)
