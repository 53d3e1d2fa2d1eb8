"""The leader of a turn: the one companion that asks its model for everybody's state.

aikyo 1.6 picks it as ``md5(JSON.stringify(message)) mod n`` over the addressed ids it counts
as active. We count as candidates the addressed ids this node *knows as companions* (bound now
or earlier): an id nobody ever proved, however many of them a message lists, never becomes a
leader and never delays one. With everyone present that is aikyo's leader (the vectors in
``tests/vectors`` check it). The other candidates follow in ``to`` order, wrapping round: rank
``k`` takes over when no states arrived after ``k`` slots, so a departed leader's slot simply
passes without any coordination.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from companion.protocol import COMPANION_ID_PREFIX, Message, canonical_json

__all__ = [
    "MAX_CANDIDATES",
    "Candidates",
    "LeaderPlan",
    "leader_candidates",
    "leader_slot",
    "plan_leaders",
    "select_leader",
]

MAX_CANDIDATES: Final = 64
"""At most this many distinct addressed companions take part in a turn; the rest are dropped
(and the drop logged), so a message listing thousands of ids costs what 64 cost."""


def select_leader(message: Message, active_ids: Iterable[str]) -> str | None:
    """The leader for ``message`` by aikyo 1.6's rule, or ``None`` when nobody addressed is active.

    ``md5(JSON.stringify(message))`` taken as a big integer, modulo the number of addressed ids
    that are active (the ``to`` list filtered, order and duplicates kept). A mixed network of
    Python and JavaScript nodes must pick the same leader, so this follows aikyo exactly: the
    hash is over the message as received.
    """
    active = set(active_ids)
    candidates = [cid for cid in message.params.to if cid in active]
    if not candidates:
        return None
    digest = hashlib.md5(canonical_json(message).encode("utf-8"), usedforsecurity=False)
    return candidates[int(digest.hexdigest(), 16) % len(candidates)]


@dataclass(frozen=True, slots=True)
class Candidates:
    """The addressed companions a node counts for a turn, and what it left out."""

    ids: tuple[str, ...]
    """Distinct known companion ids in ``to`` order, at most :data:`MAX_CANDIDATES`."""
    unknown: int
    """Distinct addressed companion ids this node does not know (ghosts; people are not counted)."""
    capped: int
    """Known companions left out because the message addressed more than the cap."""


def leader_candidates(message: Message, known: Container[str], cap: int = MAX_CANDIDATES) -> Candidates:
    """The addressed ids this node knows as companions, the first ``cap`` of them."""
    distinct = [cid for cid in dict.fromkeys(message.params.to) if cid.startswith(COMPANION_ID_PREFIX)]
    ids = [cid for cid in distinct if cid in known]
    return Candidates(tuple(ids[:cap]), len(distinct) - len(ids), max(0, len(ids) - cap))


@dataclass(frozen=True, slots=True)
class LeaderPlan:
    """Who leads a turn, and who takes over, in order, when the states do not arrive."""

    leader: str | None
    order: tuple[str, ...]
    """The takeover order, the leader first: rank ``k`` leads if nothing arrived after ``k`` slots."""
    reason: Literal["hash", "no_active_addressee"]
    why: str

    def rank(self, companion_id: str | None) -> int | None:
        """This companion's place in the takeover order, or ``None`` if it never leads this turn."""
        if companion_id is None:
            return None
        try:
            return self.order.index(companion_id)
        except ValueError:
            return None


def leader_slot(order: Sequence[str], rank: int, slotless: Callable[[str], bool]) -> int:
    """The leader slot of the candidate at ``rank`` of the takeover ``order``: it leads when no
    array counted that many ``takeover_after`` after the message. aikyo's companions lead only
    when aikyo's md5 rule picks them (rank 0) and never take over, so a candidate of theirs after
    the first takes no slot (issue 33: with two aikyo candidates first, ours took over after 8 s
    instead of 4 when aikyo's leader was still finishing its own reply)."""
    if rank == 0:
        return 0
    return 1 + sum(1 for cid in order[1:rank] if not slotless(cid))


def plan_leaders(message: Message, active_ids: Iterable[str]) -> LeaderPlan:
    """aikyo's leader among ``active_ids``, then the other active addressees in ``to`` order after
    it, wrapping round. Nodes that agree on ``active_ids`` (the known companions; with everyone
    present, every addressed companion) agree on the whole order."""
    active = set(active_ids)
    leader = select_leader(message, active)
    if leader is None:
        return LeaderPlan(None, (), "no_active_addressee", "none of the addressed companions is known here")
    unique = list(dict.fromkeys(cid for cid in message.params.to if cid in active))
    start = unique.index(leader)
    order = tuple(unique[start:] + unique[:start])
    count = len([cid for cid in message.params.to if cid in active])
    why = f"md5 of the message modulo {count} known addressee(s) picks {leader}"
    if len(order) > 1:
        why += f"; takeover order {', '.join(order[1:])}"
    return LeaderPlan(leader, order, "hash", why)
