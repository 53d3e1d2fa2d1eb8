"""Which client may answer which query: the bridge forwards a result only for a query it
delivered to that client, and only the first one.

Companions ask people through ``query.send`` (voice a line, approve an action) and take the
first result for the id. Without this rule any client could answer any query, including
ones it never saw (a forged ``speak`` result cuts a companion's line short; a forged approval
runs an action nobody approved), and a client could answer the same query twice. Pure
bookkeeping, bounded in count; the shell asks :meth:`AnswerLedger.claim` before publishing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Final, Literal, TypeAlias

__all__ = ["DEFAULT_MAX_QUERIES", "AnswerLedger", "Claim"]

DEFAULT_MAX_QUERIES: Final = 1024
"""Open queries remembered (oldest forgotten first): a conversation asks a few per turn and
each waits at most a couple of minutes."""

Claim: TypeAlias = Literal["ok", "unknown_query", "already_answered"]


class AnswerLedger:
    """Queries delivered to clients and not answered yet, and queries already answered."""

    def __init__(self, max_queries: int = DEFAULT_MAX_QUERIES) -> None:
        if max_queries < 1:
            raise ValueError("max_queries must be at least 1")
        self._max = max_queries
        self._open: OrderedDict[str, set[str]] = OrderedDict()
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._claimed: dict[str, set[str]] = {}
        """Claimed, not yet published: the clients to give the query back to if it fails."""

    def delivered(self, query_id: str, clients: Iterable[str]) -> None:
        """The query ``query_id`` was queued for ``clients``: each of them may answer it."""
        clients = set(clients)
        if not clients or query_id in self._answered:
            return
        entry = self._open.get(query_id)
        if entry is None:
            self._open[query_id] = clients
            while len(self._open) > self._max:
                self._open.popitem(last=False)
        else:
            entry |= clients

    def claim(self, query_id: str, client_id: str) -> Claim:
        """``client_id`` wants to publish a result for ``query_id``: ``ok`` (it may, and nobody
        else may after it), ``unknown_query`` (it was never given that query) or
        ``already_answered``."""
        if query_id in self._answered:
            return "already_answered"
        entry = self._open.get(query_id)
        if entry is None or client_id not in entry:
            return "unknown_query"
        self._open.pop(query_id)
        self._remember_answered(query_id)
        self._claimed[query_id] = entry
        return "ok"

    def release(self, query_id: str) -> None:
        """The claimed result could not be published: the query is open again for the same
        clients (so the client may try again)."""
        clients = self._claimed.pop(query_id, None)
        if clients is None:
            return
        self._answered.pop(query_id, None)
        self.delivered(query_id, clients)

    def confirm(self, query_id: str) -> None:
        """The claimed result was published."""
        self._claimed.pop(query_id, None)

    def settled(self, query_id: str) -> None:
        """A result for ``query_id`` went out some other way (from the network, or published
        by this process): later client results for it are ``already_answered``."""
        self._open.pop(query_id, None)
        self._remember_answered(query_id)

    def alias(self, client: str, identity: str) -> None:
        """``client`` is also ``identity`` from now on (a named session): the queries
        delivered to it so far may be answered by ``identity``."""
        for entry in self._open.values():
            if client in entry:
                entry.add(identity)

    def is_open(self, query_id: str) -> bool:
        return query_id in self._open

    def _remember_answered(self, query_id: str) -> None:
        self._answered[query_id] = None
        self._answered.move_to_end(query_id)
        while len(self._answered) > self._max:
            self._answered.popitem(last=False)

    def __len__(self) -> int:
        return len(self._open)
