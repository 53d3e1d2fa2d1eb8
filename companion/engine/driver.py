"""The conversation engine: the trio driver of one companion's
:class:`~companion.conversation.machine.Conversation`.

Every rule lives in the state machine; this module moves things in and out of it. In: each
inbound payload becomes an event (a message only once the store recorded it, so a failing write
leaves the conversation as it was), directory changes become joined/left events, a timer feeds a
tick at the machine's deadline; the clock is read only to pass ``now`` in. Out: effects run under
their deadlines -- ``decide_states`` (``states_timeout``, else rule-based states), the speaker's
work (:mod:`companion.engine.speech`, ``speak_timeout``, else a yield), publishing (``publish_timeout``),
cancelling, and each decision as one structured log event (and to the optional ``observer``).
The echo rule (:mod:`companion.ports`) makes this node's own reply and states count when they
come back; the runtime's outgoing hook stamps the reply and notes in the store, before it leaves,
that its message was answered, so a restarted node never answers it again.

Beside the turns: the card's routines run from a :class:`~companion.engine.routines.RoutineDriver`
(fed every message, join and leave; a conversation counts as running while a turn is open here,
or until ``reply_timeout`` after the last message anyone sent, unless it closed ``terminal``),
the tool list goes out as ``companion.tools`` (:mod:`companion.engine.tools`) and the peers'
lists are kept in :attr:`ConversationEngine.peer_tools`. Tools keep their
:attr:`~companion.actions.ActionContext.store` in ``kv`` (the companion's SQLite file). A tool's
notes reach the model's next step through the tool's answer within the speaker's turn only.
"""

from __future__ import annotations

import logging
import math
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import trio

from companion.actions import ActionRuntime, KeyValueStore
from companion.card.model import LoadedCard
from companion.card.routines import CompanionJoined as RoutineJoined
from companion.card.routines import CompanionLeft as RoutineLeft
from companion.card.routines import MessageSeen as RoutineMessage
from companion.conversation import machine as cv
from companion.conversation.rules import turn_info
from companion.engine.routines import RoutineDriver, current_firing, not_a_routine
from companion.engine.speech import Speaker, Speech
from companion.engine.tools import ToolsAnnouncer, read_tools
from companion.log import log_event
from companion.models.base import CompanionModel, ModelError, StatesRequest
from companion.ports import ConversationStore, Inbound, NodeLike, Publisher
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Envelope,
    Message,
    Metadata,
    QueryResult,
    State,
)
from companion.store.history import HistoryReader
from companion.store.sqlite import MemoryStore, StoreError
from companion.timings import EngineTimings

__all__ = ["ConversationEngine", "EngineEvent", "EngineTimings", "NodeLike"]

logger = logging.getLogger("companion.engine.driver")

