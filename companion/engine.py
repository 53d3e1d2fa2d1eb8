"""The conversation engine: one companion's part in a group conversation.

It glues the pure parts (:mod:`companion.turns`, the card's triggers) to a model, the action
runtime and a transport. For every ``message.send`` that addresses this companion it:

1. places the message in the conversation (:class:`turns.ConversationThread`: a reply that
   crossed a newer message, or one whose own reply came first, opens no turn) and opens a
   *turn*: the leader and the takeover order (:func:`turns.plan_leaders`);
2. leads if it is the leader, or takes over when no states arrived after
   ``rank x takeover_after`` seconds: one ``decide_states`` model call for every addressed
   companion, under ``states_timeout`` (a failing or slow model gives rule-based states, so a
   live leader always publishes before the next one's slot begins); the array carries the
   message's turn tag;
3. accepts the first states array that matches the message (:func:`turns.states_match`; an
   array that overtook its message waits for it), and switches to an earlier leader's array
   if one arrives late, so every node ends on the same array; duplicates are ignored;
4. derives the speaking order from the array alone (:func:`turns.speaking_order`); slot ``k``
   opens ``k x reply_timeout`` after acceptance, so a silent speaker is skipped the same way
   on every node;
5. speaks in its slot: ``fill_params`` (checked against the card's schema), the card's CEL
   triggers, then ``speak`` with the card's tools, every tool call going through the
   :class:`~companion.actions.ActionRuntime`, all under ``speak_timeout``.

At most three model calls per turn: ``decide_states`` (leader), ``fill_params`` and ``speak``
(speaker). No double speech: a node speaks at most once per message and never while already
speaking; a newer message, or another companion's reply to the same message, withdraws a reply
still being prepared; a node restarted after replying does not reply again (``replied`` ids are
stored). Every decision is one structured log event with its reason, and also goes to the
optional ``observer``.

Outgoing replies are stamped with ``in_reply_to``, ``turn`` and ``closing`` in
``params.metadata`` (see :mod:`companion.turns`), so every node can follow the turn count and
the closing stage, and the sender of a message can nominate the next speaker with
``next_speaker``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import jsonschema
import trio

from .actions import ActionDef, ActionRuntime, ToolResult
from .card import LoadedCard
from .history import ConversationHistory
from .log import log_event
from .models.base import (
    CompanionModel,
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
)
from .protocol import (
    MESSAGES,
    QUERIES,
    STATES,
    ClosingStage,
    Envelope,
    Message,
    Metadata,
    QueryResult,
    State,
    new_id,
)
from .store import Store
from .transport import Inbound, Publisher
from .turns import (
    META_CLOSING,
    META_TURN,
    REPETITION_WINDOW,
    ConversationThread,
    EarlyStates,
    LeaderPlan,
    SpeakerDecision,
    SpeakingOrder,
    closing_floor,
    closing_stage,
    fallback_decisions,
    finalize_states,
    plan_leaders,
    reply_recipients,
    speaking_order,
    stamp_reply,
    states_match,
    turn_info,
    turn_tag,
)

__all__ = [
    "ConversationEngine",
    "EngineEvent",
    "EngineTimings",
    "NodeLike",
    "engine_handler_factory",
]

logger = logging.getLogger("companion.engine")

_CONVERSATION_KEY: Final = "conversation"
_VOICES: Final = 16
_VOICE_CHARS: Final = 160
_SEEN_MESSAGES: Final = "messages"
_REPLIED: Final = "replied"


@dataclass(frozen=True, slots=True)
class EngineTimings:
    """Every deadline of a turn, in seconds. Defaults suit a real language model.

    The orderings are what make takeovers safe: a leader gives up on its model before the
    next one's slot begins, and a speaker gives up before the others skip it.
    """

    states_timeout: float = 20.0
    """The leader's budget for ``decide_states``; after it, rule-based states are published."""
    takeover_after: float = 30.0
    """Length of one leader slot: rank ``k`` leads if no states arrived after ``k`` slots."""
    speak_timeout: float = 90.0
    """The speaker's budget for parameters, triggers and speech (tool calls included)."""
    reply_timeout: float = 120.0
    """How long everyone waits for the chosen speaker's reply before the next one speaks."""
    publish_timeout: float = 5.0
    """Handing the states array to the transport (the leader's model time plus this stays
    inside its slot)."""
    pace: float = 0.0
    """A pause before speaking (aikyo waits a moment too); keeps fast models readable."""
    history_limit: int = 20
    """How many recent messages the model sees."""

    def __post_init__(self) -> None:
        values = (self.states_timeout, self.takeover_after, self.speak_timeout, self.reply_timeout)
        if not all(v > 0 and math.isfinite(v) for v in (*values, self.publish_timeout)):
            raise ValueError(f"timings must be positive and finite: {self}")
        if self.states_timeout + self.publish_timeout >= self.takeover_after:
            raise ValueError(
                "states_timeout + publish_timeout must be shorter than takeover_after "
                "(a leader yields its slot)"
            )
        if self.pace < 0 or self.pace + self.speak_timeout >= self.reply_timeout:
            raise ValueError("pace + speak_timeout must be shorter than reply_timeout (a speaker yields)")
        if self.history_limit < 1:
            raise ValueError("history_limit must be at least 1")

    @classmethod
    def offline(cls, pace: float = 0.0) -> EngineTimings:
        """Short deadlines for the scripted model (it answers at once)."""
        return cls(
            states_timeout=2.0,
            takeover_after=4.0,
            speak_timeout=8.0,
            reply_timeout=12.0 + pace,
            publish_timeout=1.5,
            pace=pace,
        )


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One decision or happening, as logged: ``kind`` is the log event name."""

    kind: str
    companion: str
    fields: Mapping[str, Any]


class _Memory(Protocol):
    def mark_seen(self, kind: str, item_id: str) -> bool: ...
    def seen(self, kind: str, item_id: str) -> bool: ...
    def remember(self, key: str, value: Any) -> None: ...
    def recall(self, key: str, default: Any = None) -> Any: ...
    def memory(self) -> dict[str, Any]: ...


class _VolatileMemory:
    """Seen ids and working memory for an engine without a :class:`~companion.store.Store`."""

    def __init__(self, limit: int = 10_000) -> None:
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._limit = limit
        self._values: dict[str, Any] = {}

    def mark_seen(self, kind: str, item_id: str) -> bool:
        key = (kind, item_id)
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True

    def seen(self, kind: str, item_id: str) -> bool:
        return (kind, item_id) in self._seen

    def remember(self, key: str, value: Any) -> None:
        self._values[key] = value

    def recall(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def memory(self) -> dict[str, Any]:
        return dict(self._values)


@dataclass(eq=False)
class _Turn:
    """This node's view of the turn opened by one message that addressed it."""

    message: Message
    replies: int
    """Companion replies so far, the message itself included."""
    previous: ClosingStage
    """The closing stage that chose the message's speaker."""
    nominated: str | None
    plan: LeaderPlan
    scopes: list[trio.CancelScope] = field(default_factory=list)
    """One per timer or leading task; all cancelled when the turn ends."""
    states_seen: trio.Event = field(default_factory=trio.Event)
    states: list[State] | None = None
    priority: int = 0
    """The accepted array's leader rank (lower wins; unknown publishers rank last)."""
    accepted_at: float = 0.0
    """When the first array was accepted: slot ``k`` of the speaking order opens ``k`` reply
    deadlines later."""
    slots: trio.CancelScope | None = None
    decision: SpeakerDecision | None = None
    speak_scope: trio.CancelScope | None = None
    spoke: bool = False
    closed: bool = False

    @property
    def message_id(self) -> str:
        return self.message.params.id

    def task_scope(self) -> trio.CancelScope:
        """A cancel scope for one task of this turn (already cancelled if the turn is over)."""
        scope = trio.CancelScope()
        if self.closed:
            scope.cancel()
        self.scopes.append(scope)
        return scope

    def stop_tasks(self) -> None:
        for scope in self.scopes:
            scope.cancel()


