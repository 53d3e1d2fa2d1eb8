"""The one execution path for every tool call: a model's tool call, a test, the command line.

:meth:`ActionRuntime.call` validates the input (all issues at once, the handler never runs on a
bad input), asks for approval when the action needs it, runs the handler under its deadline and
the caller's cancellation, and settles exactly once with a :class:`ToolResult`. What an action
returns is checked, passed to the outgoing hook (which may stamp or refuse it), published on
its topic and recorded in the history.

A handler may call another tool of the same companion (:meth:`ActionContext.call`): the callee
takes the same path, nested inside the caller (its deadline never past the caller's, the
caller's cancellation reaching it), and chains are kept short and free of cycles. Changes to
the tool table are announced to listeners (:meth:`ActionRuntime.on_tools_changed`).
"""

from __future__ import annotations

import inspect
import logging
import math
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import trio
from pydantic import BaseModel, ValidationError

from companion.actions.approval import APPROVAL_QUERY, DEFAULT_APPROVAL_TIMEOUT, approval_body, read_approval
from companion.actions.catalog import ToolChange, ToolInfo, ToolsChanged, tool_info
from companion.actions.context import ActionContext
from companion.actions.definition import ActionDef, KnowledgeDef, ToolSpec, validate_input
from companion.actions.progress import DEFAULT_MIN_INTERVAL, ProgressGate, progress_action
from companion.actions.queries import PendingQueries
from companion.actions.results import ActionRefused, InputIssue, QueryTimeout, ToolResult, published_summary
from companion.log import log_event
from companion.ports import OutgoingHook, Publisher
from companion.protocol import ACTIONS, MESSAGES, Action, Message, Metadata, QueryResult, new_id
from companion.store.history import ConversationHistory, RecentMessages
from companion.store.kv import KeyValueStore, StoreLimitExceeded
from companion.tasks import innermost

__all__ = ["MAX_CALL_DEPTH", "MAX_NOTES", "MAX_NOTE_CHARS", "ActionRuntime", "ToolDef", "ToolsListener"]

logger = logging.getLogger("companion.actions")

ToolDef: TypeAlias = ActionDef | KnowledgeDef

DEFAULT_HISTORY_LIMIT: Final = 20
DEFAULT_PUBLISH_TIMEOUT: Final = 10.0
"""Seconds to hand one envelope to the network before the call counts as an internal error."""
MAX_CALL_DEPTH: Final = 4
"""How many calls may be nested below the first one (a model's, a routine's, the command line's)."""
MAX_NOTES: Final = 8
"""Notes kept per call; later ones are dropped (and logged)."""
MAX_NOTE_CHARS: Final = 1_000
"""Longer notes are cut to this many characters."""

ToolsListener: TypeAlias = Callable[[ToolsChanged], None]


class _BadOutput(Exception):
    """An action returned something the runtime cannot publish (a bug in the action)."""


@dataclass(slots=True)
class _Call:
    call_id: str
    defn: ToolDef
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    cancel_reason: str | None = None
    handler_scope: trio.CancelScope | None = None
    cap_at: float = math.inf
    gate: ProgressGate = field(default_factory=ProgressGate)
    parent: _Call | None = None
    """The call whose handler made this one (``ActionContext.call``), or None for a first call."""
    notes: list[str] = field(default_factory=list)

    def chain(self) -> Iterator[_Call]:
        """This call and the calls above it, innermost first."""
        call: _Call | None = self
        while call is not None:
            yield call
            call = call.parent


@dataclass(frozen=True, slots=True)
class _Produced:
    value: Any


