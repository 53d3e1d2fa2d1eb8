"""The speaker's work in its slot: parameters, the card's triggers, then ``speak`` with its tools.

Two model calls for one reply (``fill_params``, then ``speak`` with the instructions the CEL
conditions chose; only ``speak`` when no condition reads a parameter), every tool call through
the :class:`~companion.actions.ActionRuntime`. The
``speak`` call of a model that streams (``streams_speech``) is shown a live line
(:class:`~companion.engine.voiceline.LiveVoiceLine`): its ``speak_with_voice`` line is voiced a sentence
at a time while it is written, and when the model fails after some of it was heard, what was
heard is published, nothing more. A model that asks for it (``parallel_params``) has the
parameters filled as soon as a message opens a turn for this companion
(:meth:`Speaker.prefetch`), while the leader decides the states. A model that asks for more
(``speculates``) has the likely speaker's whole reply *prepared* then (:meth:`Speaker.prepare`):
its speak call runs beside the states call, held, and the slot adopts it only if it asks exactly
what the slot would, so the first words wait for the states answer and no request after it;
whatever else happens, it is cancelled and nothing of it is heard or published. A model that
asks only to work ahead (``works_ahead``: a server that answers one request at a time) has its
reply prepared from a message's preview alone, while the line before is voiced and the server
idle, its parameters first and its speech once they came.

Two checks sit between the model and the runtime, because models get them wrong: one message
per turn, and a ``to`` that names people and companions of the conversation (names become ids;
a ``to`` naming nobody is refused once with an error the model can act on, then replaced by the
previous speaker and the people, never by nobody). Deadlines, cancellation and what a failure
means for the turn are the engine's.

Two more checks keep what is said the character's own, whatever the model: the parameters are
fitted to the card's schema before the CEL conditions read them (:mod:`companion.card.paramfit`), and a
line that reads the prompt aloud or repeats the conversation (:mod:`companion.lines.check`) is refused,
with the reason, and the model tries again (:data:`LINES_TRIED` lines at most, then the slot is
given up); a streamed line is checked a sentence at a time, before each sentence is voiced, and
when it is refused whole after some of it was heard, what was heard is the line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema
import trio

from companion.actions import ActionDef, ActionRuntime, ToolResult
from companion.actions.builtins import LIVE_LINE, PREVIEW, VOICE_TOOL, no_recipients, resolve_recipients
from companion.card.model import LoadedCard
from companion.card.paramfit import fit_params, plausible_early
from companion.conversation.events import Speak
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES, farewell_counts
from companion.conversation.state import ONE_MESSAGE
from companion.engine.voiceline import LiveVoiceLine, SentenceCheck
from companion.lines.check import LineContext, begins_an_earlier_sentence, check_line, check_said
from companion.lines.directions import without_directions
from companion.lines.fields import line_field
from companion.lines.sentences import CLAUSE_MARKS
from companion.models.base import CompanionModel, ModelError, ParamsRequest, SpeakRequest, ToolCaller
from companion.protocol import MESSAGES, Message, Metadata, new_id

__all__ = ["LINES_TRIED", "ParamsCheck", "Speaker", "Speech", "prepares"]


LINES_TRIED = 3
"""Lines checked for one reply before the slot is given up: the model's, its second try, and a
line of the card's own (a real model's speaker says one after two refused lines, see
:mod:`companion.models.second_try`; the offline model tries one other line)."""


def prepares(model: CompanionModel, ahead: bool) -> bool:
    """Whether ``model`` has a likely speaker's reply prepared: beside the states call
    (``speculates``), or only ``ahead`` of a message, from its preview (``works_ahead``)."""
    return bool(getattr(model, "speculates", False) or (ahead and getattr(model, "works_ahead", False)))


Emit = Callable[..., None]
"""``emit(kind, level, **fields)``: one structured event (the engine's log and observer)."""


@dataclass
class _Prefetched:
    """The parameters being filled for one message ahead of this companion's slot."""

    message_id: str
    scope: trio.CancelScope
    done: trio.Event
    values: dict[str, Any] | None = None
    error: ModelError | None = None


@dataclass(frozen=True)
class _Plan:
    """One speak call as the model will be asked it, and the context its lines are checked in."""

    request: SpeakRequest
    lines: LineContext

    @property
    def asked(self) -> SpeakRequest:
        """What the model is shown: the request without what no prompt reads (the parameters'
        values, which chose the instructions; the engine's own bookkeeping of the conversation),
        so a reply prepared early is kept exactly when it was asked what the slot would ask."""
        memory = {
            k: v for k, v in dict(self.request.extra.get("memory") or {}).items() if k != "conversation"
        }
        return replace(
            self.request, live=None, extra={"names": self.request.extra.get("names"), "memory": memory}
        )


@dataclass
class _Attempt:
    """One speak call of a prepared reply, running in its own scope."""

    plan: _Plan
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    adopted: trio.Event = field(default_factory=trio.Event)
    """Set when the slot adopts this attempt, and only this one: its tool calls and its voice wait
    for it. Not the reply's: an attempt the parameters replaced is cancelled, but a model that
    runs on an asyncio loop (trio-asyncio forwards the cancellation into the loop's body a
    scheduling step later) could still be waiting there when the slot adopts its successor, and
    would then speak with the instructions of the guess."""
    error: Exception | None = None


@dataclass
class _Prepared:
    """A reply prepared before this companion knows it speaks (:meth:`Speaker.prepare`): voiced
    and published only once a slot's :class:`Speech` adopts it, cancelled otherwise."""

    message_id: str
    scope: trio.CancelScope
    adopted: trio.Event = field(default_factory=trio.Event)
    speech: Speech | None = None
    attempt: _Attempt | None = None

    def speech_of(self, attempt: _Attempt) -> Callable[[], Awaitable[Speech]]:
        """What ``attempt``'s tool calls wait for: the slot's speech, once it adopted ``attempt``
        (an attempt replaced before that waits until its cancellation reaches it)."""

        async def speech() -> Speech:
            await attempt.adopted.wait()
            assert self.speech is not None
            return self.speech

        return speech


@dataclass
class Speech:
    """One reply being prepared: whether it went out, and whether its ``to`` was refused once."""

    effect: Speak
    replied: Callable[[str], bool]
    """Whether this companion answered a message: the conversation machine's record
    (:meth:`~companion.conversation.state.MachineState.replied`), the one "replied" there is."""
    refused_once: bool = False
    lines_refused: int = 0
    """Lines of this reply refused by :func:`~companion.lines.check.check_line` so far."""

    @property
    def spoke(self) -> bool:
        """Whether this reply went out (the machine's REPLIED): one message per turn."""
        return self.replied(self.effect.message_id)


class ParamsCheck:
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


def _sentence_check(context: LineContext) -> SentenceCheck:
    """The check each sentence of a streamed line passes before it is voiced: the same as a
    whole line's (:func:`~companion.lines.check.check_line`), so a sentence that reads the prompt aloud,
    copies the conversation or says again what its line said is never heard, nor anything after it."""

    def check(sentence: str, said_before: tuple[str, ...]) -> str | None:
        # a first clause (or an over-long sentence cut at a clause) does not "stop mid-sentence"
        verdict = check_line(sentence.rstrip(CLAUSE_MARKS), context, said_before)
        return None if verdict.ok else verdict.reason  # a line refusal, as the model is told one

    return check


def _live_line(tool_id: str) -> LiveVoiceLine | None:
    """The live line ``tool_id``'s line is voiced through, if any."""
    live = LIVE_LINE.get()
    return live if isinstance(live, LiveVoiceLine) and live.voices(tool_id) else None


class Speaker:
    """Prepares this companion's replies (one :class:`Speech` at a time, the engine decides when)."""

    def __init__(
        self,
        loaded: LoadedCard,
        model: CompanionModel,
        runtime: ActionRuntime,
        directory: Mapping[str, Metadata],
        emit: Emit,
    ) -> None:
        self.loaded, self.card, self.me = loaded, loaded.card, loaded.card.metadata
        self.model, self.runtime, self.directory = model, runtime, directory
        self._emit = emit
        self._prefetched: _Prefetched | None = None
        self._prepared: _Prepared | None = None
        self._live: set[LiveVoiceLine] = set()
        """The lines being written and voiced now (a held, prepared one among them)."""
        self._last_values: dict[str, Any] = {}
        """The parameters of this companion's last reply: a prepared reply's guess until the
        model's own for the message arrive."""
        self.preview: Callable[[Message], None] | None = None
        """Where a voiced message goes once its text is complete, before it is voiced (the
        engine publishes it as a preview: :mod:`companion.conversation.preview`)."""
        self.params_check = ParamsCheck(self.card.events.params)
        if self.params_check.problem is not None:
            emit("params_schema_invalid", logging.ERROR, problem=self.params_check.problem)
        self.asks_params = loaded.triggers.reads_params
        """Whether a reply asks the model for the parameters: only when a condition reads one,
        since they choose nothing else (a request fewer before the first words otherwise)."""
        if not self.asks_params:
            emit(
                "params_not_asked",
                logging.INFO,
                card=self.me.id,
                conditions=len(loaded.triggers),
                reason="no condition of the card reads a parameter: the instructions are the same "
                "whatever the values, so no model is asked for them",
            )

    async def reply(self, speech: Speech, history: list[Message], memory: Mapping[str, Any]) -> None:
        """Fill the parameters, evaluate the triggers, run ``speak``. The reply itself leaves
        through the runtime (its outgoing hook records it); raises :class:`ModelError` when the
        model cannot speak. A reply prepared for the same message (:meth:`prepare`) that asked
        the model exactly what this one would is taken over instead of asking again."""
        effect = speech.effect
        try:
            raw = await self._params(effect.message, history)
        except ModelError as exc:
            # The parameters only choose instructions: speak without them rather than not at all.
            self._emit(
                "params_failed",
                logging.WARNING,
                message_id=effect.message_id,
                error=str(exc),
                reason="speaking without parameters; conditions that read them do not match",
            )
            raw = {}
        values, changes = self._fitted(effect, raw)
        self._last_values = values
        plan = self._plan(effect, history, memory, values)
        self._emit(
            "instructions",
            logging.INFO,
            message_id=effect.message_id,
            params=values,
            param_changes=list(changes),
            param_issues=self.params_check.issues(values),
            instructions=[{"tool": i.tool, "instruction": i.instruction} for i in plan.request.instructions],
        )
        prepared = self._take_prepared(effect.message_id, plan)
        if prepared is not None:
            await self._adopt(prepared, speech)
            return

        async def speech_of() -> Speech:
            return speech

        call_tool = self._caller(speech_of, plan.lines)
        if getattr(self.model, "streams_speech", False):
            await self._speak_live(plan.request, speech_of, call_tool, plan.lines)
        else:  # the whole line at once: speak_with_voice voices it a sentence at a time itself
            await self.model.speak(plan.request, call_tool)

    def _fitted(self, effect: Speak, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The model's parameters fitted to the card's schema (and, in the first replies of a
        conversation nobody is closing, to what so early a reply may plausibly say)."""
        fitted = fit_params(dict(values), self.card.events.params)
        changes = list(fitted.changes)
        said = effect.message.params
        early = effect.turn <= 1 or not farewell_counts(self.me.id, effect.turn, DEFAULT_MIN_REPLIES)
        if effect.closing == "none" and early:
            # a goodbye that would not count is not said; one heard that counted may be answered
            counted = farewell_counts(said.from_, effect.turn - 1, DEFAULT_MIN_REPLIES)
            held = plausible_early(fitted.values, self.card.events.params, said.message if counted else "")
            fitted, changes = held, changes + list(held.changes)
        return dict(fitted.values), changes

    def _plan(
        self, effect: Speak, history: list[Message], memory: Mapping[str, Any], values: Mapping[str, Any]
    ) -> _Plan:
        """The speak request for ``effect`` with fitted ``values``: the card's CEL conditions
        choose the instructions; and the context its lines are checked in."""
        message = effect.message
        instructions = self.loaded.triggers.evaluate(dict(values))
        request = SpeakRequest(
            me=self.me,
            role=self.card.role,
            message=message,
            history=history,
            instructions=instructions,
            tools=self.runtime.tool_specs(),
            recipients=list(effect.recipients),
            closing=effect.closing,
            extra={
                "names": {cid: meta.name for cid, meta in self.directory.items()},
                "params": dict(values),
                "memory": dict(memory),
            },
            assessed=self.card.events.params if self.asks_params else None,
        )
        said = [m for m in history if m.params.id != message.params.id] + [message]
        prompt_texts = [self.card.role, *(i.instruction for i in instructions)]
        names = {cid: meta.name for cid, meta in self.directory.items()} | {self.me.id: self.me.name}
        return _Plan(request, LineContext.of(said, self.me.id, names, prompt_texts))

    def _caller(self, speech_of: Callable[[], Awaitable[Speech]], lines: LineContext) -> ToolCaller:
        """``call_tool`` for the model: a message tool's call waits for the speech it belongs to
        (a prepared reply's until the slot is this companion's), then passes the checks."""

        async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
            speech = await speech_of()
            defn = self.runtime.tools.get(tool_id)
            if isinstance(defn, ActionDef) and defn.topic == MESSAGES:
                raw = self._without_directions(raw, speech)
                if speech.spoke:
                    return ToolResult(tool_id, new_id(), "refused", ONE_MESSAGE).for_model()
                checked = self.checked_line(tool_id, raw, speech, lines)
                if isinstance(checked, ToolResult):
                    return checked.for_model()
                raw = checked
                if isinstance(raw.get("to"), list):
                    checked = self.addressed(tool_id, raw, speech)
                    if isinstance(checked, ToolResult):
                        return checked.for_model()
                    raw = checked
            token = PREVIEW.set(self.preview)
            try:
                return (await self.runtime.call(tool_id, raw)).for_model()
            finally:
                PREVIEW.reset(token)

        return call_tool

    def _params_request(self, message: Message, history: list[Message]) -> ParamsRequest:
        """The parameters call for ``message``, naming the tools the speak call will have."""
        card = self.card
        return ParamsRequest(
            self.me, card.role, card.events.params, message, history, self.runtime.tool_specs()
        )

    def prefetch(self, message: Message, history: list[Message], nursery: trio.Nursery, limit: float) -> None:
        """Start filling the parameters for ``message`` in ``nursery`` (at most ``limit`` seconds),
        before this companion knows whether it will speak: the leader's states call and this
        call then run side by side, and the slot, if it comes, starts with ``speak``. One at a
        time: a newer message's replaces an older one's. Nothing when no condition reads them."""
        if not self.asks_params:
            return
        if self._prefetched is not None:
            if self._prefetched.message_id == message.params.id:
                return  # already on their way
            self._prefetched.scope.cancel()
        ahead = _Prefetched(
            message.params.id, trio.CancelScope(deadline=trio.current_time() + limit), trio.Event()
        )
        self._prefetched = ahead
        request = self._params_request(message, history)

        async def fill() -> None:
            try:
                with ahead.scope:
                    ahead.values = await self.model.fill_params(request)
                if ahead.scope.cancelled_caught:
                    ahead.error = ModelError("parameters: no answer in time", reason="no answer in time")
            except ModelError as exc:
                ahead.error = exc
            except Exception as exc:  # a model bug: the slot falls back to filling them itself
                self._emit(
                    "params_prefetch_crashed", logging.ERROR, message_id=ahead.message_id, error=repr(exc)
                )
            finally:
                ahead.done.set()

        nursery.start_soon(fill)

    def prepare(
        self,
        effect: Speak,
        history: list[Message],
        memory: Mapping[str, Any],
        nursery: trio.Nursery,
        limit: float,
        *,
        ahead: bool = False,
    ) -> bool:
        """Start this companion's reply to ``effect`` (what it expects its slot to ask) in
        ``nursery`` before it knows it speaks, for at most ``limit`` seconds; ``False`` when the
        model does not ask for it (``speculates``; ``works_ahead`` when ``ahead``: the message is
        only previewed, its line still voiced).

        The parameters are filled (:meth:`prefetch`) and, at the same time, ``speak`` is called
        with the instructions the card's conditions give for this companion's last parameters;
        when the parameters come and choose other instructions, that call is cancelled and
        another begins with theirs. Its sentences are admitted and checked but nobody hears
        them, and no tool runs, until the slot's :meth:`reply` adopts it, which it does only
        when the slot asks exactly what was asked here (:attr:`_Plan.asked`: same message,
        history, instructions, recipients, closing stage). Anything else cancels it
        (:meth:`keep_prepared`): nothing of it reaches anyone."""
        if not prepares(self.model, ahead):
            return False
        current = self._prepared
        if current is not None and current.message_id == effect.message_id:
            return True  # prepared from the message's preview: the slot's checks still apply
        self.keep_prepared(None, "a newer message")
        self.prefetch(effect.message, history, nursery, limit)
        prepared = _Prepared(effect.message_id, trio.CancelScope(deadline=trio.current_time() + limit))
        self._prepared = prepared
        self._emit("reply_prepared", logging.INFO, message_id=effect.message_id, closing=effect.closing)
        nursery.start_soon(self._prepare, prepared, effect, history, dict(memory))
        return True

    async def _prepare(
        self, prepared: _Prepared, effect: Speak, history: list[Message], memory: Mapping[str, Any]
    ) -> None:
        try:
            with prepared.scope:
                await self._prepare_in(prepared, effect, history, memory)
        except Exception as exc:  # a bug here must not take the engine down: the slot asks anew
            prepared.attempt = None
            self._emit("reply_prepare_crashed", logging.ERROR, message_id=effect.message_id, error=repr(exc))

    async def _prepare_in(
        self, prepared: _Prepared, effect: Speak, history: list[Message], memory: Mapping[str, Any]
    ) -> None:
        async with trio.open_nursery() as nursery:
            ahead = self._prefetched
            if ahead is not None and ahead.message_id != effect.message_id:
                ahead = None
            if ahead is not None and getattr(self.model, "serial", False):
                # One request at a time: a speak call with guessed instructions would only queue
                # beside the parameters call, and be written again when they choose others.
                await ahead.done.wait()
            known = ahead.values if ahead is not None and ahead.done.is_set() else None
            guess = self._fitted(effect, self._last_values if known is None else known)[0]
            self._attempt(prepared, self._plan(effect, history, memory, guess), nursery)
            if ahead is None:
                return
            await ahead.done.wait()
            values = self._fitted(effect, ahead.values or {})[0]
            plan = self._plan(effect, history, memory, values)
            current = prepared.attempt
            if current is not None and current.plan.asked != plan.asked and not prepared.adopted.is_set():
                self._emit(
                    "reply_prepared_again",
                    logging.INFO,
                    message_id=effect.message_id,
                    reason="the parameters chose other instructions than the guess",
                )
                current.scope.cancel()
                self._attempt(prepared, plan, nursery)

    def _attempt(self, prepared: _Prepared, plan: _Plan, nursery: trio.Nursery) -> None:
        attempt = prepared.attempt = _Attempt(plan)
        speech_of = prepared.speech_of(attempt)
        call_tool = self._caller(speech_of, plan.lines)

        async def run() -> None:
            try:
                with attempt.scope:
                    if getattr(self.model, "streams_speech", False):
                        await self._speak_live(
                            plan.request, speech_of, call_tool, plan.lines, attempt.adopted
                        )
                    else:
                        await self.model.speak(plan.request, call_tool)
            except Exception as exc:  # the adopting slot raises it (a ModelError gives the slot up)
                attempt.error = exc
            finally:
                attempt.done.set()

        nursery.start_soon(run)

    def keep_prepared(self, message_id: str | None, reason: str) -> None:
        """Cancel a prepared reply that no slot adopted unless it is for ``message_id`` (the
        engine calls this whenever the turn moves: another speaker chosen, the turn over)."""
        prepared = self._prepared
        if prepared is None or prepared.adopted.is_set() or prepared.message_id == message_id:
            return
        self._prepared = None
        prepared.scope.cancel()
        self._emit("reply_prepared_dropped", logging.INFO, message_id=prepared.message_id, reason=reason)

    def drop_ahead(self, message_id: str, reason: str) -> None:
        """Cancel what was started for ``message_id`` from its preview (its parameters and its
        prepared reply): the message differed from it, or did not come."""
        ahead = self._prefetched
        if ahead is not None and ahead.message_id == message_id:
            self._prefetched = None
            ahead.scope.cancel()
        prepared = self._prepared
        if prepared is not None and prepared.message_id == message_id:
            self.keep_prepared(None, reason)

    def _take_prepared(self, message_id: str, plan: _Plan) -> _Prepared | None:
        """The prepared reply to ``message_id`` when it asked what ``plan`` asks; any other is
        cancelled."""
        prepared = self._prepared
        if prepared is None:
            return None
        attempt = prepared.attempt
        if prepared.message_id == message_id and attempt is not None and attempt.plan.asked == plan.asked:
            self._prepared = None
            return prepared
        if prepared.message_id == message_id and attempt is None:
            # both waited for the same parameters and the slot woke first: nothing was asked yet
            self.keep_prepared(None, "the slot came before the prepared speech was asked for")
        else:
            self.keep_prepared(None, "the slot asks for another reply than the one prepared")
        return None

    async def _adopt(self, prepared: _Prepared, speech: Speech) -> None:
        """The slot's :class:`Speech` takes the prepared reply over: its voice starts, its tool
        calls run; its end (or failure) is this reply's. Within the slot's deadline, not the
        preparation's."""
        attempt = prepared.attempt
        assert attempt is not None
        prepared.speech = speech
        prepared.scope.deadline = math.inf
        prepared.adopted.set()
        attempt.adopted.set()
        self._emit("reply_prepared_adopted", logging.INFO, message_id=prepared.message_id)
        try:
            await attempt.done.wait()
        finally:
            if not attempt.done.is_set():  # the slot was cancelled (withdrawn, out of time)
                prepared.scope.cancel()
        if attempt.error is not None:
            raise attempt.error

    async def _params(self, message: Message, history: list[Message]) -> dict[str, Any]:
        """The card's parameters for ``message``: the prefetched ones when they were asked for
        (awaited; they are on their way), else one ``fill_params`` call now; none when no
        condition reads them (:attr:`asks_params`)."""
        if not self.asks_params:
            return {}
        ahead = self._prefetched
        if ahead is not None and ahead.message_id == message.params.id:
            await ahead.done.wait()
            if ahead.error is not None:
                raise ahead.error
            if ahead.values is not None:
                return ahead.values
        request = self._params_request(message, history)
        return await self.model.fill_params(request)

    async def _speak_live(
        self,
        request: SpeakRequest,
        speech_of: Callable[[], Awaitable[Speech]],
        call_tool: ToolCaller,
        lines: LineContext,
        hold: trio.Event | None = None,
    ) -> None:
        """``model.speak`` with a live line voiced beside it, each sentence passing the line check
        in ``lines`` before it is voiced, nothing voiced before ``hold``. A model that fails, or
        ends without publishing, after clients began to hear its line publishes what they heard."""
        begins = begins_an_earlier_sentence(lines)
        line = LiveVoiceLine(
            self.runtime.ask_clients,
            self._emit,
            check=_sentence_check(lines),
            clause_alone=lambda clause: not begins(clause),
            hold=hold,
        )
        failure: ModelError | None = None
        self._live.add(line)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(line.run)
            token = LIVE_LINE.set(line)
            try:
                await self.model.speak(replace(request, live=line), call_tool)
            except ModelError as exc:
                failure = exc
            finally:
                LIVE_LINE.reset(token)
                line.end()
                self._live.discard(line)
            speech = await speech_of()
            if not speech.spoke and line.started:
                self._emit(
                    "voice_line_published_as_said",
                    logging.WARNING,
                    message_id=speech.effect.message_id,
                    said=line.said[:200],
                    reason=str(failure) if failure else "the model ended without publishing its line",
                )
                token = LIVE_LINE.set(line)
                try:
                    said = {"message": line.said, "to": list(speech.effect.fallback), "emotion": "neutral"}
                    await call_tool(VOICE_TOOL, said)
                finally:
                    LIVE_LINE.reset(token)
        if failure is not None and not speech.spoke:
            raise failure

    def cut_short(self, reason: str) -> bool:
        """Say no more of the line being voiced (:meth:`LiveVoiceLine.cut_short
        <companion.engine.voiceline.LiveVoiceLine.cut_short>`): its reply then publishes what
        was heard, at once. Whether a line was being heard (a held one never is)."""
        return any([line.cut_short(reason) for line in list(self._live)])

    def _without_directions(self, raw: Mapping[str, Any], speech: Speech) -> Mapping[str, Any]:
        """``raw`` with its line's opening stage directions dropped (:mod:`companion.lines.directions`):
        the line the live voice showed while it streamed, and the one published."""
        field = line_field(raw)
        if field is None:
            return raw
        text = str(raw[field])
        said = without_directions(text, speaker=(self.me.name, self.me.id))
        if said == text:
            return raw
        effect = speech.effect
        self._emit("stage_direction_dropped", logging.INFO, message_id=effect.message_id, text=text[:80])
        return {**raw, field: said}

    def checked_line(
        self, tool_id: str, raw: Mapping[str, Any], speech: Speech, context: LineContext
    ) -> Mapping[str, Any] | ToolResult:
        """``raw`` when its line may be said; else the refusal the model is asked again with.
        The :data:`LINES_TRIED`-th refused line gives the slot up (:class:`ModelError`): better
        no reply than a copy or the prompt read aloud.

        What a client heard is never refused: the line the live line settled as heard
        (:attr:`~companion.engine.voiceline.LiveVoiceLine.settled`) passed, sentence by sentence,
        before anyone heard it, and a line refused whole after some of it was heard is settled as
        heard then (:meth:`LiveVoiceLine.settle <companion.engine.voiceline.LiveVoiceLine.settle>`):
        ``raw`` with the heard line. A second try could not be voiced, and what was heard would be
        published anyway."""
        field = line_field(raw)
        if field is None:
            return raw
        text = str(raw[field])
        live = _live_line(tool_id)
        if live is not None and live.settled == text:
            return raw
        effect = speech.effect
        if live is None:  # written whole: said as a voiced line would be, a sentence at a time
            part, verdict = check_said(text, context)
            event = "line_cut"
            why = "a later sentence was refused: the sentences before it are the line, as they would "
            why += f"be of a line voiced as it is written ({verdict.reason[:160]})"
        else:  # each sentence passed before it was voiced: the line as a whole is left
            verdict = check_line(text, context)
            event = "line_refused_after_heard"
            why = "part of it was heard already: that part is the line, the model is not asked again"
        if verdict.ok:
            return raw
        if live is not None:
            part = live.settle(f"the whole line was refused ({verdict.kind})") or ""
        if part:
            self._emit(
                event,
                logging.WARNING,
                message_id=effect.message_id,
                verdict=verdict.kind,
                text=text[:200],
                said=part[:200],
                reason=why,
            )
            return {**raw, field: part}
        speech.lines_refused += 1
        self._emit(
            "line_refused",
            logging.WARNING,
            message_id=effect.message_id,
            verdict=verdict.kind,
            attempt=speech.lines_refused,
            text=text[:200],
            reason=verdict.reason[:300],
        )
        if speech.lines_refused >= LINES_TRIED:
            raise ModelError(
                f"{self.me.id}: {LINES_TRIED} lines refused ({verdict.kind}): {verdict.reason[:200]}",
                reason=f"its line was refused {LINES_TRIED} times ({verdict.kind}); the slot is given up",
            )
        return ToolResult(tool_id, new_id(), "refused", verdict.reason)

    def addressed(
        self, tool_id: str, raw: Mapping[str, Any], speech: Speech
    ) -> Mapping[str, Any] | ToolResult:
        """``raw`` with its ``to`` as ids of the companions present and the conversation's people;
        a ``to`` that names none of them is refused once, then replaced by the fallback recipients."""
        effect = speech.effect
        names = {cid: meta.name for cid, meta in self.directory.items()}
        to = [str(entry) for entry in raw["to"]]
        # Whoever spoke to us is addressable, bound or not (an aikyo companion whose metadata
        # never arrived, a peer with a companion id but no card): the fallback holds the sender.
        people = tuple(dict.fromkeys([*effect.people, *effect.fallback]))
        ids, unknown = resolve_recipients(to, me=self.me.id, companions=names, people=people)
        if ids:
            return {**raw, "to": ids}
        if not speech.refused_once:
            speech.refused_once = True
            self._emit(
                "recipients_refused",
                logging.INFO,
                message_id=effect.message_id,
                to=to[:10],
                reason="names nobody of the conversation",
            )
            return ToolResult(tool_id, new_id(), "refused", no_recipients(to, unknown, names, people))
        fallback = list(effect.fallback)
        self._emit(
            "recipients_fallback",
            logging.WARNING,
            message_id=effect.message_id,
            to=fallback,
            reason="named nobody of the conversation twice: the previous speaker and the people",
        )
        return {**raw, "to": fallback}