_UNRECORDED: Final = "this companion could not record its reply, so it is not sent; finish without speaking"
_STOPPING: Final = "this companion is stopping; finish without speaking"
_PREPARING: Final = frozenset({cv.Phase.AWAITING_STATES, cv.Phase.LEADING, cv.Phase.SPEAKING})
"""The phases in which a reply prepared for the turn's message may still be this node's."""
_REPLAY: Final = 256
"""Messages read back from the store at start-up to restore where the conversation is."""


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One decision or happening, as logged: ``kind`` is the log event name."""

    kind: str
    companion: str
    fields: Mapping[str, Any]
    level: int = logging.INFO
    """The log level it was logged at (a decision's record keeps INFO and above)."""


class ConversationEngine:
    """One companion's conversation. Bind it to a nursery you own with :meth:`attach` (turn work,
    timers and model calls, runs there), then feed it every inbound payload with :meth:`handle`,
    which returns at once."""

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
        self._gate = _Gate(publisher, self.me.id)
        publisher = self._gate  # everything goes out through it (closed by stop)
        self._publisher: Publisher = publisher
        self._observer, self._companion_of = observer, companion_of
        settings = cv.ClosingSettings(self.card.settings.max_turns, self.card.settings.repetition_threshold)
        self.conversation = cv.Conversation(
            self.me.id,
            takeover_after=self.timings.takeover_after,
            reply_timeout=self.timings.reply_timeout,
            settings=settings,
            known=self.store.known_companions(),
        )
        self._remembered = set(self.conversation.known) - {self.me.id}
        for message in self.store.recent(_REPLAY):  # where the conversation was before a restart
            self.conversation.receive(cv.MessageSeen(message, replayed=True), 0.0)
        self.runtime = ActionRuntime(
            metadata=self.me,
            publisher=publisher,
            directory=directory,
            history=HistoryReader(self.store),  # the engine records each message once, on arrival
            outgoing=self._outgoing,
            kv=kv,
        )
        for defn in loaded.tools.values():
            self.runtime.register(defn)
        self._last_activity = -math.inf
        self._names: dict[str, str] = {}
        # a message that names a companion prefers it as its speaker (this one's name included)
        self.conversation.names = ChainMap(self._names, {self.me.id: self.me.name})
        self.routines = RoutineDriver(
            loaded.routines,
            self.runtime,
            me=self.me.id,
            busy_until=self._busy_until,
            spoke=self._routine_spoke,
            emit=self._emit,
            quiet_start=self.timings.routine_quiet_start,
            rejoin_grace=self.timings.rejoin_grace,
        )
        self.announcer = ToolsAnnouncer(
            self.runtime, publisher, emit=self._emit, publish_timeout=self.timings.publish_timeout
        )
        self.peer_tools: dict[str, dict[str, Any]] = {}
        """What each peer announced: companion id -> ``{revision, tools: [ids]}``."""
        self._speaker = Speaker(loaded, model, self.runtime, directory, self._emit)
        self._nursery: trio.Nursery | None = None
        self._tasks: dict[tuple[str, str], trio.CancelScope] = {}
        self._speech: Speech | None = None
        self._wake = trio.Event()
        self._store_failing = False
        self._stopping = False
        """No new turn: a lead due gives rule-based states at once, a slot due is given up."""
        self._publishing = 0
        self._settled = trio.Event()
        """Set whenever a turn task or a publish ends (:meth:`stop` waits for none to run)."""

    @property
    def history(self) -> ConversationStore:  # the conversation's messages: the store
        return self.store

    # --- running ---------------------------------------------------------------------------

    def attach(self, nursery: trio.Nursery) -> None:
        """Run turn work in ``nursery`` (which must outlive the engine's use)."""
        self._nursery = nursery
        nursery.start_soon(self._clock)
        self.routines.start(nursery, self.directory)
        self.announcer.start(nursery, first_after=self.timings.routine_quiet_start)

    async def stop(self, grace: float) -> None:
        """Stop taking turns, before the node stops: no routine speaks; a lead or a reply in
        flight has ``grace`` seconds to finish, then it is withdrawn (a lead's rule-based
        states, a reply's yield go out at once, so the others go on without waiting for this
        companion's deadlines); the publishes in flight finish (each within
        ``publish_timeout``). From then on nothing goes out (:class:`_Gate`), and every message
        that still arrives is recorded (the store closes after the node)."""
        self._stopping = True
        self._speaker.keep_prepared(None, "stopping")  # no slot will adopt it now
        with trio.move_on_after(grace):
            await self._settle(lambda: bool(self._tasks))
        for (what, message_id), scope in list(self._tasks.items()):
            scope.cancel()
            self._emit("withdrawn", logging.INFO, what=what, message_id=message_id, reason="stopping")
            speech = self._speech
            if what == "lead":
                self._feed(cv.StatesReady(message_id, None, "fallback_stopping"))
            elif speech is not None and speech.effect.message_id == message_id and not speech.spoke:
                self._feed(cv.SpeakingFailed(message_id, "stopping"))
        with trio.move_on_after(self.timings.publish_timeout):
            await self._settle(lambda: bool(self._tasks or self._publishing))
        self._gate.closed = True

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
            self._feed(cv.Tick())

    # --- in --------------------------------------------------------------------------------

    async def handle(self, inbound: Inbound) -> None:
        """Take one payload that passed the node's edge. Returns at once."""
        if self._nursery is None:
            raise RuntimeError("the engine is not running: call attach(nursery) or start run() first")
        self._sync_directory()
        payload, publisher = inbound.payload, self._publisher_of(inbound.sender_peer)
        if inbound.topic == MESSAGES and isinstance(payload, Message):
            self._activity(payload)
            self._on_message(payload, publisher)
            self.routines.observe(RoutineMessage(payload))
        elif inbound.topic == STATES and isinstance(payload, list):
            self._feed(cv.StatesSeen(payload, publisher))
        elif inbound.topic == ACTIONS and isinstance(payload, Action):
            signal = cv.read_signal(payload)
            if signal is not None:
                self._feed(replace(signal, publisher=publisher))
            else:
                self._peer_tools(payload, publisher)
        elif inbound.topic == QUERIES and isinstance(payload, QueryResult):
            self.runtime.deliver_query_result(payload)

    def _publisher_of(self, peer: str) -> str | None:
        if self._companion_of is not None:
            return self._companion_of(peer)
        return peer if peer in self.conversation.known else None

    def _peer_tools(self, action: Action, publisher: str | None) -> None:
        """Keep a peer's announced tool list: only its own (the authenticated publisher's)."""
        sender = action.params.from_
        if publisher != sender or sender == self.me.id or sender not in self.directory:
            return
        tools = read_tools(action)
        if tools is None:
            return
        self.conversation.follows_slots(sender)  # aikyo companions announce no tools
        known = self.peer_tools.get(sender)
        if known is not None:
            plain = "change" not in action.params.params  # the whole list, sent after a (re)start
            if known == tools or (tools["revision"] <= known["revision"] and not plain):
                return  # nothing new, or an older change replayed
        self.peer_tools[sender] = tools
        self._emit("peer_tools", logging.INFO, peer=sender, revision=tools["revision"], tools=tools["tools"])

    # --- routines ----------------------------------------------------------------------------

    def _activity(self, message: Message) -> None:
        """Any message keeps a conversation running for a reply slot, unless it closed it."""
        closed = turn_info(message).closing == "terminal"
        self._last_activity = -math.inf if closed else trio.current_time()

    def _busy_until(self, now: float) -> float:
        if self._tasks:
            return math.inf  # leading or speaking here
        if self.conversation.in_turn:
            return math.inf  # a turn of ours runs: the machine's deadlines end it
        return self._last_activity + self.timings.reply_timeout

    def _routine_spoke(self, message: Message) -> None:
        self._activity(message)  # busy from this instant: no second routine speaks now

    def _on_message(self, message: Message, publisher: str | None) -> None:
        event = cv.MessageSeen(message, publisher)
        if not self.conversation.belongs(message):
            self._feed(event)  # it only notes what the message answers
            return
        try:
            fresh = self.store.record(message)
        except Exception as exc:
            self._store_failed("record", exc, message_id=message.params.id)
            return
        self._store_failed("record")
        if not fresh:
            self._emit("message_duplicate", logging.DEBUG, message_id=message.params.id)
            return
        self._feed(event)
        self._prefetch_params(message)

    def _prefetch_params(self, message: Message) -> None:
        """A turn opened for ``message`` and this companion may speak in it: a model that asks
        for it (``parallel_params``) fills the parameters now, beside the leader's states call."""
        turn = self.conversation.turn
        if (
            getattr(self.model, "parallel_params", False)
            and self._nursery is not None
            and message.params.from_ != self.me.id
            and self.me.id in message.params.to
            and turn is not None
            and turn.message_id == message.params.id
            and self.conversation.in_turn
        ):
            limit = self.timings.states_timeout + self.timings.speak_timeout
            history = self.store.recent(self.timings.history_limit)
            self._speaker.prefetch(message, history, self._nursery, limit)

    def directory_changed(self, _event: object = None) -> None:
        """The directory changed (a membership listener): a companion that joins and leaves between
        two payloads must still become known, or it could never lead."""
        if self._nursery is not None:
            self._sync_directory()

    def _sync_directory(self) -> None:
        if set(self.directory) == self.conversation.present:
            return
        for change in cv.present_diff(self.conversation.present, self.directory):
            cid = change.companion_id
            if isinstance(change, cv.CompanionJoined) and cid not in self._remembered:
                try:
                    self.store.remember_companion(cid)
                except Exception as exc:
                    self._store_failed("remember_companion", exc, companion=cid)
                    continue  # not known yet: tried again with the next payload
                self._remembered.add(cid)
            self._feed(change)
            if isinstance(change, cv.CompanionJoined):
                meta = self.directory.get(cid)
                self._names[cid] = meta.name if meta is not None else cid
                self.routines.observe(RoutineJoined(cid, self._names[cid]))
                self.announcer.refresh()
            else:
                self.peer_tools.pop(cid, None)
                self.routines.observe(RoutineLeft(cid, self._names.pop(cid, cid)))

    def _store_failed(self, call: str, exc: Exception | None = None, **fields: Any) -> None:
        """One error event when the store starts failing, one when it works again (``exc=None``)."""
        if self._store_failing != (exc is not None):
            self._store_failing = exc is not None
            kind, level = ("store_failed", logging.ERROR) if exc else ("store_recovered", logging.INFO)
            self._emit(kind, level, call=call, error=repr(exc)[:300], **fields)

    def _feed(self, event: cv.Event) -> None:
        for effect in self.conversation.receive(event, trio.current_time()):
            self._do(effect)
        turn = self.conversation.turn
        if turn is not None and turn.phase in _PREPARING:  # a reply prepared for it may go on
            self._speaker.keep_prepared(turn.message_id, "")
        else:
            self._speaker.keep_prepared(None, "the turn went to another speaker or ended")
        self._wake.set()
        self.routines.poke()

    # --- out -------------------------------------------------------------------------------

    def _emit(self, kind: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(logger, kind, level, companion=self.me.id, **fields)
        if self._observer is not None:
            self._observer(EngineEvent(kind, self.me.id, fields, level))

    def _do(self, effect: Any) -> None:
        assert self._nursery is not None
        if isinstance(effect, cv.Decision):
            self._emit(effect.event, logging.getLevelNamesMapping()[effect.level.upper()], **effect.fields)
        elif isinstance(effect, cv.Lead):
            if self._stopping:  # no model call now: the rule-based states, so the turn goes on
                self._feed(cv.StatesReady(effect.message_id, None, "fallback_stopping"))
            else:
                self._start("lead", effect.message_id, self._lead(effect))
        elif isinstance(effect, cv.PublishStates):
            self._spawn_publish(STATES, effect.states, effect.message_id)
        elif isinstance(effect, cv.PublishSignal):
            action = Action.create(self.me.id, effect.name, dict(effect.params))
            self._spawn_publish(ACTIONS, action, effect.params.get("in_reply_to", ""))
        elif isinstance(effect, cv.Speak):
            if self._stopping:
                self._feed(cv.SpeakingFailed(effect.message_id, "stopping"))
                return
            try:
                replied = self.store.replied(effect.message_id)  # before a restart
            except Exception as exc:
                self._store_failed("replied", exc, message_id=effect.message_id)
                replied = True  # it cannot tell: better silent than twice
            if replied:
                self._feed(cv.SpeakingFailed(effect.message_id, "no_reply", "it replied before a restart"))
                return
            self._speech = Speech(effect)
            self._start("speech", effect.message_id, self._speak(self._speech))
        elif isinstance(effect, cv.Prepare):
            if not self._stopping:
                self._prepare(effect.speak)
        elif isinstance(effect, cv.Withdraw):
            scope = self._tasks.pop((effect.what, effect.message_id), None)
            if scope is not None:
                scope.cancel()

    def _prepare(self, effect: cv.Speak) -> None:
        """This companion is the likely speaker: its reply starts now, held until its slot
        (:meth:`~companion.engine.speech.Speaker.prepare`), unless it replied before a restart."""
        assert self._nursery is not None
        if not getattr(self.model, "speculates", False):
            return  # the slot will ask it (a scripted model answers at once anyway)
        try:
            if self.store.replied(effect.message_id):
                return
        except Exception:
            return  # the slot will say why (``Speak`` asks the store again)
        memory = {**self.store.memory(), "conversation": self.conversation.memory()}
        history = self.store.recent(self.timings.history_limit)
        limit = self.timings.states_timeout + self.timings.speak_timeout
        self._speaker.prepare(effect, history, memory, self._nursery, limit)

    def _start(self, what: str, message_id: str, work: Any) -> None:
        scope = self._tasks[(what, message_id)] = trio.CancelScope()

        async def run() -> None:
            not_a_routine()  # turn work, even when a routine's call set it off
            try:
                with scope:
                    await work
            finally:
                if self._tasks.get((what, message_id)) is scope:
                    del self._tasks[(what, message_id)]
                self._settled.set()
                self.routines.poke()

        assert self._nursery is not None
        self._nursery.start_soon(run)

    def _spawn_publish(self, topic: str, envelope: Envelope | list[State], message_id: str) -> None:
        assert self._nursery is not None
        self._publishing += 1
        self._nursery.start_soon(self._publish, topic, envelope, message_id)

    async def _publish(self, topic: str, envelope: Envelope | list[State], message_id: str) -> None:
        try:
            with trio.fail_after(self.timings.publish_timeout):
                await self._publisher.publish(topic, envelope)
        except Exception as exc:  # trio.TooSlowError included
            kind = "states_publish_failed" if topic == STATES else "signal_publish_failed"
            self._emit(kind, logging.ERROR, message_id=message_id, error=repr(exc))
        finally:
            self._publishing -= 1
            self._settled.set()

    async def _lead(self, effect: cv.Lead) -> None:
        request = StatesRequest(
            message=effect.message,
            companions=[self.directory[c] for c in effect.addressed if c in self.directory],
            history=self.store.recent(self.timings.history_limit),
            nominated=effect.nominated,
            closing_floor=effect.floor,
            turn=effect.turn,
        )
        decisions, source = None, "model"
        try:
            with trio.move_on_after(self.timings.states_timeout) as scope:
                decisions = await self.model.decide_states(request)
            if scope.cancelled_caught:
                source = "fallback_timeout"
                self._emit("states_model_timeout", logging.WARNING, message_id=effect.message_id)
        except ModelError as exc:
            self._emit("states_model_failed", logging.WARNING, message_id=effect.message_id, error=str(exc))
            source = "fallback_model_error"
        except Exception:
            logger.exception("decide_states raised", extra={"companion_event": "states_model_crashed"})
            source = "fallback_model_crashed"
        self._feed(cv.StatesReady(effect.message_id, decisions if source == "model" else None, source))

    async def _speak(self, speech: Speech) -> None:
        effect = speech.effect
        reason, detail = "no_reply", "the model ended without speaking"
        try:
            with trio.move_on_after(self.timings.speak_timeout) as deadline:
                if self.timings.pace:
                    await trio.sleep(self.timings.pace)
                memory = {**self.store.memory(), "conversation": self.conversation.memory()}
                await self._speaker.reply(speech, self.store.recent(self.timings.history_limit), memory)
            if deadline.cancelled_caught:
                reason, detail = "timeout", f"no reply within {self.timings.speak_timeout:g} s"
        except ModelError as exc:
            reason, detail = "model_error", str(exc)
        except Exception as exc:
            logger.exception("speaking failed", extra={"companion_event": "speak_crashed"})
            reason, detail = "crashed", repr(exc)
        if not speech.spoke:
            self._feed(cv.SpeakingFailed(effect.message_id, reason, detail))

    async def _outgoing(self, topic: str, envelope: Message | Action) -> Message | Action | str:
        """The runtime's hook: this node's reply leaves stamped, once per turn, after the store
        committed that its message was answered (a node killed as its reply leaves, then started
        again and chosen for the same message, must not answer it twice)."""
        if self._stopping and (self._gate.closed or current_firing() is not None):
            return _STOPPING
        if topic != MESSAGES or not isinstance(envelope, Message) or envelope.params.from_ != self.me.id:
            return envelope
        firing = current_firing()
        if firing is not None:  # a routine's: it opens a conversation, never talks over one
            return self.routines.admit(firing, envelope)
        verdict = self.conversation.outgoing(envelope)
        speech = self._speech
        if isinstance(verdict, str) or speech is None:
            return verdict if isinstance(verdict, str) else "this companion is not speaking now"
        message_id = speech.effect.message_id
        mark = self.store.writes
        try:
            self.store.mark_replied(message_id)
        except Exception as exc:
            self._store_failed("mark_replied", exc, message_id=message_id)
            return _UNRECORDED
        if not await self.store.flush(self.timings.publish_timeout, since=mark):
            error = StoreError(f"the mark was not committed within {self.timings.publish_timeout:g} s")
            self._store_failed("mark_replied", error, message_id=message_id)
            return _UNRECORDED
        verdict = self.conversation.outgoing(envelope)  # the turn may have moved on meanwhile
        if isinstance(verdict, str) or self._speech is not speech:
            return verdict if isinstance(verdict, str) else "this companion is not speaking now"
        speech.spoke = True
        self._feed(cv.ReplyPublished(message_id, verdict))
        return verdict


class _Gate:
    """Everything the engine publishes (states, signals, tools' output, tool lists) goes through
    here: once :meth:`ConversationEngine.stop` closed it, the node is stopping and nothing more
    goes out (a publish then is skipped, logged at debug level, not an error on a closed node)."""

    def __init__(self, publisher: Publisher, companion: str) -> None:
        self._publisher, self._companion = publisher, companion
        self.closed = False

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        if self.closed:
            log_event(logger, "not_published", logging.DEBUG, companion=self._companion, topic=topic)
            return
        await self._publisher.publish(topic, envelope)
