"""What a handler sees: one read-only context per call, built by the runtime.

The context hands the handler its validated input and the few capabilities it may use (ask
clients, report progress, call another tool, keep small values, leave notes for the model);
everything else about the node stays out of reach.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from companion.actions.results import ToolResult
from companion.protocol import Message, Metadata, QueryResult

if TYPE_CHECKING:
    from companion.store.kv import Namespace  # the store runs on trio: not loaded for definitions

__all__ = ["DEFAULT_QUERY_TIMEOUT", "ActionContext", "InputT"]

InputT = TypeVar("InputT", bound=BaseModel)

DEFAULT_QUERY_TIMEOUT = 30.0
"""Seconds :meth:`ActionContext.send_query` waits by default (aikyo's default too)."""

QueryFn = Callable[[str, Mapping[str, Any] | None, float, Mapping[str, Any] | None], Awaitable[QueryResult]]
ProgressFn = Callable[[float, str], Awaitable[None]]
CallFn = Callable[[str, Mapping[str, Any]], Awaitable[ToolResult]]
NoteFn = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ActionContext(Generic[InputT]):
    """One call's view of the world. Read-only; valid only while the call runs.

    Cancellation is trio's: when the call times out or is cancelled, the handler's next
    checkpoint raises ``trio.Cancelled``; use ``try/finally`` for cleanup and let it propagate.
    """

    input: InputT
    """The validated input (an instance of the tool's input model)."""
    call_id: str
    tool_id: str
    metadata: Metadata
    """This companion's card metadata."""
    companions: Mapping[str, Metadata]
    """Live, read-only view of the companions on the network (id -> metadata), this one included."""
    history: Sequence[Message]
    """The recent conversation when the call started, oldest first."""
    store: Namespace
    """This tool's own key-value memory (JSON values), kept across calls and restarts.

    ``get(key, default=None)``, ``set(key, value)``, ``delete(key)``, ``keys()``. The namespace
    is the tool's id: other tools of the companion cannot read or change it. A write past a
    size limit raises :class:`~companion.actions.StoreLimitExceeded`.
    """
    _send_query: QueryFn = field(repr=False)
    _progress: ProgressFn = field(repr=False)
    _deadline: Callable[[], float] = field(repr=False)
    _time_left: Callable[[], float] = field(repr=False)
    _call: CallFn = field(repr=False)
    _note: NoteFn = field(repr=False)

    @property
    def companion_id(self) -> str:
        """This companion's id: the ``from`` of everything the handler returns."""
        return self.metadata.id

    @property
    def deadline(self) -> float:
        """When the call will be cancelled, in ``trio.current_time()`` terms (progress moves it).

        In a nested call this is the earliest deadline of the chain: a callee never outlives its
        caller. Whatever the caller runs the call under counts too (the engine's budget for a
        speaker's whole turn is often the nearest). Read it from the handler's own task.
        """
        return self._deadline()

    @property
    def time_left(self) -> float:
        """Seconds until :attr:`deadline` (a handler that waits for something it can do
        without, such as a client's voice, waits at most this long, less the time it needs
        afterwards)."""
        return self._time_left()

    async def send_query(
        self,
        type: str,
        body: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_QUERY_TIMEOUT,
        metadata: Mapping[str, Any] | None = None,
    ) -> QueryResult:
        """Publish a ``query.send`` of ``type`` on ``queries`` and wait for the first client's answer.

        Returns the :class:`QueryResult` as the client sent it (check ``result``/``error``).
        Raises :class:`~companion.actions.QueryTimeout` when nobody answers within ``timeout``
        seconds; left uncaught, that ends the call with status ``timeout``. ``metadata`` goes in
        the query's ``params.metadata`` (extensions aikyo's clients ignore).
        """
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"query timeout must be a positive number of seconds, got {timeout!r}")
        return await self._send_query(type, body, timeout, metadata)

    async def progress(self, percent: float, message: str = "") -> None:
        """Tell clients how far the call is (0-100) and keep a long call alive.

        Values are clamped to 0-100 and never go backwards; updates are rate-limited, and the
        first report of 100 is always sent. Each report moves the call's idle deadline forward,
        up to the action's absolute cap.
        """
        await self._progress(percent, message)

    async def call(self, tool_id: str, input: Mapping[str, Any] | BaseModel | None = None) -> ToolResult:
        """Run another tool of this companion, through the same checks, and return its result.

        The callee's input is validated, approval is asked when it needs it, its progress goes
        to clients, and it runs under its own limits but never past this call's deadline;
        cancelling this call cancels it too. Check ``result.ok``: a failed callee is a result,
        not an exception. A tool already running in this chain of calls is refused
        (``call_cycle``), and so is a chain deeper than
        :data:`~companion.actions.MAX_CALL_DEPTH` (``call_too_deep``). What the callee
        publishes is published; its notes come back in ``result.notes`` and reach the model
        only if this handler passes them on with :meth:`note`.
        """
        if isinstance(input, BaseModel):
            raw: Mapping[str, Any] = input.model_dump(mode="json", by_alias=True)
        elif input is None:
            raw = {}
        else:
            raw = input
        return await self._call(tool_id, raw)

    def note(self, text: str) -> None:
        """Tell the model something for its next step, beside this call's result.

        Notes are never published and never recorded as anyone's words; they reach only the
        model (``ToolResult.notes``, and the ``notes`` of ``for_model()``). Long notes are cut
        and only the first few of a call are kept (see ``MAX_NOTES``, ``MAX_NOTE_CHARS``).
        """
        self._note(str(text))
