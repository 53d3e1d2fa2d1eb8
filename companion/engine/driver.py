"""The trio driver of one companion's :class:`~companion.conversation.machine.Conversation`.

Every rule lives in the state machine; this module moves things in and out of it. In: each
inbound payload becomes an event (a message only once the store recorded it, so a failing write
leaves the conversation as it was), directory changes become joined/left events
(:mod:`companion.engine.directory`), a timer feeds a tick at the machine's deadline; the clock
is read only to pass ``now`` in. Out: each effect is carried out by the driver's method for its
type (:mod:`companion.engine.effects`), under its deadline -- the turn's work
(:mod:`companion.engine.work`: the leader's states, the speaker's reply), publishing
(``publish_timeout``, :class:`~companion.engine.gate.Publishes`), cancelling, each decision
logged (and told to the ``observer``). An event that arises while effects are carried out waits
in a queue, fed once they all are: the machine is never entered twice at once. Beside the
turns: the routines (:mod:`companion.engine.routines`) and the tool lists, ours and the peers'
(:mod:`companion.engine.tools`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.actions import ActionRuntime, KeyValueStore
from companion.card.model import LoadedCard
from companion.conversation import events as ev
from companion.conversation.machine import Conversation
from companion.conversation.state import ClosingSettings
from companion.engine import work
from companion.engine.directory import DirectoryFollower
from companion.engine.effects import EFFECTS, EffectMethods
from companion.engine.gate import Gate, Publishes
from companion.engine.routines import RoutineDriver, not_a_routine
from companion.engine.speech import Speaker, Speech, prepares
from companion.engine.tools import PeerTools, ToolsAnnouncer
from companion.engine.work import EngineEvent, Job
from companion.log import log_event
from companion.models.base import CompanionModel
from companion.ports import ConversationStore, Inbound, NodeLike, Publisher
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    PREVIEWS,
    QUERIES,
    STATES,
    Action,
    Message,
    Metadata,
    QueryResult,
)
from companion.store.history import HistoryReader
from companion.store.sqlite import MemoryStore
from companion.timings import EngineTimings

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["ConversationEngine", "EngineEvent", "EngineTimings", "NodeLike"]

logger = logging.getLogger("companion.engine.driver")

_REPLAY: Final = 256  # messages read back at start-up: where the conversation was


class ConversationEngine(EffectMethods):
    """One companion's conversation: ``await nursery.start(engine.run)`` in a nursery you own (its
    turn work, timers and model calls run there), then :meth:`handle` each payload (it returns at once)."""

    def __init__(
        self,
        loaded: LoadedCard,
        model: CompanionModel,
        publisher: Publisher,
        directory: Mapping[str, Metadata],
        *,
        store: ConversationStore | None = None,
        timings: EngineTimings | None = None,
        observer: Callable[[EngineEvent], None] | None = None,
        companion_of: Callable[[str], str | None] | None = None,
        kv: KeyValueStore | None = None,
    ) -> None:
        """``directory`` and ``companion_of``: see :class:`companion.ports.Directory` (without
        ``companion_of``, in memory, a sender name that is a known companion id is taken as is).
        ``store``: see :class:`companion.ports.ConversationStore` (default: in memory).
        ``kv``: the tools' key-value memory (default: in memory; the engine does not close it)."""
        self.loaded, self.card, self.me = loaded, loaded.card, loaded.card.metadata
        self.model, self.directory = model, directory
        self.timings = timings or EngineTimings()
        self.store: ConversationStore = store if store is not None else MemoryStore()
        self._gate = Gate(publisher, self.me.id)  # everything goes out through it (closed by stop)
        self._observer = observer
        settings = ClosingSettings(self.card.settings.max_turns, self.card.settings.repetition_threshold)
        self.conversation = Conversation(
            self.me.id,
            takeover_after=self.timings.takeover_after,
            reply_timeout=self.timings.reply_timeout,
            settings=settings,
            known=self.store.known_companions(),
            replied=self.store.replied_ids(),
        )
        self._publisher_of = companion_of or (lambda peer: peer if peer in self.conversation.known else None)
        for message in self.store.recent(_REPLAY):  # where the conversation was before a restart
            self.conversation.receive(ev.MessageSeen(message, replayed=True), 0.0)
        self.runtime = ActionRuntime(
            metadata=self.me,
            publisher=self._gate,
            directory=directory,
            history=HistoryReader(self.store),  # the engine records each message once, on arrival
            outgoing=lambda topic, envelope: self._outgoing(topic, envelope),  # (bound below)
            kv=kv,
        )
        for defn in loaded.tools.values():
            self.runtime.register(defn)
        self.routines = RoutineDriver(
            loaded.routines,
            self.runtime,
            me=self.me.id,
            in_turn=lambda: bool(self._tasks) or self.conversation.in_turn,
            reply_timeout=self.timings.reply_timeout,
            emit=self._emit,
            quiet_start=self.timings.routine_quiet_start,
            rejoin_grace=self.timings.rejoin_grace,
        )
        self.announcer = ToolsAnnouncer(
            self.runtime, self._gate, emit=self._emit, publish_timeout=self.timings.publish_timeout
        )
        self.peer_tools = PeerTools(
            self.me.id, directory, follows=self.conversation.follows_slots, emit=self._emit
        )
        self._speaker = Speaker(loaded, model, self.runtime, directory, self._emit)
        self._pipelines = self.timings.pipeline and prepares(model, ahead=True)
        """Whether the next turn starts from previews (:mod:`companion.conversation.preview`):
        this companion publishes its voiced lines' previews and works ahead from its peers'."""
        if self._pipelines:
            self._speaker.preview = self._preview
        self._store_health = work.StoreHealth(self._emit)
        self._work = work.TurnWork(
            model, directory, self.store, self.timings, self._speaker, self.conversation, self._emit
        )
        self._directory = DirectoryFollower(
            self.me, directory, self.conversation, self.store, self._store_health, self._feed
        )
        self._directory.tell(self.routines, self.announcer, self.peer_tools)
        self._tasks: dict[tuple[str, str], work.Work] = {}
        self._outgoing = work.Outgoing(
            self.me.id, self._work, self._gate, self.routines, self._tasks, self._store_health, self._feed
        )
        self._nursery: trio.Nursery | None = None
        self._queue: deque[ev.Event] = deque()
        self._feeding = False
        self._wake = trio.Event()
        self._settled = trio.Event()
        """Set whenever a turn task or a publish ends (:meth:`stop` waits for none to run)."""
        self._publishes = Publishes(
            self._gate, self.timings.publish_timeout, self._emit, lambda: self._settled.set()
        )

    @property
    def history(self) -> ConversationStore:  # the conversation's messages: the store
        return self.store

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the turn work, the clock, the routines and the tool announcements until cancelled
        (:meth:`handle` may be called once it has started). Once it ended, what still arrives is
        recorded, and nothing goes out."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._clock)
                await nursery.start(self.routines.run, self.directory)
                nursery.start_soon(self.announcer.run, self.timings.routine_quiet_start)
                task_status.started()
        finally:
            self._nursery, self._gate.stopping, self._gate.closed = None, True, True

    async def stop(self, grace: float) -> None:
        """Stop taking turns, before the node stops: no routine speaks; a lead or a reply in
        flight has ``grace`` seconds, then it is withdrawn (rule-based states, a yield: the others
        go on at once), except a reply whose line a client is hearing: it says no more and
        publishes what was heard (within ``publish_timeout``); the publishes in flight finish
        (``publish_timeout``). Then nothing goes out (:class:`Gate`); every message that still
        arrives is recorded."""
        self._gate.stopping = True
        # No slot opens now, so a prepared reply is dropped, unless its slot is open already: a
        # reply in flight, which the grace is for, and which would ask the model again for it.
        speaking = next((message_id for what, message_id in self._tasks if what == "speech"), None)
        self._speaker.keep_prepared(speaking, "stopping")
        self._work.stop_ahead("stopping")  # nor will a lead take the states asked from a preview
        with trio.move_on_after(grace):
            await self._settle(lambda: bool(self._tasks))
        if self._tasks and self._speaker.cut_short("stopping"):
            # a line still being voiced: it says no more, and its reply publishes what was heard
            with trio.move_on_after(self.timings.publish_timeout):
                await self._settle(lambda: bool(self._tasks))
        for (what, message_id), job in list(self._tasks.items()):
            job.scope.cancel()
            self._emit("withdrawn", logging.INFO, what=what, message_id=message_id, reason="stopping")
            if what == "lead":
                self._feed(ev.StatesReady(message_id, None, "fallback_stopping"))
            elif not self.conversation.replied(message_id):
                self._feed(ev.SpeakingFailed(message_id, "stopping"))
        with trio.move_on_after(self.timings.publish_timeout):
            await self._settle(lambda: bool(self._tasks or self._publishes.in_flight))
        self._gate.closed = True

    def _taking_work(self) -> trio.Nursery | None:
        """The nursery new work goes to; ``None`` once the engine ends (its nursery cancelled)."""
        nursery = self._nursery
        return None if nursery is None or nursery.cancel_scope.cancel_called else nursery

    async def _settle(self, busy: Callable[[], bool]) -> None:
        while busy():
            self._settled = trio.Event()
            await self._settled.wait()

    async def _clock(self) -> None:
        """Feed a tick at the machine's deadline; any event may move the deadline."""
        while True:
            wake = self._wake = trio.Event()
            deadline = self.conversation.deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await wake.wait()
                continue
            self._feed(ev.Tick())

    async def handle(self, inbound: Inbound) -> None:
        """Take one payload that passed the node's edge. Returns at once."""
        if not self._gate.stopping and self._nursery is None:
            raise RuntimeError("the engine is not running: start run() in a nursery first")
        self._directory.sync()
        payload, publisher = inbound.payload, self._publisher_of(inbound.sender_peer)
        if inbound.topic == MESSAGES and isinstance(payload, Message):
            seen = ev.MessageSeen(payload, publisher)
            self.routines.heard(seen)
            self._on_message(seen)
        elif inbound.topic == STATES and isinstance(payload, list):
            self._feed(ev.StatesSeen(payload, publisher))
        elif inbound.topic == ACTIONS and isinstance(payload, Action):
            signal = ev.read_signal(payload)
            if signal is not None:
                self._feed(replace(signal, publisher=publisher))
            else:
                self.peer_tools.note(payload, publisher)
        elif inbound.topic == QUERIES and isinstance(payload, QueryResult):
            self.runtime.deliver_query_result(payload)
        elif inbound.topic == PREVIEWS and isinstance(payload, Message) and self._pipelines:
            self._feed(ev.MessagePreviewed(payload, publisher))

    def _on_message(self, seen: ev.MessageSeen) -> None:
        message = seen.message
        if not self.conversation.belongs(message, seen.info):
            self._feed(seen)  # it only notes what the message answers
            return
        try:
            fresh = self.store.record(message)
        except Exception as exc:
            self._store_health("record", exc, message_id=message.params.id)
            return
        self._store_health("record")
        if not fresh:
            self._emit("message_duplicate", logging.DEBUG, message_id=message.params.id)
            return
        self._feed(seen)
        nursery = self._taking_work()
        if nursery is not None and self.conversation.may_speak_in(message):
            self._work.prefetch(message, nursery)

    def directory_changed(self, _event: object = None) -> None:
        """The directory changed (a membership listener): a companion that joins and leaves between
        two payloads must still become known, or it could never lead."""
        if self._nursery is not None or self._gate.stopping:
            self._directory.sync()

    def _feed(self, event: ev.Event) -> None:
        """Feed ``event`` and carry out its effects; one fed while effects are carried out waits
        its turn (the machine sees the effects of one event through before the next)."""
        self._queue.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._queue:
                for effect in self.conversation.receive(self._queue.popleft(), trio.current_time()):
                    self._do(effect)
        finally:
            self._feeding = False
        kept = self.conversation.prepared_for  # a reply prepared for it may go on
        self._speaker.keep_prepared(kept, "" if kept else "the turn went to another speaker or ended")
        self._wake.set()
        self.routines.poke()

    def _emit(self, kind: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(logger, kind, level, companion=self.me.id, **fields)
        if self._observer is not None:
            self._observer(EngineEvent(kind, self.me.id, fields, level))

    def _do(self, effect: ev.Effect) -> None:
        EFFECTS[type(effect)](self, effect)  # complete: checked at import

    def _start(self, what: str, message_id: str, job: Job, speech: Speech | None = None) -> None:
        nursery = self._taking_work()
        if nursery is None:
            return job.close()
        held = self._tasks[(what, message_id)] = work.Work(trio.CancelScope(), speech)

        async def run() -> None:
            not_a_routine()  # turn work, even when a routine's call set it off
            try:
                with held.scope:
                    event = await job
                    if event is not None:  # what the work gives (the states, a yield)
                        self._feed(event)
            finally:
                if self._tasks.get((what, message_id)) is held:
                    del self._tasks[(what, message_id)]
                self._settled.set()
                self.routines.poke()

        nursery.start_soon(run)

    def _preview(self, message: Message) -> None:
        """This companion's voiced line is complete: its message, stamped as it will go out,
        published on :data:`~companion.protocol.PREVIEWS` while it is voiced."""
        stamped = self.conversation.outgoing(message)
        if isinstance(stamped, Message):
            self._publishes.start(self._taking_work(), PREVIEWS, stamped, message.params.id)