class _Outbox:
    """The action runtime's publisher: stamps this companion's replies with the turn metadata
    and lets the engine see its own messages without waiting for gossip to echo them."""

    def __init__(self, engine: ConversationEngine, inner: Publisher) -> None:
        self._engine = engine
        self._inner = inner

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        engine = self._engine
        if topic == MESSAGES and isinstance(envelope, Message) and envelope.params.from_ == engine.me.id:
            stamped = engine._outgoing(envelope)
            await self._inner.publish(topic, stamped)
            engine._on_message(stamped)
            return
        await self._inner.publish(topic, envelope)


class NodeLike(Protocol):
    """What :func:`engine_handler_factory` needs from a node (``CompanionNode`` has it)."""

    @property
    def directory(self) -> Mapping[str, Metadata]: ...

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None: ...


class ConversationEngine:
    """One companion's conversation logic. Feed it every inbound payload with :meth:`handle`.

    Run it with :meth:`run` (``await nursery.start(engine.run)``) or bind it to a nursery you
    own with :meth:`attach`; turn work (timers, model calls) runs there, so ``handle`` returns
    at once.
    """

    def __init__(
        self,
        loaded: LoadedCard,
        model: CompanionModel,
        publisher: Publisher,
        directory: Mapping[str, Metadata],
        history: ConversationHistory,
        *,
        store: Store | None = None,
        timings: EngineTimings | None = None,
        observer: Callable[[EngineEvent], None] | None = None,
        companion_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """``store`` keeps seen ids, replied ids and working memory across restarts (usually
        also the ``history``); without it they live in memory. ``companion_of`` maps an
        inbound ``sender_peer`` to the companion id it speaks for (the node's membership);
        without it a sender name that is a companion id in the directory is taken as is (the
        in-memory transport)."""
        self.loaded = loaded
        self.card = loaded.card
        self.me: Metadata = loaded.card.metadata
        self.model = model
        self.directory = directory
        self.history = history
        self.timings = timings or EngineTimings()
        self._publisher = publisher
        self._observer = observer
        self._companion_of = companion_of
        self._memory: _Memory = store if store is not None else _VolatileMemory()
        self.runtime = ActionRuntime(
            metadata=self.me, publisher=_Outbox(self, publisher), directory=directory, history=history
        )
        for defn in loaded.tools.values():
            self.runtime.register(defn)
        self._params_check = _ParamsCheck(self.card.events.params)
        if self._params_check.problem is not None:
            log_event(logger, "params_schema_invalid", logging.ERROR, problem=self._params_check.problem)
        self._nursery: trio.Nursery | None = None
        self._turn: _Turn | None = None
        self._speaking: _Turn | None = None
        saved = self._memory.recall(_CONVERSATION_KEY, {}) or {}
        self._replies: int = int(saved.get("turn", 0))
        self._stage: ClosingStage = closing_stage(saved.get("closing"))
        self._thread = ConversationThread(saved.get("message_id"))
        self._voices: dict[str, dict[str, Any]] = dict(saved.get("voices", {}))
        """Working memory: what each participant said last, and at which turn (the model sees it)."""
        self._early: EarlyStates[str | None] = EarlyStates()
        """Arrays that came before their message, with their publisher."""

    # --- running ---------------------------------------------------------------------------

    def attach(self, nursery: trio.Nursery) -> None:
        """Run turn work in ``nursery`` (which must outlive the engine's use)."""
        self._nursery = nursery

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own a nursery for turn work until cancelled."""
        async with trio.open_nursery() as nursery:
            self.attach(nursery)
            task_status.started()
            await trio.sleep_forever()

    def _start(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError("the engine is not running: call attach(nursery) or start run() first")
        self._nursery.start_soon(fn, *args)

    # --- inbound ---------------------------------------------------------------------------

    async def handle(self, inbound: Inbound) -> None:
        """Take one payload that passed the node's edge. Returns at once."""
        payload = inbound.payload
        if inbound.topic == MESSAGES and isinstance(payload, Message):
            self._on_message(payload)
        elif inbound.topic == STATES and isinstance(payload, list):
            self._on_states(payload, source=inbound.sender_peer)
        elif inbound.topic == QUERIES and isinstance(payload, QueryResult):
            self.runtime.deliver_query_result(payload)

    def _emit(self, kind: str, level: int = logging.INFO, **fields: Any) -> None:
        log_event(logger, kind, level, companion=self.me.id, **fields)
        if self._observer is not None:
            self._observer(EngineEvent(kind, self.me.id, fields))

    def _on_message(self, message: Message) -> None:
        params = message.params
        if not self._memory.mark_seen(_SEEN_MESSAGES, params.id):
            self._emit("message_duplicate", logging.DEBUG, message_id=params.id, sender=params.from_)
            return
        self.history.append(message)
        info = turn_info(message)
        placed = self._thread.place(params.id, info.in_reply_to)
        self._early.message_seen(message)
        if self._turn is not None and placed.closes == self._turn.message_id:
            self._close_turn(self._turn, message)
        if placed.kind != "current":
            self._emit(
                "message_stale",
                message_id=params.id,
                sender=params.from_,
                in_reply_to=info.in_reply_to,
                current=self._thread.current,
                reason=(
                    "its reply arrived first"
                    if placed.kind == "overtaken"
                    else "answers a message that a newer one superseded"
                ),
            )
            return
        meta = params.metadata or {}
        from_companion = params.from_.startswith("companion_")
        # Replies from nodes that do not stamp (aikyo's) continue the count we kept.
        replies = info.turn if META_TURN in meta else (self._replies + 1 if from_companion else 0)
        stage = info.closing if META_CLOSING in meta else (self._stage if from_companion else "none")
        self._replies, self._stage = replies, stage
        self._voices.pop(params.from_, None)  # most recent last: the oldest voice is dropped first
        self._voices[params.from_] = {"said": params.message[:_VOICE_CHARS], "turn": replies}
        while len(self._voices) > _VOICES:
            self._voices.pop(next(iter(self._voices)))
        self._memory.remember(
            _CONVERSATION_KEY,
            {"message_id": params.id, "turn": replies, "closing": stage, "voices": self._voices},
        )
        if params.from_ == self.me.id:
            return
        if self.me.id not in params.to:
            self._emit("not_addressed", logging.DEBUG, message_id=params.id, sender=params.from_)
            return
        plan = plan_leaders(message, [c for c in params.to if c.startswith("companion_")])
        turn = _Turn(message, replies, stage, info.nominated, plan)
        self._turn = turn
        rank = plan.rank(self.me.id)
        self._emit(
            "leader_chosen",
            message_id=params.id,
            sender=params.from_,
            turn=replies,
            leader=plan.leader,
            rank=rank,
            order=list(plan.order),
            reason=plan.reason,
            why=plan.why,
        )
        if rank is not None:
            self._start(self._lead_when_due, turn, rank)
        early = self._early.take(message, self.directory)
        if early is not None:
            self._on_states(early[0], source="early", publisher=early[1])

    def _close_turn(self, turn: _Turn, by: Message) -> None:
        """A newer message ends ``turn``: its timers stop, and a reply still being prepared is
        withdrawn unless the newer message is that very reply."""
        turn.closed = True
        turn.stop_tasks()
        if self._turn is turn:
            self._turn = None
        if by.params.from_ != self.me.id and self._speaking is turn and turn.speak_scope is not None:
            answered = turn_info(by).in_reply_to == turn.message_id
            turn.speak_scope.cancel()
            self._emit(
                "speech_withdrawn",
                message_id=turn.message_id,
                by=by.params.from_,
                reason="another companion replied first" if answered else "a newer message arrived",
            )

    # --- leading ---------------------------------------------------------------------------

    async def _lead_when_due(self, turn: _Turn, rank: int) -> None:
        with turn.task_scope():
            if turn.states is not None:
                return  # its states arrived before the message did
            if rank > 0:
                wait = rank * self.timings.takeover_after
                with trio.move_on_after(wait):
                    await turn.states_seen.wait()
                    return
                self._emit(
                    "takeover",
                    logging.WARNING,
                    message_id=turn.message_id,
                    rank=rank,
                    reason="no_states",
                    why=f"no states within {wait:g} s from {', '.join(turn.plan.order[:rank])}",
                )
            await self._lead(turn, rank)

    def _addressed(self, message: Message) -> list[str]:
        return list(dict.fromkeys(c for c in message.params.to if c in self.directory))

    async def _lead(self, turn: _Turn, rank: int) -> None:
        message = turn.message
        addressed = self._addressed(message)
        utterances = [m.params.message for m in self.history.recent(REPETITION_WINDOW)]
        settings = self.card.settings
        floor = closing_floor(
            previous=turn.previous,
            turn=turn.replies,
            utterances=utterances,
            threshold=settings.repetition_threshold,
            max_turns=settings.max_turns,
        )
        decisions, source = await self._decide(turn, addressed, floor.stage)
        outcome = finalize_states(
            decisions, addressed, floor=floor.stage, nominated=turn.nominated, tag=turn_tag(message)
        )
        if turn.states is not None or turn.closed:
            self._emit("states_withheld", message_id=turn.message_id, reason="states already arrived")
            return
        self._emit(
            "states_published",
            message_id=turn.message_id,
            rank=rank,
            source=source,
            stage=outcome.stage,
            floor=floor.stage,
            floor_reason=floor.reason,
            floor_why=floor.why,
            repetition=floor.repetition,
            adjustments=list(outcome.adjustments),
            states=[_state_summary(s) for s in outcome.states],
        )
        try:
            with trio.fail_after(self.timings.publish_timeout):
                await self._publisher.publish(STATES, outcome.states)
        except (trio.TooSlowError, Exception) as exc:
            self._emit("states_publish_failed", logging.ERROR, message_id=turn.message_id, error=repr(exc))
            return
        self._on_states(outcome.states, source="self")

    async def _decide(
        self, turn: _Turn, addressed: list[str], floor: ClosingStage
    ) -> tuple[list[StateDecision], str]:
        """The model's states, or rule-based ones (and why) when it cannot give them in time."""
        if floor == "terminal":
            return fallback_decisions(addressed, turn.nominated), "closing_floor_terminal"
        request = StatesRequest(
            message=turn.message,
            companions=[self.directory[c] for c in addressed],
            history=self.history.recent(self.timings.history_limit),
            nominated=turn.nominated,
            closing_floor=floor,
            turn=turn.replies,
        )
        try:
            with trio.move_on_after(self.timings.states_timeout) as scope:
                return await self.model.decide_states(request), "model"
        except ModelError as exc:
            self._emit("states_model_failed", logging.WARNING, message_id=turn.message_id, error=str(exc))
            return fallback_decisions(addressed, turn.nominated), "fallback_model_error"
        except Exception as exc:
            logger.exception(
                "decide_states raised", extra={"companion_event": "states_model_crashed"}, exc_info=exc
            )
            return fallback_decisions(addressed, turn.nominated), "fallback_model_crashed"
        assert scope.cancelled_caught
        self._emit(
            "states_model_timeout",
            logging.WARNING,
            message_id=turn.message_id,
            timeout=self.timings.states_timeout,
        )
        return fallback_decisions(addressed, turn.nominated), "fallback_timeout"

    # --- deciding the speaker -------------------------------------------------------------

    def _publisher_of(self, source: str) -> str | None:
        """The companion that published a payload (``self`` for this one), if known."""
        if source == "self":
            return self.me.id
        if self._companion_of is not None:
            return self._companion_of(source)
        return source if source in self.directory else None

    def _on_states(self, states: list[State], *, source: str, publisher: str | None = None) -> None:
        turn = self._turn
        senders = [s.params.from_ for s in states]
        publisher = publisher if publisher is not None else self._publisher_of(source)
        if turn is None or not states_match(states, turn.message, self.directory):
            self._early.hold(states, publisher)  # its message may still be on the way
            self._emit(
                "states_ignored",
                logging.DEBUG,
                source=source,
                froms=senders,
                message_id=None if turn is None else turn.message_id,
                reason="no open turn" if turn is None else "not for the current message",
            )
            return
        rank = turn.plan.rank(publisher) if publisher is not None else None
        priority = rank if rank is not None else len(turn.plan.order)
        if turn.states is not None:
            if turn.states == states or priority >= turn.priority:
                same = turn.states == states
                self._emit(
                    "states_ignored",
                    logging.DEBUG if same else logging.INFO,
                    source=source,
                    message_id=turn.message_id,
                    reason="duplicate" if same else "an array from an earlier or equal leader came first",
                )
                return
            # A takeover's array was accepted, then the earlier leader's arrived (it was only
            # late): every node ends up on the earliest leader's array.
            self._emit(
                "states_switched",
                logging.WARNING,
                source=source,
                message_id=turn.message_id,
                rank=rank,
                replaced_rank=turn.priority,
                reason="the array of an earlier leader arrived late",
            )
        else:
            turn.accepted_at = trio.current_time()
        turn.states = states
        turn.priority = priority
        turn.states_seen.set()
        speaking = speaking_order(states)
        decision = speaking.first
        turn.decision = decision
        self._stage = decision.closing
        self._emit(
            "speaker_chosen",
            message_id=turn.message_id,
            turn=turn.replies,
            speaker=decision.speaker,
            reason=decision.reason,
            why=decision.why,
            closing=decision.closing,
            order=list(speaking.order),
            source=source,
        )
        if turn.slots is not None:
            turn.slots.cancel()
        if decision.conversation_over or not speaking.order:
            turn.stop_tasks()
            if turn.speak_scope is not None and not turn.spoke:
                turn.speak_scope.cancel()
            if decision.conversation_over:
                self._emit(
                    "conversation_over", message_id=turn.message_id, turn=turn.replies, closing="terminal"
                )
            return
        slot_now = int((trio.current_time() - turn.accepted_at) // self.timings.reply_timeout)
        if self._speaking is turn and not turn.spoke and speaking.slot(self.me.id) != slot_now:
            assert turn.speak_scope is not None
            turn.speak_scope.cancel()
            self._emit(
                "speech_withdrawn",
                message_id=turn.message_id,
                by=publisher,
                reason="the earlier leader's array gives this slot to another companion",
            )
        turn.slots = turn.task_scope()
        self._start(self._speaking_slots, turn, speaking, turn.slots)

    async def _speaking_slots(self, turn: _Turn, speaking: SpeakingOrder, scope: trio.CancelScope) -> None:
        """Slot ``k`` of the speaking order opens ``k x reply_timeout`` after the first array was
        accepted; a reply from anyone closes the turn and ends this task."""
        assert turn.decision is not None
        reply_timeout = self.timings.reply_timeout
        waited = False
        with scope:
            for slot, candidate in enumerate(speaking.order):
                ends = turn.accepted_at + (slot + 1) * reply_timeout
                if ends <= trio.current_time():
                    continue  # passed before this order was known
                if waited:
                    self._emit(
                        "speaker_silent",
                        logging.WARNING,
                        message_id=turn.message_id,
                        silent=speaking.order[slot - 1],
                        speaker=candidate,
                        slot=slot,
                        why=f"no reply within {reply_timeout:g} s; next in the speaking order",
                    )
                if candidate == self.me.id and self._speaking is not turn:
                    self._start(self._speak, turn, turn.decision)
                await trio.sleep_until(ends)
                waited = True
            self._emit(
                "turn_unanswered",
                logging.WARNING,
                message_id=turn.message_id,
                order=list(speaking.order),
                reason="every candidate stayed silent",
            )

    # --- speaking --------------------------------------------------------------------------

    async def _speak(self, turn: _Turn, decision: SpeakerDecision) -> None:
        if self._speaking is not None:
            self._emit(
                "speak_skipped",
                message_id=turn.message_id,
                reason=f"already speaking (reply to {self._speaking.message_id})",
            )
            return
        if turn.closed or turn.spoke:
            self._emit("speak_skipped", message_id=turn.message_id, reason="the turn is over")
            return
        if self._memory.seen(_REPLIED, turn.message_id):
            self._emit("speak_skipped", message_id=turn.message_id, reason="already replied to this message")
            return
        self._speaking = turn
        turn.speak_scope = trio.CancelScope()
        started = trio.current_time()
        try:
            with turn.speak_scope, trio.move_on_after(self.timings.speak_timeout) as deadline:
                if self.timings.pace:
                    await trio.sleep(self.timings.pace)
                await self._take_turn(turn, decision)
            if deadline.cancelled_caught:
                self._emit(
                    "speak_timeout",
                    logging.WARNING,
                    message_id=turn.message_id,
                    timeout=self.timings.speak_timeout,
                    spoke=turn.spoke,
                )
        except ModelError as exc:
            self._emit("speak_failed", logging.WARNING, message_id=turn.message_id, error=str(exc))
        except Exception as exc:
            logger.exception("speaking failed", extra={"companion_event": "speak_crashed"}, exc_info=exc)
        finally:
            self._speaking = None
        if not turn.spoke and not turn.speak_scope.cancelled_caught:
            self._emit(
                "no_reply",
                logging.WARNING,
                message_id=turn.message_id,
                seconds=round(trio.current_time() - started, 3),
            )

    async def _take_turn(self, turn: _Turn, decision: SpeakerDecision) -> None:
        recent = self.history.recent(self.timings.history_limit)
        schema = self.card.events.params
        try:
            values = await self.model.fill_params(
                ParamsRequest(self.me, self.card.role, schema, turn.message, recent)
            )
        except ModelError as exc:
            # The parameters only choose instructions: speak without them rather than not at all.
            self._emit(
                "params_failed",
                logging.WARNING,
                message_id=turn.message_id,
                error=str(exc),
                reason="speaking without parameters; conditions that read them do not match",
            )
            values = {}
        issues = self._params_check.issues(values)
        instructions = self.loaded.triggers.evaluate(values)
        self._emit(
            "instructions",
            message_id=turn.message_id,
            params=values,
            param_issues=issues,
            instructions=[{"tool": i.tool, "instruction": i.instruction} for i in instructions],
        )
        request = SpeakRequest(
            me=self.me,
            role=self.card.role,
            message=turn.message,
            history=recent,
            instructions=instructions,
            tools=self.runtime.tool_specs(),
            recipients=reply_recipients(turn.message, self.me.id, self.directory),
            closing=decision.closing,
            extra={
                "names": {cid: meta.name for cid, meta in self.directory.items()},
                "params": values,
                "memory": self._memory.memory(),
            },
        )

        async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
            defn = self.runtime.tools.get(tool_id)
            if turn.spoke and isinstance(defn, ActionDef) and defn.topic == MESSAGES:
                refusal = ToolResult(
                    tool_id,
                    new_id(),
                    "refused",
                    "you already replied in this turn (one message per turn); finish without speaking again",
                )
                return refusal.for_model()
            return (await self.runtime.call(tool_id, raw)).for_model()

        await self.model.speak(request, call_tool)

    def _outgoing(self, message: Message) -> Message:
        """Stamp a reply of the turn being spoken and remember that this message was answered
        (before it leaves: a crash after publishing must not lead to a second reply)."""
        turn = self._speaking
        if turn is None or turn.closed or turn.spoke or turn.decision is None:
            self.history.append(message)
            return message
        stamped = stamp_reply(
            message, in_reply_to=turn.message_id, turn=turn.replies + 1, closing=turn.decision.closing
        )
        self._memory.mark_seen(_REPLIED, turn.message_id)
        turn.spoke = True
        self.history.append(stamped)  # before the runtime records the unstamped copy (same id)
        self._emit(
            "replied",
            message_id=turn.message_id,
            reply_id=stamped.params.id,
            to=list(stamped.params.to),
            turn=turn.replies + 1,
            closing=turn.decision.closing,
        )
        return stamped


class _ParamsCheck:
    """The card's ``events.params`` schema, compiled once: where the model's values break it."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.problem: str | None = None
        self._validator: jsonschema.protocols.Validator | None = None
        try:
            cls = jsonschema.validators.validator_for(dict(schema), jsonschema.Draft202012Validator)
            cls.check_schema(dict(schema))
            self._validator = cls(dict(schema))
        except jsonschema.SchemaError as exc:
            self.problem = f"the card's params schema is not valid JSON Schema: {exc.message}"

    def issues(self, values: Any) -> list[str]:
        """At most ten problems, each ``path: message`` (the triggers skip those values)."""
        if self._validator is None:
            return [self.problem or "no schema"]
        return [
            f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in self._validator.iter_errors(values)
        ][:10]


def _state_summary(state: State) -> dict[str, Any]:
    p = state.params
    return {
        "from": p.from_,
        "state": p.state,
        "importance": p.importance,
        "selected": p.selected,
        "closing": p.closing,
    }


def engine_handler_factory(
    model_for: Callable[[LoadedCard], CompanionModel],
    *,
    data_dir: Path | None,
    timings: EngineTimings | None = None,
) -> Callable[[LoadedCard, NodeLike, trio.Nursery], ConversationEngine]:
    """A ``(card, node, nursery) -> handler`` for :func:`companion.cli.run.run_nodes`: one
    engine per card, its history and memory in ``data_dir/<companion id>/`` (in memory when
    ``data_dir`` is ``None``)."""
    from .history import InMemoryHistory

    def make(loaded: LoadedCard, node: NodeLike, nursery: trio.Nursery) -> ConversationEngine:
        store = None if data_dir is None else Store.in_directory(data_dir / loaded.card.metadata.id)
        history: ConversationHistory = store if store is not None else InMemoryHistory()
        membership = getattr(node, "membership", None)
        engine = ConversationEngine(
            loaded,
            model_for(loaded),
            node,
            node.directory,
            history,
            store=store,
            timings=timings,
            companion_of=getattr(membership, "companion_of", None),
        )
        engine.attach(nursery)
        return engine

    return make
