"""Client queries: publish a ``query.send`` and wait, with a deadline, for the first matching result.

A query id is accepted once, from whichever client answers first; later and duplicate results,
and results for ids nobody waits for, are dropped. The waiter always leaves the table when its
wait ends (answer, timeout or cancellation), so nothing is left pending.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from companion.actions.results import QueryTimeout
from companion.log import log_event
from companion.ports import Publisher
from companion.protocol import QUERIES, Query, QueryResult

__all__ = ["PendingQueries"]

logger = logging.getLogger("companion.actions.queries")


@dataclass(slots=True)
class _Waiter:
    query_type: str
    done: trio.Event = field(default_factory=trio.Event)
    result: QueryResult | None = None


class PendingQueries:
    """The queries this companion waits on, by id."""

    def __init__(self, publisher: Publisher, sender: str) -> None:
        self._publisher = publisher
        self._sender = sender
        self._waiting: dict[str, _Waiter] = {}
        self.outcomes: Counter[str] = Counter()
        """Queries asked so far by how they ended (``answered``, ``failed``: an error result or
        ``success: false``, ``timeout``), and ``dropped`` results nobody waited for."""

    def __len__(self) -> int:
        return len(self._waiting)

    async def ask(
        self,
        query_type: str,
        body: Mapping[str, Any] | None,
        timeout: float,
        *,
        query_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> QueryResult:
        """Publish the query and return the first result for it; :class:`QueryTimeout` after ``timeout``."""
        query = Query.create(
            self._sender,
            query_type,
            dict(body) if body is not None else None,
            id=query_id,
            metadata=dict(metadata) if metadata is not None else None,
        )
        if query.id in self._waiting:
            raise ValueError(f"query id {query.id!r} is already pending")
        waiter = _Waiter(query_type)
        self._waiting[query.id] = waiter  # before publishing: an answer may arrive at once
        try:
            with trio.move_on_after(timeout):
                await self._publisher.publish(QUERIES, query)
                log_event(logger, "query_sent", logging.DEBUG, query_id=query.id, type=query_type)
                await waiter.done.wait()
        finally:
            if self._waiting.get(query.id) is waiter:
                del self._waiting[query.id]
        if waiter.result is None:
            log_event(
                logger, "query_timeout", logging.WARNING, query_id=query.id, type=query_type, timeout=timeout
            )
            self.outcomes["timeout"] += 1
            raise QueryTimeout(query_type, timeout)
        result = waiter.result
        failed = result.error is not None or (result.result is not None and not result.result.success)
        self.outcomes["failed" if failed else "answered"] += 1
        return result

    def deliver(self, result: QueryResult) -> bool:
        """Hand over a result from the network. True if a waiter took it; False if dropped."""
        waiter = self._waiting.pop(result.id, None)
        if waiter is None:
            log_event(logger, "query_result_dropped", logging.DEBUG, query_id=result.id)
            self.outcomes["dropped"] += 1
            return False
        waiter.result = result
        waiter.done.set()
        return True
