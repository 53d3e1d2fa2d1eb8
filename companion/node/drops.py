"""Counting what the edge refuses, and logging each (peer, reason) at most once a minute.

Hostile or broken peers can send thousands of bad payloads a second; counters keep the whole
picture while the log keeps one line per peer and reason per interval, with the number of
lines it left out since.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from companion.log import Throttle, log_event

__all__ = ["Drop", "DropCounters"]

logger = logging.getLogger("companion.node.drops")

# Reasons that are normal gossip artifacts rather than misbehaviour: logged at debug level.
# ``request_limit``: every node that starts asks for announcements, and nodes that start
# together ask within one another's gap (a flood of requests is still counted). ``stale``: a
# presence announcement overtaken on another path by a newer one of the same companion (its
# first ones go out seconds apart, and every node relays each): 313 warnings, about ten per
# node, when 30 companions started together. A replayed old one reads the same, and is refused
# the same way; ``too_old`` (a capture from long ago, or a clock far off) still warns.
_QUIET_REASONS = frozenset({"replay", "request_limit", "stale"})
# Reasons that say a peer went away, not that it misbehaved (every peer that stops leaves a
# send that failed), or that this node is going away (``stopping``: a payload gossip handed
# over after the host closed): logged at info level, and counted like every drop.
_PEER_GONE_REASONS = frozenset({"send_failed", "stopping"})


@dataclass(frozen=True, slots=True)
class Drop:
    """One refused payload: a stable ``reason`` label for counters and a ``detail`` for logs."""

    reason: str
    detail: str


class DropCounters:
    """Counts drops by reason and topic; logs each (peer, reason) once per ``interval`` seconds."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        interval: float = 60.0,
        max_tracked: int = 4096,
        node: str = "",
    ) -> None:
        self._throttle = Throttle(interval, max_keys=max_tracked, clock=clock)
        self._node = node
        self.by_reason: Counter[str] = Counter()
        self.by_topic: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def record(self, drop: Drop, *, peer: str, topic: str) -> None:
        """Count ``drop``; log it unless this peer and reason were logged within the interval."""
        self.by_reason[drop.reason] += 1
        self.by_topic[topic] += 1
        suppressed = self._throttle.admit((peer, drop.reason))
        if suppressed is None:
            return
        if drop.reason in _QUIET_REASONS:
            level = logging.DEBUG
        elif drop.reason in _PEER_GONE_REASONS:
            level = logging.INFO
        else:
            level = logging.WARNING
        log_event(
            logger,
            "payload_dropped",
            level,
            node=self._node,
            reason=drop.reason,
            detail=drop.detail,
            topic=topic,
            peer=peer,
            suppressed_since_last=suppressed,
        )

    def snapshot(self) -> dict[str, int]:
        """Drops so far by reason (a copy)."""
        return dict(self.by_reason)
