"""Remember handled gossipsub message ids beyond gossipsub's own 120 s seen-cache.

A genuine signed message stays valid forever, so anyone who recorded it can publish it again
once the seen-cache has forgotten it. This guard keeps the ids of everything handled, bounded
by count (the oldest are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["ReplayGuard"]


class ReplayGuard:
    """A bounded first-in-first-out set of message ids."""

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._ids: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._ids

    def remember(self, msg_id: bytes) -> bool:
        """Record ``msg_id``; ``False`` if it was already handled (a replay)."""
        if msg_id in self._ids:
            return False
        self._ids[msg_id] = None
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True
