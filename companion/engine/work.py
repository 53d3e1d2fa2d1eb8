"""The work a turn's effects ask for, each under its deadline, each ending in the event it gives.

The driver (:mod:`companion.engine.driver`) starts these in cancel scopes of its own and feeds
the machine what they return (:class:`TurnWork`): :meth:`~TurnWork.lead` answers a ``Lead``
with the model's states, or rule-based ones when the model fails or is late
(``states_timeout``); :meth:`~TurnWork.reply` prepares the speaker's reply
(:mod:`companion.engine.speech`, ``speak_timeout``) and answers with the yield that follows
unless the reply went out; :meth:`~TurnWork.prefetch` and :meth:`~TurnWork.prepare` start
what a model may do early. None of it touches the machine: the driver feeds it, between effects.

:class:`Outgoing` is the runtime's outgoing hook, the reply's way out: stamped by the machine,
once per turn, after the store committed that its message was answered. :class:`StoreHealth`
says once when the store starts failing and once when it works again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import trio

from companion.conversation.events import Event, Lead, ReplyPublished, Speak, SpeakingFailed, StatesReady
from companion.conversation.machine import Conversation
from companion.conversation.rules import StateDecision
from companion.engine.gate import Gate
from companion.engine.routines import RoutineDriver, current_firing
from companion.engine.speech import Speaker, Speech, prepares
from companion.models.base import CompanionModel, ModelError, StatesRequest
from companion.ports import ConversationStore
from companion.protocol import MESSAGES, Action, Message, Metadata
from companion.store.sqlite import StoreError
from companion.timings import EngineTimings

__all__ = ["EngineEvent", "Job", "Outgoing", "StoreHealth", "TurnWork", "Work"]

_UNRECORDED: Final = "this companion could not record its reply, so it is not sent; finish without speaking"
_STOPPING: Final = "this companion is stopping; finish without speaking"
_NOT_SPEAKING: Final = "this companion is not speaking now"

logger = logging.getLogger("companion.engine.driver")

Emit = Callable[..., None]
Job: TypeAlias = Coroutine[Any, Any, Event | None]
"""A lead or a speech: the work ends in the event it gives the machine (the states, a yield)."""


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One decision or happening, as logged: ``kind`` is the log event name."""

    kind: str
    companion: str
    fields: Mapping[str, Any]
    level: int = logging.INFO
    """The log level it was logged at (a decision's record keeps INFO and above)."""


@dataclass(slots=True)
class Work:
    """A lead or a speech in flight: its cancel scope, and the speech it prepares (if one)."""

    scope: trio.CancelScope
    speech: Speech | None = None


@dataclass(slots=True)
class _Ahead:
    """A states call started from a message's preview, held for the message's own lead."""

    message_id: str
    request: StatesRequest
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    answer: tuple[Sequence[StateDecision] | None, str] = (None, "fallback_dropped")


