"""A turn: the record of one message's turn and the phases it goes through.

Each message of the thread that addresses this companion opens a *turn*, which goes through
named phases:

    AWAITING_STATES --(this node's leader slot is due)--> LEADING
    LEADING --(this node's array is published)--> LED
    AWAITING_STATES | LEADING | LED --(an array counts)--> AWAITING_SPEAKER | SPEAKING | DONE
    AWAITING_SPEAKER --(this node's speaking slot opens)--> SPEAKING
    SPEAKING --(the reply is on its way out)--> REPLIED
    SPEAKING --(the model failed: yield)--> AWAITING_SPEAKER | DONE
    any --(terminal, nobody, every slot passed unanswered)--> DONE
    DONE --(a late array of an earlier leader gives a speaker)--> AWAITING_SPEAKER
    any --(a closing array, or a terminal array no later one may replace)--> CLOSED

A turn DONE because every slot passed unanswered is then CLOSED by a closing array; once
CLOSED, no array counts for it any more. Every sub-state is a phase: LED is LEADING once the
array is out (a lead is withdrawn only before), CLOSED is DONE for good (the state is the phase,
as in h11, rather than a flag beside it). A turn ends when the thread moves on (a newer message
of the thread; a speech in progress is then withdrawn), and comes back, as it was, when that
message turns out older than it (:mod:`companion.conversation.repair`). :data:`TRANSITIONS` is
the whole table of moves; which event is handled in which phase is
:data:`companion.conversation.machine.HANDLERS`.

:class:`Turn` also does the arithmetic of the speaking slots (when each opens, which is open at
a time, what a yield or a thinking signal moves), which needs nothing but the record and the
slot length.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from companion.conversation.rules import LeaderPlan
from companion.protocol import ClosingStage, Message, State

__all__ = ["SLOT_GRACE", "TRANSITIONS", "Phase", "TransitionError", "Turn"]

SLOT_GRACE: Final = 0.25
"""An array or a yield may come this fraction of a slot early (nodes see a message at slightly
different times); any earlier, it waits for its slot."""


class TransitionError(RuntimeError):
    """A transition outside :data:`TRANSITIONS`: a bug in the machine, never a network condition."""


class Phase(enum.Enum):
    """Where this node is in the turn opened by the current message."""

    AWAITING_STATES = "awaiting_states"
    """No array counted yet; this node is no leader, or its leader slot has not come."""
    LEADING = "leading"
    """This node asked its model for everybody's state and publishes the array."""
    LED = "led"
    """This node's array is out; like anyone's, it counts when it comes back (the echo rule)."""
    AWAITING_SPEAKER = "awaiting_speaker"
    """An array counted; the open speaking slot is another companion's."""
    SPEAKING = "speaking"
    """This node prepares its reply (model calls, tools)."""
    REPLIED = "replied"
    """This node's reply is going out (this comes just before the publish) or has gone; the
    thread moves on when it comes back."""
    DONE = "done"
    """Nobody speaks any more in this turn: terminal, nobody wanted to, or everyone stayed silent."""
    CLOSED = "closed"
    """The conversation ended at this message for good: a closing array counted (nobody
    answered, a quiet reply), or a terminal array that no later one may replace. No array
    counts any more."""


TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.AWAITING_STATES: frozenset(
        {Phase.LEADING, Phase.AWAITING_SPEAKER, Phase.SPEAKING, Phase.DONE, Phase.CLOSED}
    ),
    Phase.LEADING: frozenset({Phase.LED, Phase.AWAITING_SPEAKER, Phase.SPEAKING, Phase.DONE, Phase.CLOSED}),
    Phase.LED: frozenset({Phase.AWAITING_SPEAKER, Phase.SPEAKING, Phase.DONE, Phase.CLOSED}),
    Phase.AWAITING_SPEAKER: frozenset({Phase.SPEAKING, Phase.DONE, Phase.CLOSED}),
    Phase.SPEAKING: frozenset({Phase.REPLIED, Phase.AWAITING_SPEAKER, Phase.DONE, Phase.CLOSED}),
    Phase.REPLIED: frozenset({Phase.CLOSED}),
    Phase.DONE: frozenset({Phase.AWAITING_SPEAKER, Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}
"""Every phase a turn may move to from each phase. ``DONE -> AWAITING_SPEAKER``: an earlier
leader's array that arrives late replaces the one that ended the turn. ``REPLIED -> CLOSED``: a
closing array may overtake this node's own reply on its way back. A turn in any phase ends when
the thread moves on (that is the turn's end, not a transition)."""


@dataclass(eq=False)
class Turn:
    """The turn opened by one message: everything the rules need, nothing the driver owns."""

    message: Message
    opened_at: float
    replies: int
    """Companion replies in the thread before this message's reply."""
    previous: ClosingStage
    """The thread's closing stage at the message."""
    nominated: str | None
    plan: LeaderPlan
    addressed: tuple[str, ...]
    """The candidates present here: whom this node's states array speaks for."""
    rank: int | None
    answers: str | None
    """The message this turn's message answers (its ``in_reply_to``), if any."""
    phase: Phase = Phase.AWAITING_STATES
    states: Sequence[State] | None = None
    priority: int = 0
    """The accepted array's leader rank (lower wins)."""
    pending: dict[int, tuple[Sequence[State], str | None]] = field(default_factory=dict)
    """Arrays held for later, by rank, with their publisher: before an array counts, those of
    candidates whose slot had not come; after, a later candidate's closing array, which counts
    once every slot passed here (the lowest rank first)."""
    accepted_at: float = 0.0
    order: tuple[str, ...] = ()
    """The speaking order of the accepted array (empty: nobody speaks)."""
    closing: ClosingStage = "none"
    slot_opens: list[float] = field(default_factory=list)
    """When each slot of ``order`` opens (a yield opens the next one early)."""
    ends: float = math.inf
    """When the last slot closes."""
    slot: int = -1
    """The open slot as last seen (``-1``: none yet)."""
    yielded: dict[str, str] = field(default_factory=dict)
    """Companions that gave their slot up, and why (a yield reason, or ``slot_ended``,
    ``gave_way``)."""
    closing_at: float | None = None
    """When this node publishes the closing array if nobody's counted first (``None``: never)."""
    began: str | None = None
    """The first other companion seen preparing its reply under the accepted array (its thinking
    signal): a late array that would put another speaker first no longer counts."""

    @property
    def message_id(self) -> str:
        return self.message.params.id

    @property
    def unanswered(self) -> bool:
        """This node saw every slot of the order pass without a reply: only then is a turn DONE
        with speakers in its order (an array that ends it leaves none)."""
        return self.phase is Phase.DONE and bool(self.order)

    def due(self, slot: int, takeover_after: float) -> float:
        """When the array of the candidate whose leader slot is ``slot`` may count (a little early:
        :data:`SLOT_GRACE`)."""
        return self.opened_at + (slot - SLOT_GRACE) * takeover_after if slot else self.opened_at

    def slot_at(self, now: float) -> int:
        """The open slot at ``now`` (``len(order)``: every slot has passed)."""
        if now >= self.ends:
            return len(self.order)
        slot = 0
        while slot + 1 < len(self.order) and self.slot_opens[slot + 1] <= now:
            slot += 1
        return slot

    def rebase(self, after: int, now: float, reply_timeout: float) -> None:
        """Slot ``after`` is given up: the next one opens now, the later ones a reply deadline apart."""
        for j in range(after + 1, len(self.order)):
            self.slot_opens[j] = min(self.slot_opens[j], now + (j - after - 1) * reply_timeout)
        last = self.slot_opens[-1] + reply_timeout if after + 1 < len(self.order) else now
        self.ends = min(self.ends, last)

    def hold_open(self, slot: int, current: int, now: float, reply_timeout: float) -> None:
        """The speaker of ``slot`` said it is preparing its reply at ``now``: the slots before it
        are over, and its own stays open a reply deadline from now."""
        for j in range(current + 1, slot + 1):
            self.slot_opens[j] = min(self.slot_opens[j], now)
        end = now + reply_timeout
        for j in range(slot + 1, len(self.order)):
            self.slot_opens[j] = max(self.slot_opens[j], end + (j - slot - 1) * reply_timeout)
        self.ends = max(self.ends, end + (len(self.order) - slot - 1) * reply_timeout)

    def gave_up(self) -> dict[str, str]:
        """Each companion of the speaking order and why it did not answer (a yield reason, or
        ``silent`` when it never said)."""
        return {cid: self.yielded.get(cid, "silent") for cid in self.order}
