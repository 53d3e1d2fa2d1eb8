"""Mending the thread when gossip's order misled it: a turn set aside comes back; a dead thread
joins the one the others follow.

The thread (:mod:`companion.conversation.rules.thread`) places each message as it arrives, and
gossip keeps no order across publishers. Two orders mislead it, and each left a conversation
silent for good in the fault suite (``scripts/bench_faults.py --seeds 1000``: seeds 581 and 363):

- *A late message that turns out older.* A person's message that arrives after the replies it
  caused looks new: it answers nothing, so the conversation moves to it and the turn this node
  had open ends. When the reply that answered it arrives (its reply chain leads back to where
  the thread was), the thread jumps back to the newest message of the chain
  (``overtaken``), and so must the turn: the one set aside comes back as it was, with the count
  and the stage of the thread at it (:meth:`RepairRules._resume`), and the arrays that came for
  it meanwhile count as if it had never left. A lead or a speech that its end withdrew starts
  again (a speech only in this node's slot, and never a second reply). Before, the node sat
  out the turn it was chosen to speak in, and the closing array found no turn to close.
- *A split.* An aikyo node's replies say nothing of what they answer, so when such a person's
  message arrives late, nothing shows it is older: some nodes follow it and others the replies,
  and each side holds the other's replies for stale. A side that nobody else follows falls
  quiet: its message gets no states array from anyone (a node with a turn for it would lead or
  take over within its leader slots; only a node's own line, or a bystander's message, can go
  unanswered). So when the message the thread is at has had no array, no thinking and no yield
  signal for one leader slot per candidate and one more, and a stale reply arrived meanwhile,
  the thread moves to that reply (:meth:`RepairRules._adopt`): its thread is the one the
  others follow. A thread that is alive never moves: an array for its message came.

Both are logged (``turn_resumed``, ``thread_adopted``) with why.

A third order is caught before it misleads the thread: an aikyo companion's answer that came
before what it answered. aikyo's leader publishes its untagged array, then the speaker it put
first speaks, naming nothing; a node that got both before the message they were for took that
message, when it came, for the thread's next one (seeds 363 and 580 once the arrays were kept).
The array shows it (:meth:`~companion.conversation.arrays.ArrayRules._answered_early`): the
message is placed as one whose reply came first (``overtaken``), and the turn the late message's
predecessor set aside comes back as above.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from companion.conversation.arrays import ArrayRules
from companion.conversation.events import Effect
from companion.conversation.rules import TurnInfo, leader_candidates, states_match, turn_info
from companion.conversation.state import latest
from companion.conversation.turn import Phase, Turn
from companion.protocol import ClosingStage, Message

__all__ = ["SET_ASIDE", "RepairRules"]

SET_ASIDE: Final = 4
"""Threads left for a message that answered none of them, remembered in case they come back."""


@dataclass(frozen=True, slots=True)
class _Aside:
    """Where the thread was when a message that answers nothing of it moved it on."""

    turn: Turn | None
    replies: int
    stage: ClosingStage
    heard: dict[str, int]
    last_turn: dict[str, int]


class RepairRules(ArrayRules):
    """The machine's rules that mend its thread (a mixin of
    :class:`~companion.conversation.machine.Conversation`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aside: OrderedDict[str, _Aside] = OrderedDict()
        self._rival: Message | None = None
        """The newest stale reply since the thread moved: the thread to join if this one dies."""
        self._dead_at = 0.0
        """When the current message counts as unanswered by everyone, unless an array came."""

    def deadline(self) -> float | None:
        times = [t for t in (super().deadline(), self._adopt_at()) if t is not None]
        return min(times) if times else None

    def _adopt_at(self) -> float | None:
        return None if self._rival is None or self._live else self._dead_at

    def _moved(
        self, message: Message, info: TurnInfo, now: float, out: list[Effect], *, replayed: bool
    ) -> None:
        raise NotImplementedError  # the machine's own

    def _end_turn(self, turn: Turn, by: Message, info: TurnInfo, out: list[Effect]) -> None:
        raise NotImplementedError  # the machine's own

    def _lead(self, turn: Turn, out: list[Effect], *, cap: bool = False) -> None:
        raise NotImplementedError  # the machine's own

    def _at(self, message: Message, now: float) -> None:
        """The thread moved to ``message``: nothing has answered it yet."""
        self._live, self._rival = False, None
        candidates = leader_candidates(message, self.known).ids
        self._dead_at = now + (len(candidates) + 1) * self.takeover_after

    def _set_aside(self, message_id: str) -> None:
        """The thread leaves ``message_id`` for a message that answers nothing of it: remember
        where it was, and its turn if one is open."""
        turn = self.turn if self.turn is not None and self.turn.message_id == message_id else None
        left = _Aside(turn, self.replies, self.stage, dict(self._heard), dict(self._last_turn))
        latest(self._aside, message_id, left, SET_ASIDE)

    def _resume(self, now: float, out: list[Effect]) -> None:
        """The thread went back to a message it had left (``overtaken``): so does the turn."""
        head = self.thread.current
        left = None if head is None else self._aside.pop(head, None)
        if head is None or left is None:
            return
        self.replies, self.stage = left.replies, left.stage
        self._heard = OrderedDict(left.heard)
        self._last_turn = dict(left.last_turn)
        self._live, self._rival = True, None
        turn = left.turn
        self._log(
            out,
            "turn_resumed",
            "warning",
            message_id=head,
            phase=None if turn is None else turn.phase.value,
            reason="a late message was older",
            why="a message that moved the conversation on turned out older than it (its reply "
            "came first): the conversation is back where it was",
        )
        if turn is None:
            return
        self.turn = turn
        # Its end withdrew a lead or a speech in progress: they start again (the turn's return,
        # not a move of TRANSITIONS; a speech only in this node's slot, see Conversation._on_time).
        if turn.phase is Phase.LEADING:
            turn.phase = Phase.AWAITING_STATES
            self._lead(turn, out)
        elif turn.phase is Phase.SPEAKING:
            turn.phase = Phase.AWAITING_SPEAKER
        self._replay_missed(turn, now, out)

    def _replay_missed(self, turn: Turn, now: float, out: list[Effect]) -> None:
        """Offer ``turn`` the tagged arrays that came for its message while it was not open."""
        for item in [i for i in self._missed if states_match(i[0], turn.message, self.present)]:
            self._missed.remove(item)
            self._offer(list(item[0]), item[1], now, out)

    def _adopt(self, now: float, out: list[Effect]) -> None:
        """The thread's message went unanswered by everyone: join the rival thread, if any."""
        rival = self._rival
        if rival is None or self._live or now < self._dead_at:
            return
        self._rival = None
        info = turn_info(rival)
        left = self.thread.adopt(rival.params.id)
        self._log(
            out,
            "thread_adopted",
            "warning",
            message_id=rival.params.id,
            sender=rival.params.from_,
            left=left,
            reason="unanswered",
            why=f"nobody answered {left} (no states array, no signal) while the others went on "
            f"after it: the conversation follows their thread, at {rival.params.id}",
        )
        if self.turn is not None and self.turn.message_id == left:
            self._end_turn(self.turn, rival, info, out)
        self._moved(rival, info, now, out, replayed=False)