class TurnWork:
    """What the driver starts for a turn's effects, with everything that work reads."""

    def __init__(
        self,
        model: CompanionModel,
        directory: Mapping[str, Metadata],
        store: ConversationStore,
        timings: EngineTimings,
        speaker: Speaker,
        conversation: Conversation,
        emit: Emit,
    ) -> None:
        self.model, self.directory, self.store, self.timings = model, directory, store, timings
        self.speaker, self.conversation, self.emit = speaker, conversation, emit
        self._ahead: _Ahead | None = None

    def history(self, message: Message) -> list[Message]:
        """The recent history the model sees for ``message``: as the store will hold it once the
        message is recorded, when only its preview has come (so work started early asks the model
        exactly what it would ask then)."""
        limit = self.timings.history_limit
        recent = self.store.recent(limit)
        if any(m.params.id == message.params.id for m in recent):
            return recent
        return [*self.store.recent(limit - 1), message]

    def _states_request(self, effect: Lead) -> StatesRequest:
        return StatesRequest(
            message=effect.message,
            companions=[self.directory[c] for c in effect.addressed if c in self.directory],
            history=self.history(effect.message),
            nominated=effect.nominated,
            closing_floor=effect.floor,
            turn=effect.turn,
        )

    def _alone(self, effect: Lead) -> bool:
        """Whether ``effect``'s message addresses this companion alone and the model asks for no
        states call then (``states_for_one`` false: a server that answers one request at a
        time): the rule-based states make it the speaker at once."""
        return list(dict.fromkeys(effect.addressed)) == [self.speaker.me.id] and not getattr(
            self.model, "states_for_one", True
        )

    def lead_ahead(self, effect: Lead, nursery: trio.Nursery) -> None:
        """Start the states call for a message only previewed (``states_timeout``), held for
        the :meth:`lead` of the same message (:mod:`companion.conversation.preview`); none when
        the lead needs no model (:meth:`_alone`)."""
        if self._alone(effect):
            return
        older = self._ahead
        if older is not None:  # one at a time: the newest line is the one the next turn answers
            self._drop_states_ahead(older, "a newer preview")
        ahead = self._ahead = _Ahead(effect.message_id, self._states_request(effect))
        self.emit("states_ahead", logging.INFO, message_id=effect.message_id)

        async def ask() -> None:
            try:
                with ahead.scope:
                    ahead.answer = await self._ask_states(effect.message_id, ahead.request)
            finally:
                ahead.done.set()

        nursery.start_soon(ask)

    def drop_ahead(self, message_id: str, reason: str) -> None:
        """Cancel the states call started from ``message_id``'s preview, and the speaker's work."""
        ahead = self._ahead
        if ahead is not None and ahead.message_id == message_id:
            self._drop_states_ahead(ahead, reason)
        self.speaker.drop_ahead(message_id, reason)

    def stop_ahead(self, reason: str) -> None:
        """Cancel the states call started from a preview, whatever its message (stopping)."""
        if self._ahead is not None:
            self._drop_states_ahead(self._ahead, reason)

    def _drop_states_ahead(self, ahead: _Ahead, reason: str) -> None:
        if self._ahead is ahead:
            self._ahead = None
        ahead.scope.cancel()
        self.emit("states_ahead_dropped", logging.INFO, message_id=ahead.message_id, reason=reason)

    async def lead(self, effect: Lead) -> StatesReady:
        """Ask the model for everybody's state (``states_timeout``); a failure gives ``None``,
        the rule-based states, with its reason as the source. A states call started from the
        message's preview that asked the same is awaited instead (its answer, or its failure).
        A message that addresses this companion alone gets the rule-based states at once from a
        model that asks for it (:meth:`_alone`)."""
        if self._alone(effect):
            return StatesReady(effect.message_id, None, "one_addressee")
        request = self._states_request(effect)
        ahead = self._ahead
        if ahead is not None and ahead.message_id == effect.message_id:
            self._ahead = None
            if ahead.request != request:
                self._drop_states_ahead(ahead, "the lead asks for other states than the preview's")
                ahead = None
        else:
            ahead = None
        if ahead is not None:
            self.emit("states_ahead_adopted", logging.INFO, message_id=effect.message_id)
            await ahead.done.wait()
            decisions, source = ahead.answer
        else:
            decisions, source = await self._ask_states(effect.message_id, request)
        return StatesReady(effect.message_id, decisions, source)

    async def _ask_states(
        self, message_id: str, request: StatesRequest
    ) -> tuple[Sequence[StateDecision] | None, str]:
        """The model's states (``states_timeout``), or ``None`` and why not."""
        timings, emit = self.timings, self.emit
        decisions, source = None, "model"
        try:
            with trio.move_on_after(timings.states_timeout) as scope:
                decisions = await self.model.decide_states(request)
            if scope.cancelled_caught:
                source = "fallback_timeout"
                emit("states_model_timeout", logging.WARNING, message_id=message_id)
        except ModelError as exc:
            emit("states_model_failed", logging.WARNING, message_id=message_id, error=str(exc))
            source = "fallback_model_error"
        except Exception:
            logger.exception("decide_states raised", extra={"companion_event": "states_model_crashed"})
            source = "fallback_model_crashed"
        return (decisions if source == "model" else None), source

    async def reply(self, speech: Speech) -> SpeakingFailed | None:
        """Prepare and publish the reply (``speak_timeout``, after ``pace``); the yield that gives
        the slot up, and why, unless the machine noted that the reply went out."""
        timings = self.timings
        reason, detail = "no_reply", "the model ended without speaking"
        try:
            with trio.move_on_after(timings.speak_timeout) as deadline:
                if timings.pace:
                    await trio.sleep(timings.pace)
                memory = {**self.store.memory(), "conversation": self.conversation.memory()}
                await self.speaker.reply(speech, self.store.recent(timings.history_limit), memory)
            if deadline.cancelled_caught:
                reason, detail = "timeout", f"no reply within {timings.speak_timeout:g} s"
        except ModelError as exc:
            reason, detail = "model_error", str(exc)
        except Exception as exc:
            logger.exception("speaking failed", extra={"companion_event": "speak_crashed"})
            reason, detail = "crashed", repr(exc)
        message_id = speech.effect.message_id
        return None if self.conversation.replied(message_id) else SpeakingFailed(message_id, reason, detail)

    def prefetch(self, message: Message, nursery: trio.Nursery) -> None:
        """A model that asks for it (``parallel_params``) fills the speaker's parameters for
        ``message`` now, beside the leader's states call (within both their deadlines)."""
        if getattr(self.model, "parallel_params", False):
            limit = self.timings.states_timeout + self.timings.speak_timeout
            self.speaker.prefetch(message, self.store.recent(self.timings.history_limit), nursery, limit)

    def prepare(self, effect: Speak, nursery: trio.Nursery, *, ahead: bool = False) -> None:
        """This companion is the likely speaker: its reply starts now, held until its slot
        (:meth:`~companion.engine.speech.Speaker.prepare`), unless it replied before a restart
        or its model does not prepare replies: not at all, or (``works_ahead`` without
        ``speculates``) only ``ahead`` of the message, from its preview."""
        if not prepares(self.model, ahead) or self.conversation.replied(effect.message_id):
            return  # the slot will ask it (a scripted model answers at once anyway)
        memory = {**self.store.memory(), "conversation": self.conversation.memory()}
        history = self.history(effect.message)
        self.speaker.prepare(
            effect,
            history,
            memory,
            nursery,
            self.timings.states_timeout + self.timings.speak_timeout,
            ahead=ahead,
        )


