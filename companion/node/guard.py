"""The edge: every gossipsub payload passes here once, before gossipsub may forward it.

Synchronous and total (it never raises): it runs inside py-libp2p's topic validator, where an
exception would stop the node. It refuses, in this order, payloads that are oversized, already
handled (replays), unparsable, or sent by a signer that may not use the claimed ``from`` id, and
counts every refusal by reason.
"""

from __future__ import annotations

import logging

from ..log import log_event
from ..membership import Membership
from ..protocol import (
    MAX_PAYLOAD_BYTES,
    Action,
    Message,
    Payload,
    PayloadError,
    Query,
    QueryResult,
    parse_payload,
)
from ..transport import Inbound
from .drops import Drop, DropCounters
from .replay import ReplayGuard

__all__ = ["EdgeGuard"]

logger = logging.getLogger("companion.node.guard")


class EdgeGuard:
    """Parses, authenticates and de-duplicates inbound payloads; counts what it drops."""

    def __init__(
        self,
        membership: Membership,
        drops: DropCounters,
        *,
        replay: ReplayGuard | None = None,
        max_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self.membership = membership
        self.drops = drops
        self.replay = replay or ReplayGuard()
        self.max_bytes = max_bytes
        self.accepted = 0

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
        refusal = self._authorize(parsed, signer)
        if refusal is not None:
            return Drop("spoofed_sender", refusal)
        self.replay.remember(msg_id)
        return Inbound(topic, parsed, signer, bytes(data))

    def _authorize(self, payload: Payload, signer: str) -> str | None:
        if isinstance(payload, list):
            return self.membership.check_states_sender(signer, (s.params.from_ for s in payload))
        if isinstance(payload, QueryResult):
            return None
        if isinstance(payload, Message | Query | Action):
            return self.membership.check_sender(signer, payload.params.from_)
        return f"unexpected payload type {type(payload).__name__}"
