"""What a handler sees: one read-only context per call, built by the runtime.

The context hands the handler its validated input and the few capabilities it may use (ask
clients, report progress); everything else about the node stays out of reach.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from ..protocol import Message, Metadata, QueryResult

__all__ = ["DEFAULT_QUERY_TIMEOUT", "ActionContext", "InputT"]

InputT = TypeVar("InputT", bound=BaseModel)

DEFAULT_QUERY_TIMEOUT = 30.0
"""Seconds :meth:`ActionContext.send_query` waits by default (aikyo's default too)."""

QueryFn = Callable[[str, Mapping[str, Any] | None, float], Awaitable[QueryResult]]
ProgressFn = Callable[[float, str], Awaitable[None]]


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
    _send_query: QueryFn = field(repr=False)
    _progress: ProgressFn = field(repr=False)
    _deadline: Callable[[], float] = field(repr=False)

    @property
    def companion_id(self) -> str:
        """This companion's id: the ``from`` of everything the handler returns."""
        return self.metadata.id

    @property
    def deadline(self) -> float:
        """When the call will be cancelled, in ``trio.current_time()`` terms (progress moves it)."""
        return self._deadline()

    async def send_query(
        self, type: str, body: Mapping[str, Any] | None = None, timeout: float = DEFAULT_QUERY_TIMEOUT
    ) -> QueryResult:
        """Publish a ``query.send`` of ``type`` on ``queries`` and wait for the first client's answer.

        Returns the :class:`QueryResult` as the client sent it (check ``result``/``error``).
        Raises :class:`~companion.actions.QueryTimeout` when nobody answers within ``timeout``
        seconds; left uncaught, that ends the call with status ``timeout``.
        """
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"query timeout must be a positive number of seconds, got {timeout!r}")
        return await self._send_query(type, body, timeout)

    async def progress(self, percent: float, message: str = "") -> None:
        """Tell clients how far the call is (0-100) and keep a long call alive.

        Values are clamped to 0-100 and never go backwards; updates are rate-limited, and the
        first report of 100 is always sent. Each report moves the call's idle deadline forward,
        up to the action's absolute cap.
        """
        await self._progress(percent, message)
