"""Counting what the edge refuses, and logging each (peer, reason) at most once a minute.

Hostile or broken peers can send thousands of bad payloads a second; counters keep the whole
picture while the log keeps one line per peer and reason per interval, with the number of
lines it left out since.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..log import log_event

__all__ = ["Drop", "DropCounters"]

logger = logging.getLogger("companion.node.drops")

# Reasons that are normal gossip artifacts rather than misbehaviour: logged at debug level.
_QUIET_REASONS = frozenset({"replay"})


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
        self._clock = clock
        self._interval = interval
        self._max_tracked = max_tracked
        self._node = node
        self.by_reason: Counter[str] = Counter()
        self.by_topic: Counter[str] = Counter()
        self._last_logged: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def record(self, drop: Drop, *, peer: str, topic: str) -> None:
        """Count ``drop``; log it unless this peer and reason were logged within the interval."""
        self.by_reason[drop.reason] += 1
        self.by_topic[topic] += 1
        key = (peer, drop.reason)
        now = self._clock()
        last = self._last_logged.get(key)
        if last is not None and now - last[0] < self._interval:
            self._last_logged[key] = (last[0], last[1] + 1)
            return
        suppressed = last[1] if last is not None else 0
        self._last_logged[key] = (now, 0)
        self._last_logged.move_to_end(key)
        while len(self._last_logged) > self._max_tracked:
            self._last_logged.popitem(last=False)
        level = logging.DEBUG if drop.reason in _QUIET_REASONS else logging.WARNING
        log_event(
            logger,
            "payload_dropped",
            level,
            node=self._node,
            reason=drop.reason,
            detail=drop.detail[:300],
            topic=topic,
            peer=peer,
            suppressed_since_last=suppressed,
        )

    def snapshot(self) -> dict[str, int]:
        """Drops so far by reason (a copy)."""
        return dict(self.by_reason)
