"""The edge: every gossipsub payload passes here once, before gossipsub may forward it.

Synchronous and total (it never raises): it runs inside py-libp2p's topic validator, where an
exception would stop the node. It refuses, in this order, payloads that are oversized, already
handled (replays), unparsable (including text that is not Unicode), sent by a signer that may
not use the claimed ``from`` id, or answering one of this node's own queries from a peer that
may not answer it; and counts every refusal by reason.

Answers are authenticated against the queries this node asked: the node tells the guard
(:meth:`EdgeGuard.asking`) before it publishes one, so the guard knows each query's id and type
before any peer can see it. A result for one of them is admitted only from a peer
:meth:`Membership.may_answer` allows for that type; results for other nodes' queries (and for
queries a bridge relays for its clients) are left alone: this node only relays them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Final

from companion.log import log_event
from companion.memory import Inbound
from companion.node.drops import Drop, DropCounters
from companion.node.membership import Membership
from companion.node.replay import ReplayGuard
from companion.protocol import (
    APPROVAL_QUERY,
    MAX_PAYLOAD_BYTES,
    Action,
    Message,
    Payload,
    PayloadError,
    Query,
    QueryResult,
    parse_payload,
)

__all__ = ["EdgeGuard"]

logger = logging.getLogger("companion.node.guard")

ASKED_CAPACITY: Final = 4096
"""Own queries remembered for authenticating their answers (oldest forgotten first)."""


class _Asked:
    """This node's own queries by id: their type, and whether an answer was admitted yet."""

    def __init__(self, capacity: int = ASKED_CAPACITY) -> None:
        self._capacity = capacity
        self._types: OrderedDict[str, str] = OrderedDict()
        self._answered: set[str] = set()

    def add(self, query: Query) -> None:
        self._types[query.id] = query.params.type
        self._types.move_to_end(query.id)
        while len(self._types) > self._capacity:
            forgotten, _ = self._types.popitem(last=False)
            self._answered.discard(forgotten)

    def type_of(self, query_id: str) -> str | None:
        return self._types.get(query_id)

    def first_answer(self, query_id: str) -> bool:
        """True the first time an answer to ``query_id`` is admitted."""
        if query_id in self._answered:
            return False
        self._answered.add(query_id)
        return True


class EdgeGuard:
    """Parses, authenticates and de-duplicates inbound payloads; counts what it drops."""

    def __init__(
        self,
        membership: Membership,
        drops: DropCounters,
        *,
        replay: ReplayGuard | None = None,
        max_bytes: int = MAX_PAYLOAD_BYTES,
        name: str = "",
    ) -> None:
        self.membership = membership
        self.name = name
        self.drops = drops
        self.replay = replay or ReplayGuard()
        self.max_bytes = max_bytes
        self.accepted = 0
        self._asked = _Asked()

    def asking(self, query: Query) -> None:
        """This node is about to publish ``query``: only peers allowed to answer its type may."""
        self._asked.add(query)

    def admit(self, topic: str, data: bytes, signer: str, msg_id: bytes) -> Inbound | None:
        """The parsed payload if it may be delivered and forwarded, else ``None`` (counted)."""
        try:
            outcome = self._check(topic, data, signer, msg_id)
        except Exception as exc:  # a bug here must not take the node down
            log_event(logger, "edge_guard_error", logging.ERROR, topic=topic, peer=signer, error=repr(exc))
            outcome = Drop("internal_error", repr(exc))
        if isinstance(outcome, Drop):
            self.drops.record(outcome, peer=signer, topic=topic)
            return None
        self.accepted += 1
        return outcome

    def _check(self, topic: str, data: bytes, signer: str, msg_id: bytes) -> Inbound | Drop:
        if len(data) > self.max_bytes:
            return Drop("too_large", f"{len(data)} bytes > limit {self.max_bytes}")
        if msg_id in self.replay:
            return Drop("replay", f"message {msg_id[-8:].hex()} was already handled")
        parsed = parse_payload(topic, data, max_bytes=self.max_bytes)
        if isinstance(parsed, PayloadError):
            return Drop(parsed.reason, parsed.detail)
        if isinstance(parsed, QueryResult):
            refused = self._authorize_answer(parsed, signer)
            if refused is not None:
                return refused
        else:
            refusal = self._authorize(parsed, signer)
            if refusal is not None:
                return Drop("spoofed_sender", refusal)
        self.replay.remember(msg_id)
        return Inbound(topic, parsed, signer, bytes(data))

    def _authorize(self, payload: Payload, signer: str) -> str | None:
        if isinstance(payload, list):
            return self.membership.check_states_sender(signer, (s.params.from_ for s in payload))
        if isinstance(payload, Message | Query | Action):
            return self.membership.check_sender(signer, payload.params.from_)
        return f"unexpected payload type {type(payload).__name__}"

    def _authorize_answer(self, result: QueryResult, signer: str) -> Drop | None:
        """``unauthorized_approval`` / ``unauthorized_answer`` for a result to one of our own
        queries from a peer that may not answer it; the first admitted answer is logged (who
        settled what: an approval's audit line)."""
        query_type = self._asked.type_of(result.id)
        if query_type is None:
            return None  # another node's query: not ours to judge
        if not self.membership.may_answer(signer, query_type):
            reason = "unauthorized_approval" if query_type == APPROVAL_QUERY else "unauthorized_answer"
            return Drop(reason, f"peer {signer} may not answer {query_type!r} query {result.id[:64]!r}")
        if self._asked.first_answer(result.id):
            log_event(
                logger,
                "query_answered",
                logging.INFO,
                node=self.name,
                query_id=result.id[:64],
                type=query_type[:64],
                peer=signer,
                ok=result.error is None and result.result is not None and result.result.success,
            )
        return None