class StoreHealth:
    """One error event when the store starts failing, one when it works again."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self.failing = False

    def __call__(self, call: str, exc: Exception | None = None, **fields: Any) -> None:
        """``call`` failed with ``exc``, or worked (``exc=None``)."""
        if self.failing != (exc is not None):
            self.failing = exc is not None
            kind, level = ("store_failed", logging.ERROR) if exc else ("store_recovered", logging.INFO)
            self._emit(kind, level, call=call, error=repr(exc)[:300], **fields)


class Outgoing:
    """The runtime's outgoing hook: this node's reply leaves stamped, once per turn, after the
    store committed that its message was answered (a node killed as its reply leaves, then
    started again and chosen for the same message, must not answer it twice). A routine's
    message goes to :meth:`RoutineDriver.admit`; anything else passes as it is."""

    def __init__(
        self,
        me: str,
        turn: TurnWork,
        gate: Gate,
        routines: RoutineDriver,
        tasks: Mapping[tuple[str, str], Work],
        health: StoreHealth,
        feed: Callable[[Event], None],
    ) -> None:
        self._me, self._conversation, self._store, self._timings = (
            me,
            turn.conversation,
            turn.store,
            turn.timings,
        )
        self._gate, self._routines, self._tasks, self._health, self._feed = (
            gate,
            routines,
            tasks,
            health,
            feed,
        )

    async def __call__(self, topic: str, envelope: Message | Action) -> Message | Action | str:
        if self._gate.stopping and (self._gate.closed or current_firing() is not None):
            return _STOPPING
        if topic != MESSAGES or not isinstance(envelope, Message) or envelope.params.from_ != self._me:
            return envelope
        firing = current_firing()
        if firing is not None:  # a routine's: it opens a conversation, never talks over one
            return self._routines.admit(firing, envelope)
        verdict = self._conversation.outgoing(envelope)
        message_id = self._conversation.speaking_to
        held = None if message_id is None else self._tasks.get(("speech", message_id))
        speech = None if held is None else held.speech
        if isinstance(verdict, str) or message_id is None or speech is None:
            return verdict if isinstance(verdict, str) else _NOT_SPEAKING
        mark = self._store.writes
        try:
            self._store.mark_replied(message_id)
        except Exception as exc:
            self._health("mark_replied", exc, message_id=message_id)
            return _UNRECORDED
        if not await self._store.flush(self._timings.publish_timeout, since=mark):
            error = StoreError(f"the mark was not committed within {self._timings.publish_timeout:g} s")
            self._health("mark_replied", error, message_id=message_id)
            return _UNRECORDED
        verdict = self._conversation.outgoing(envelope)  # the turn may have moved on meanwhile
        if isinstance(verdict, str) or self._conversation.speaking_to != message_id:
            return verdict if isinstance(verdict, str) else _NOT_SPEAKING
        self._feed(ReplyPublished(message_id, verdict))  # REPLIED before it leaves: see HANDLERS
        return verdict