class ActionRuntime:
    """Runs this companion's tools. One per companion; safe to use from many tasks at once."""

    def __init__(
        self,
        *,
        metadata: Metadata,
        publisher: Publisher,
        directory: Mapping[str, Metadata],
        history: RecentMessages,
        clock: Callable[[], float] = trio.current_time,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT,
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
        progress_interval: float = DEFAULT_MIN_INTERVAL,
        outgoing: OutgoingHook | None = None,
        kv: KeyValueStore | None = None,
        max_call_depth: int = MAX_CALL_DEPTH,
    ) -> None:
        """``clock`` paces progress messages only; deadlines always use trio's clock.

        ``history`` is what a tool call reads as the conversation so far. When it also records
        (a :class:`ConversationHistory`), each message an action published is recorded there;
        a :class:`~companion.store.history.HistoryReader` of a history someone else keeps (the
        engine records every message on arrival) is only read.

        ``outgoing`` sees every envelope an action produced before it is published: it returns
        the envelope to publish (a conversation engine stamps its replies) or a sentence saying
        why it may not go out (the call ends ``refused`` with it, and nothing more is published).
        ``kv`` holds the tools' :attr:`ActionContext.store` (usually
        ``KeyValueStore.open(<the companion's SQLite file>)``); without it values live in memory
        for the runtime's lifetime. The runtime does not close it.
        """
        if max_call_depth < 0:
            raise ValueError(f"max_call_depth must be 0 or more, got {max_call_depth!r}")
        self._metadata = metadata
        self._publisher = publisher
        self._directory: Mapping[str, Metadata] = MappingProxyType(directory)
        self._history = history
        self._record = history.append if isinstance(history, ConversationHistory) else None
        self._clock = clock
        self._history_limit = history_limit
        self._approval_timeout = approval_timeout
        self._publish_timeout = publish_timeout
        self._progress_interval = progress_interval
        self._outgoing = outgoing
        self._tools: dict[str, ToolDef] = {}
        self._calls: dict[str, _Call] = {}
        self._queries = PendingQueries(publisher, metadata.id)
        self._kv = kv if kv is not None else KeyValueStore.in_memory()
        self._max_call_depth = max_call_depth
        self._revision = 0
        self._tool_listeners: list[ToolsListener] = []

    # --- the tool table ------------------------------------------------------------------------

    @property
    def companion_id(self) -> str:
        return self._metadata.id

    @property
    def tools(self) -> Mapping[str, ToolDef]:
        """The registered tools by id (a live read-only view)."""
        return MappingProxyType(self._tools)

    def register(self, defn: ToolDef, *, replace: bool = False) -> None:
        """Add a tool; the model sees it from its next step. Calls already running are unaffected.

        A change (a new tool, or ``replace=True`` with a different definition) is announced to
        the :meth:`on_tools_changed` listeners; registering the same definition again is not.
        """
        if not isinstance(defn, ActionDef | KnowledgeDef):
            raise TypeError(f"expected an ActionDef or KnowledgeDef, got {type(defn).__name__}")
        previous = self._tools.get(defn.id)
        if previous is defn:
            return
        if previous is not None and not replace:
            raise ValueError(f"a tool named {defn.id!r} is already registered (pass replace=True)")
        self._tools[defn.id] = defn
        log_event(logger, "tool_registered", logging.DEBUG, tool=defn.id, kind=defn.kind)
        self._announce("registered" if previous is None else "replaced", defn.id)

    def remove(self, tool_id: str) -> bool:
        """Remove a tool (announced). A call already running keeps its handler. False if it was not there."""
        removed = self._tools.pop(tool_id, None) is not None
        if removed:
            log_event(logger, "tool_unregistered", logging.DEBUG, tool=tool_id)
            self._announce("removed", tool_id)
        return removed

    unregister = remove
    """The earlier name of :meth:`remove`."""

    @property
    def tools_revision(self) -> int:
        """Counts the changes to the tool table; a listener that missed one sees a gap."""
        return self._revision

    def tool_list(self) -> tuple[ToolInfo, ...]:
        """What this companion offers (id, description, kind), in registration order."""
        return tuple(tool_info(d) for d in self._tools.values())

    def on_tools_changed(self, listener: ToolsListener) -> Callable[[], None]:
        """Call ``listener(event)`` after every change to the tool table; returns the unsubscribe.

        The event carries the full list (as Tesseron's ``actions/list_changed``), so a listener
        never has to ask. Listeners run synchronously inside :meth:`register` / :meth:`remove`:
        keep them quick (hand the event to a channel); an exception in one is logged and does
        not stop the change or the other listeners.
        """
        self._tool_listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._tool_listeners:
                self._tool_listeners.remove(listener)

        return unsubscribe

    def _announce(self, change: ToolChange, tool_id: str) -> None:
        self._revision += 1
        event = ToolsChanged(self._revision, change, tool_id, self.tool_list())
        for listener in list(self._tool_listeners):
            try:
                listener(event)
            except Exception as exc:  # a listener's bug must not undo or block the change
                log_event(
                    logger,
                    "tools_listener_failed",
                    logging.ERROR,
                    tool=tool_id,
                    change=change,
                    error=f"{type(exc).__name__}: {exc}",
                )

    def tool_specs(self) -> list[ToolSpec]:
        """The tools as the model sees them, in registration order."""
        return [ToolSpec(d.id, d.description, d.input_schema(), d.kind) for d in self._tools.values()]

    # --- the network side ------------------------------------------------------------------------

    def deliver_query_result(self, result: QueryResult) -> bool:
        """Feed a QueryResult from topic ``queries``. True if a pending query took it."""
        return self._queries.deliver(result)

    async def ask_clients(
        self,
        query_type: str,
        body: Mapping[str, Any] | None,
        timeout: float,
        metadata: Mapping[str, Any] | None = None,
    ) -> QueryResult:
        """A query to this companion's clients outside any tool call (the speaker's live voice,
        which starts before the speaking tool's call is complete); as a handler's ``send_query``."""
        return await self._queries.ask(query_type, body, timeout, metadata=metadata)

    @property
    def pending_queries(self) -> int:
        """How many queries are waiting for an answer right now."""
        return len(self._queries)

    @property
    def query_outcomes(self) -> Mapping[str, int]:
        """Queries asked so far by how they ended (:attr:`PendingQueries.outcomes
        <companion.actions.queries.PendingQueries.outcomes>`)."""
        return self._queries.outcomes

    @property
    def running(self) -> frozenset[str]:
        """Ids of the calls running right now."""
        return frozenset(self._calls)

    def cancel(self, call_id: str, reason: str = "cancelled by the caller") -> bool:
        """Cancel a running call; it settles as ``cancelled``. False if no such call is running."""
        call = self._calls.get(call_id)
        if call is None:
            return False
        if call.cancel_reason is None:
            call.cancel_reason = reason
        call.scope.cancel()
        return True

    # --- calling ---------------------------------------------------------------------------------

    async def call(
        self, tool_id: str, raw_input: Mapping[str, Any], *, call_id: str | None = None
    ) -> ToolResult:
        """Run one tool call to its single outcome.

        Returns a :class:`ToolResult` for every outcome the call itself decides, including
        timeouts and :meth:`cancel`. If the *caller's* own cancel scope is cancelled, trio's
        ``Cancelled`` propagates as usual (nothing is published and no query stays pending).
        """
        return await self._run(tool_id, raw_input, call_id or new_id(), None)

    async def _nested(self, parent: _Call, tool_id: str, raw_input: Mapping[str, Any]) -> ToolResult:
        """``ActionContext.call``: one more link in ``parent``'s chain, refused if it loops or is too deep."""
        if self._calls.get(parent.call_id) is not parent:
            raise RuntimeError(
                f"{parent.defn.id!r} used ActionContext.call after its call {parent.call_id!r} ended"
            )
        call_id = new_id()
        chain = [c.defn.id for c in reversed(list(parent.chain()))]
        if tool_id in chain:
            path = " -> ".join([*chain, tool_id])
            return self._log_result(
                ToolResult(
                    tool_id,
                    call_id,
                    "call_cycle",
                    f"{parent.defn.id!r} cannot call {tool_id!r}: it is already running in this chain "
                    f"({path}); a tool may not call itself, directly or through others",
                ),
                0.0,
            )
        if len(chain) > self._max_call_depth:
            return self._log_result(
                ToolResult(
                    tool_id,
                    call_id,
                    "call_too_deep",
                    f"{parent.defn.id!r} cannot call {tool_id!r}: calls may nest at most "
                    f"{self._max_call_depth} deep ({' -> '.join(chain)})",
                ),
                0.0,
            )
        return await self._run(tool_id, raw_input, call_id, parent)

    async def _run(
        self, tool_id: str, raw_input: Mapping[str, Any], call_id: str, parent: _Call | None
    ) -> ToolResult:
        if call_id in self._calls:
            raise ValueError(f"call id {call_id!r} is already running")
        defn = self._tools.get(tool_id)
        if defn is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return self._log_result(
                ToolResult(tool_id, call_id, "not_found", f"no tool named {tool_id!r}; available: {known}"),
                0.0,
            )
        value = validate_input(defn.input_model, raw_input)
        if isinstance(value, tuple):
            return self._log_result(_invalid(defn, call_id, value), 0.0)

        call = _Call(call_id, defn, gate=ProgressGate(self._progress_interval), parent=parent)
        self._calls[call_id] = call
        started = trio.current_time()
        log_event(
            logger,
            "tool_call_started",
            tool=tool_id,
            call_id=call_id,
            parent_call_id=None if parent is None else parent.call_id,
        )
        outcome: ToolResult | _Produced | None = None
        try:
            with call.scope:
                try:
                    outcome = await self._approve_and_run(call, value)
                except Exception as exc:  # the runtime's own infrastructure (history, publisher)
                    outcome = self._internal(call, exc, f"{tool_id!r} could not run")
        except trio.Cancelled:
            log_event(logger, "tool_call_abandoned", logging.INFO, tool=tool_id, call_id=call_id)
            raise
        finally:
            self._calls.pop(call_id, None)

        if call.scope.cancel_called:
            result = ToolResult(
                tool_id,
                call_id,
                "cancelled",
                f"the call was cancelled ({call.cancel_reason}); nothing was done",
            )
        elif isinstance(outcome, ToolResult):
            result = outcome
        else:
            assert outcome is not None
            result = await self._settle(call, outcome.value)
        if call.notes:
            result = replace(result, notes=tuple(call.notes))
        return self._log_result(result, trio.current_time() - started)

    async def call_for_model(self, tool_id: str, raw_input: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`call`, answering with :meth:`ToolResult.for_model` (a ``models.ToolCaller``)."""
        return (await self.call(tool_id, raw_input)).for_model()

    async def _approve_and_run(self, call: _Call, value: BaseModel) -> ToolResult | _Produced:
        defn = call.defn
        if isinstance(defn, ActionDef) and defn.requires_approval:
            refusal = await self._approve(call, defn, value)
            if refusal is not None:
                return refusal
        ctx = self._context(call, value)
        handler: Callable[[ActionContext[Any]], Any] = (
            defn.publish if isinstance(defn, ActionDef) else defn.fetch
        )
        now = trio.current_time()
        call.cap_at = now + defn.cap
        error: Exception | None = None
        produced: Any = None
        writes = self._kv.writes
        with trio.CancelScope(deadline=now + defn.timeout) as scope:
            call.handler_scope = scope
            try:
                produced = handler(ctx)
                if inspect.isawaitable(produced):
                    produced = await produced
            except Exception as exc:
                error = exc
        if self._kv.writes != writes and not await self._kv.flush(since=writes):
            # What the tool wrote is durable when its call returns (committed off the loop).
            log_event(logger, "tool_store_not_durable", logging.ERROR, tool=defn.id, call_id=call.call_id)
        if scope.cancel_called:
            return ToolResult(
                defn.id,
                call.call_id,
                "timeout",
                f"{defn.id!r} did not finish in time (idle limit {defn.timeout:g} s, "
                f"cap {defn.cap:g} s); it was stopped",
            )
        if error is not None:
            return self._failure(call, error)
        return _Produced(produced)

    async def _approve(self, call: _Call, defn: ActionDef, value: BaseModel) -> ToolResult | None:
        """None when approved; otherwise the result telling the model why the action did not run."""
        try:
            body = approval_body(defn, value, call.call_id)
        except Exception as exc:
            return self._failure(call, exc)
        try:
            answer = await self._queries.ask(APPROVAL_QUERY, body, self._approval_timeout)
        except QueryTimeout:
            return ToolResult(
                defn.id,
                call.call_id,
                "timeout",
                f"nobody approved {defn.id!r} within {self._approval_timeout:g} s "
                "(no client answered); it did not run",
            )
        decision = read_approval(answer)
        log_event(
            logger,
            "approval_decided",
            tool=defn.id,
            call_id=call.call_id,
            approved=decision.approved,
            reason=decision.reason,
        )
        if decision.approved:
            return None
        return ToolResult(
            defn.id,
            call.call_id,
            "refused",
            f"{defn.id!r} was not approved ({decision.reason}); it did not run",
        )

    def _context(self, call: _Call, value: BaseModel) -> ActionContext[Any]:
        async def send_query(
            query_type: str,
            body: Mapping[str, Any] | None,
            timeout: float,
            metadata: Mapping[str, Any] | None,
        ) -> QueryResult:
            return await self._queries.ask(query_type, body, timeout, metadata=metadata)

        async def progress(percent: float, message: str) -> None:
            await self._progress(call, percent, message)

        def deadline() -> float:
            # The caller's own limits count too (read in the handler's task: its effective
            # deadline is the speaker's turn budget when the engine runs the call).
            own = min(
                (c.handler_scope.deadline for c in call.chain() if c.handler_scope is not None),
                default=math.inf,
            )
            return min(own, trio.current_effective_deadline())

        def time_left() -> float:
            return deadline() - trio.current_time()

        async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> ToolResult:
            return await self._nested(call, tool_id, raw)

        def note(text: str) -> None:
            self._note(call, text)

        return ActionContext(
            input=value,
            call_id=call.call_id,
            tool_id=call.defn.id,
            metadata=self._metadata,
            companions=self._directory,
            history=tuple(self._history.recent(self._history_limit)),
            store=self._kv.namespace(self.companion_id, call.defn.id),
            _send_query=send_query,
            _progress=progress,
            _deadline=deadline,
            _time_left=time_left,
            _call=call_tool,
            _note=note,
        )

    def _note(self, call: _Call, text: str) -> None:
        if self._calls.get(call.call_id) is not call:
            return  # the call has settled; its result is already out
        if len(call.notes) >= MAX_NOTES:
            log_event(logger, "tool_note_dropped", logging.WARNING, tool=call.defn.id, call_id=call.call_id)
            return
        call.notes.append(text if len(text) <= MAX_NOTE_CHARS else text[: MAX_NOTE_CHARS - 1] + "…")

    async def _progress(self, call: _Call, percent: float, message: str) -> None:
        if self._calls.get(call.call_id) is not call or call.handler_scope is None:
            return  # the call has settled; a leaked context cannot reach the network
        update = call.gate.offer(percent, str(message), self._clock())
        now = trio.current_time()
        # A callee's progress is its callers' too: each link's idle deadline moves, up to its cap.
        for link in call.chain():
            if link.handler_scope is not None:
                extended = min(now + link.defn.timeout, link.cap_at)
                if extended > link.handler_scope.deadline:
                    link.handler_scope.deadline = extended
        if update is not None:
            await self._publisher.publish(
                ACTIONS, progress_action(self.companion_id, call.defn.id, call.call_id, update)
            )

    # --- settling ----------------------------------------------------------------------------------

    def _failure(self, call: _Call, exc: Exception) -> ToolResult:
        leaf = innermost(exc)
        tool_id = call.defn.id
        if isinstance(leaf, ActionRefused):
            message = str(leaf) or f"{tool_id!r} refused without giving a reason"
            return ToolResult(tool_id, call.call_id, "refused", message)
        if isinstance(leaf, QueryTimeout):
            return ToolResult(tool_id, call.call_id, "timeout", f"{leaf}; {tool_id!r} did not finish")
        if isinstance(leaf, StoreLimitExceeded):
            return ToolResult(tool_id, call.call_id, "store_limit", str(leaf))
        return self._internal(call, exc, f"{tool_id!r} failed with an internal error ({type(leaf).__name__})")

    def _internal(self, call: _Call, exc: BaseException, message: str) -> ToolResult:
        log_event(
            logger,
            "tool_call_failed",
            logging.ERROR,
            tool=call.defn.id,
            call_id=call.call_id,
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc)),
        )
        return ToolResult(
            call.defn.id, call.call_id, "internal_error", message + "; the details are in the node's log"
        )

    async def _settle(self, call: _Call, produced: Any) -> ToolResult:
        defn = call.defn
        if isinstance(defn, KnowledgeDef):
            try:
                output = defn.output_json(produced)
            except ValidationError as exc:
                return self._internal(call, exc, f"knowledge {defn.id!r} returned a value of the wrong shape")
            return ToolResult(defn.id, call.call_id, "ok", output=output)

        try:
            envelopes = self._checked_output(defn, produced)
        except _BadOutput as exc:
            return self._internal(call, exc, f"action {defn.id!r} returned {exc}")
        published: list[Message | Action] = []
        try:
            for envelope in envelopes:
                if self._outgoing is not None:
                    verdict = await self._outgoing(defn.topic, envelope)
                    if isinstance(verdict, str):
                        return ToolResult(
                            defn.id, call.call_id, "refused", verdict, published=tuple(published)
                        )
                    envelope = verdict
                with trio.fail_after(self._publish_timeout):
                    await self._publisher.publish(defn.topic, envelope)
                published.append(envelope)
                if isinstance(envelope, Message) and self._record is not None:
                    self._record(envelope)
        except Exception as exc:  # trio.TooSlowError included
            result = self._internal(call, exc, f"action {defn.id!r} could not publish its output")
            return ToolResult(
                result.tool_id, result.call_id, result.status, result.message, published=tuple(published)
            )
        summary = [published_summary(e) for e in published]
        return ToolResult(
            defn.id, call.call_id, "ok", output={"published": summary}, published=tuple(published)
        )

    def _checked_output(self, defn: ActionDef, produced: Any) -> list[Message | Action]:
        if isinstance(produced, Message | Action | Mapping):
            items: Sequence[Any] = [produced]
        elif isinstance(produced, Sequence) and not isinstance(produced, str | bytes):
            items = produced
        else:
            raise _BadOutput(
                f"{type(produced).__name__}, not a Message, an Action or a list of them"
                + (" (did publish forget to return?)" if produced is None else "")
            )
        return [self._checked_envelope(defn, item, index) for index, item in enumerate(items)]

    def _checked_envelope(self, defn: ActionDef, item: Any, index: int) -> Message | Action:
        expected: type[Message] | type[Action] = Message if defn.topic == MESSAGES else Action
        where = f"item {index}"
        if isinstance(item, Mapping):
            item = _with_id(item) if expected is Message else item
            try:
                item = expected.model_validate(item)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                    for e in exc.errors(include_url=False)[:5]
                )
                raise _BadOutput(f"a malformed {expected.__name__} ({where}: {problems})") from exc
        if not isinstance(item, expected):
            raise _BadOutput(
                f"a {type(item).__name__} ({where}), but its topic {defn.topic!r} carries {expected.__name__}"
            )
        if item.params.from_ != self.companion_id:
            raise _BadOutput(
                f"an envelope from {item.params.from_!r} ({where}); it must be from {self.companion_id!r}"
            )
        return item

    def _log_result(self, result: ToolResult, duration: float) -> ToolResult:
        level = logging.INFO if result.status in ("ok", "refused", "invalid_input") else logging.WARNING
        log_event(
            logger,
            "tool_call_finished",
            level,
            tool=result.tool_id,
            call_id=result.call_id,
            status=result.status,
            code=None if result.code is None else int(result.code),
            duration=round(duration, 3),
        )
        return result


def _invalid(defn: ToolDef, call_id: str, issues: tuple[InputIssue, ...]) -> ToolResult:
    listed = "; ".join(f"{i.path}: {i.message}" for i in issues)
    count = f"{len(issues)} problem{'s' if len(issues) != 1 else ''}"
    return ToolResult(
        defn.id, call_id, "invalid_input", f"{count} with the input of {defn.id!r}: {listed}", issues=issues
    )


def _with_id(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """Fill a missing ``params.id`` of a ``message.send`` given as a dict."""
    params = item.get("params")
    if isinstance(params, Mapping) and "id" not in params:
        return {**item, "params": {**params, "id": new_id()}}
    return item
