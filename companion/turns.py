"""Pure turn-taking: who leads a turn, who speaks next, and how a conversation closes.

No sockets, no clocks: every function here is a plain computation over wire models, so
every node reaches the same decision from the same inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from .protocol import Message, canonical_json

__all__ = ["select_leader"]


def select_leader(message: Message, active_ids: Iterable[str]) -> str | None:
    """The leader for ``message`` by aikyo 1.6's rule, or ``None`` when nobody addressed is active.

    ``md5(JSON.stringify(message))`` taken as a big integer, modulo the number of addressed ids
    that are active (the ``to`` list filtered, order and duplicates kept). A mixed network of
    Python and JavaScript nodes must pick the same leader, so this follows aikyo exactly.
    """
    active = set(active_ids)
    candidates = [cid for cid in message.params.to if cid in active]
    if not candidates:
        return None
    digest = hashlib.md5(canonical_json(message).encode("utf-8"), usedforsecurity=False)
    return candidates[int(digest.hexdigest(), 16) % len(candidates)]
