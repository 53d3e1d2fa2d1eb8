"""Which states array counts for a turn; the arrays that close it (nobody answered; a quiet reply).

*States*: an array counts only from a candidate whose slot is due (its rank's slot began, give
or take :data:`~companion.conversation.turn.SLOT_GRACE` of a slot for clock and delivery skew);
an array from anyone else is logged and ignored whatever it says, ``terminal`` included. A
candidate's array that comes before its slot is held until the slot, and dropped if an earlier
leader's comes. A late array from an earlier leader replaces a takeover's, so every node ends on
the same array.

*Unanswered*: when every slot of the order passed without a reply (each speaker failed, gave
its slot up or is gone), nobody will ever answer, so the conversation ends, visibly: the leader
whose array counted publishes a *closing array* (``terminal``, tagged for the message,
:func:`~companion.conversation.rules.closing_states`) at once, else the next candidate in the
takeover order one leader slot later, and so on. It counts from the leader whose array counted
(or an earlier one) at once; from a later candidate only once this node saw every slot pass too
(it is held until then), so nobody cuts off a speaker still in its slot.
"""

from __future__ import annotations

from typing import Final

from companion.conversation.events import (
    YIELD_SIGNAL,
    Decision,
    Effect,
    PublishSignal,
    PublishStates,
    Withdraw,
)
from companion.conversation.rules import (
    SpeakingOrder,
    TurnInfo,
    closing_states,
    ends_conversation,
    later,
    leader_candidates,
    plan_leaders,
    quiet_closing,
    speaking_order,
    states_match,
    states_tag,
)
from companion.conversation.state import MachineState
from companion.conversation.turn import Phase, Turn
from companion.protocol import Message, State

__all__ = ["EARLY_PLAIN", "ArrayRules"]

EARLY_PLAIN: Final = 1.0
"""Seconds a companion keeps an untagged (aikyo's) array for a message that has not come: gossip
reorders two topics by milliseconds; an older array is more likely a late one of a message seen."""


class ArrayRules(MachineState):
    """The machine's rules for arrays: offered, held, accepted; and the closing array."""

    def _quiet(self, message: Message, info: TurnInfo) -> bool:
        """Whether ``message`` is a reply of this companion that addresses nobody who can answer."""
        return (
            message.params.from_ == self.me
            and info.in_reply_to is not None
            and not (set(message.params.to) & self.present) - {self.me}
        )

    def _close_quietly(self, reply: Message, out: list[Effect], *, stale: bool = False) -> None:
        """This companion's reply came back addressed to nobody who can answer (only people, or
        companions that are gone): no turn opens for it anywhere, so the conversation would
        neither go on nor end. It ends visibly: this node publishes the reply's quiet closing
        (:func:`~companion.conversation.rules.quiet_closing`), which clients, bystanders and aikyo nodes read
        as ``terminal``. A person who answers opens a new exchange, as always.

        ``stale``: the reply crossed a newer message here (gossip's order differs from node to
        node), so the conversation goes on here; nodes it reached first are at it, and only its
        closing ends it there (seed 1203 of ``scripts/bench_faults.py``: a bystander waited)."""
        assert self.me is not None
        why = "this companion's reply addresses nobody who can answer; the conversation ends here"
        if stale:
            why = (
                "this companion's reply addresses nobody who can answer and crossed a newer "
                "message here: it ends the conversation where it arrived first"
            )
        self._log(
            out,
            "states_published",
            message_id=reply.params.id,
            rank=None,
            source="quiet",
            stage="terminal",
            reason="quiet",
            to=list(reply.params.to),
            why=why,
        )
        if not stale:
            self._over(out, reply.params.id, self.replies, "quiet")
        out.append(PublishStates(reply.params.id, closing_states((), reply, self.me)))

    def _over(self, out: list[Effect], message_id: str, turn: int, reason: str, **fields: object) -> None:
        """Log that the conversation ended here at ``message_id`` (``terminal``), and why."""
        ended = {"message_id": message_id, "turn": turn, "closing": "terminal", "reason": reason}
        out.append(Decision("conversation_over", {**ended, **fields}, "info"))

    def _ends_own_line(self, states: list[State], publisher: str | None, out: list[Effect]) -> bool:
        """Whether ``states`` is an array that ends the conversation at this companion's own last
        line, from a leader candidate of that line: the others take the end from it, and so does
        this companion, which has no turn of its own line to take it in (before, the companion
        whose line was the last never recorded the end). Recorded once."""
        line = self._own_line
        if line is None or not states_match(states, line, self.present):
            return False
        decision = speaking_order(states).first
        if not (decision.conversation_over or decision.closing == "terminal"):
            return False
        if plan_leaders(line, leader_candidates(line, self.known).ids).rank(publisher) is None:
            return False  # only a leader of the line ends it (a forger's array is ignored below)
        self._own_line = None
        self._over(out, line.params.id, self.replies, "terminal", source=publisher)
        return True

    def _early_window(self) -> float:
        """How long an untagged array waits for the message it matches. A bystander only reports
        what it saw: a leader slot. A companion acts on it, and a late array (aikyo's leaders
        publish theirs after our ``terminal``) taken for the next message's chose its speaker or
        ended it unanswered (the mixed-network test stalled): :data:`EARLY_PLAIN` for gossip's
        reordering across topics, milliseconds."""
        return self.takeover_after if self.bystander else min(self.takeover_after, EARLY_PLAIN)

    def _answered_early(self, message: Message, now: float) -> str | None:
        """The message that already answered ``message``, by what came before it: an untagged
        array that matches it came (:meth:`_early_window`), and the speaker it put first said a
        line naming nothing since. aikyo's replies name no message, so ``message``, late, looked
        newer than its answer: a person's message delivered late split the group (the nodes it
        reached late gave it a turn of its own; both sides went on past the turn cap), a reply
        delivered after its answer got a second one (bench_faults seeds 363 and 580)."""
        if message.params.from_ == self.me:
            return None
        for item in self._early_plain:
            states, _publisher, arrived, seen = item
            if now - arrived > self._early_window() or not states_match(states, message, self.present):
                continue
            first = speaking_order(states).first.speaker
            said = None if first is None else self._said.get(first)
            if said is not None and said[0] > seen:
                self._early_plain.remove(item)
                return said[1]
        return None

    def _offer(self, states: list[State], publisher: str | None, now: float, out: list[Effect]) -> None:
        self._evidence(publisher, states_tag(states) is not None)  # our leaders tag their arrays
        turn = self.turn
        froms = [s.params.from_ for s in states]
        current = self.current
        if current is not None and states_match(states, current, self.present):
            self._live = True
        if turn is None or not states_match(states, turn.message, self.present):
            if self._ends_own_line(states, publisher, out):
                return
            held = self._early.hold(states, (publisher, now))  # its message may still be on the way
            if not held and states_tag(states) is not None:
                self._missed.append((states, publisher))  # its turn may come back (repair.py)
            if not held and states_tag(states) is None:
                # Untagged (aikyo's) arrays cannot be tied to a message not seen yet: a few are
                # kept for a slot, matched by addressees when a message comes (machine.py). A
                # companion that dropped them took over with its own array while the others
                # followed aikyo's, and two reached their slots at once (bench_faults 2309).
                self._early_plain.append((states, publisher, now, self._seen))
                held = True
            self._log(
                out,
                "states_ignored",
                "debug",
                publisher=publisher,
                froms=froms,
                message_id=None if turn is None else turn.message_id,
                held=held,
                reason="no open turn" if turn is None else "not for the current message",
            )
            return
        quiet = quiet_closing(states, turn.message)
        if quiet and publisher is not None and publisher != turn.message.params.from_:
            rank: int | None = None  # only the sender may close its own message quietly
        elif quiet or (publisher is None and self.bystander):
            # A bystander that cannot authenticate publishers takes an array as the leader's.
            rank = 0
        else:
            rank = turn.plan.rank(publisher)
        if rank is None:
            self._log(
                out,
                "states_ignored",
                "warning",
                publisher=publisher,
                message_id=turn.message_id,
                closing=sorted({s.params.closing for s in states}),
                reason="not_a_leader",
                why=f"published by {publisher or 'an unknown peer'}, no leader candidate of this message",
            )
            return
        if turn.states is not None:
            same = list(turn.states) == states
            if turn.phase is Phase.CLOSED:
                self._log(
                    out,
                    "states_ignored",
                    "debug" if same else "info",
                    publisher=publisher,
                    message_id=turn.message_id,
                    reason="the conversation closed at this message",
                )
                return
            if not same and rank >= turn.priority and ends_conversation(states):
                self._offer_closing(turn, states, rank, publisher, now, out)
                return
            # A speaker began under the array that counted: a late array that puts another first
            # is ignored, for its node may never see it (an aikyo one matches by its addressees
            # only, and may be another message's: seed 2631 of bench_faults) and this node would
            # speak beside it. The first to begin goes on, as thinking signals decide (slots.py);
            # an earlier leader's array that ends the conversation still ends it.
            first = speaking_order(states).first
            overruled = (
                turn.began is not None
                and first.speaker != turn.began
                and not (first.conversation_over or first.closing == "terminal")
            )
            if same or rank >= turn.priority or overruled:
                self._log(
                    out,
                    "states_ignored",
                    "debug" if same else "info",
                    publisher=publisher,
                    message_id=turn.message_id,
                    began=turn.began,
                    reason="duplicate"
                    if same
                    else "an array from an earlier or equal leader came first"
                    if rank >= turn.priority
                    else "a speaker already began under the array that counted",
                )
                return
            self._log(
                out,
                "states_switched",
                "warning",
                publisher=publisher,
                message_id=turn.message_id,
                rank=rank,
                replaced_rank=turn.priority,
                reason="the array of an earlier leader arrived late",
            )
            # the earliest leader's array that ends it is final
            self._accept(turn, states, rank, publisher, now, out, final=ends_conversation(states))
            return
        final = bool(rank) and ends_conversation(states) and self._first_follower(turn, rank)
        if final:
            # The first of our leaders ends it (its cap, see _open_turn): aikyo's leaders before
            # it know no limit, so it counts now, and no later array of theirs replaces it.
            self._accept(turn, states, rank, publisher, now, out, final=True)
            return
        if now < self._due(turn, rank):
            if rank not in turn.pending:
                turn.pending[rank] = (states, publisher)
            why = f"{publisher} ranks {rank}: it counts in its slot unless an earlier one does"
            self._deferred(turn, publisher, rank, "slot_not_due", why, out)
            return
        self._accept(turn, states, rank, publisher, now, out, closes=quiet, quiet=quiet)

    def _offer_closing(
        self,
        turn: Turn,
        states: list[State],
        rank: int,
        publisher: str | None,
        now: float,
        out: list[Effect],
    ) -> None:
        """A ``terminal`` array after an array counted: from the leader whose array counted (or a
        bystander's view) it ends the turn at once; from a later candidate only once every slot
        passed here (held until then), so nobody can cut off a speaker still in its slot."""
        if not turn.order and turn.closing == "terminal":
            reason = "the conversation already ended here"
            self._log(out, "states_ignored", publisher=publisher, message_id=turn.message_id, reason=reason)
        elif self.bystander or rank <= turn.priority or turn.unanswered:
            self._accept(turn, states, rank, publisher, now, out, closes=True)
        else:
            if rank not in turn.pending:  # the lowest rank counts first (:meth:`_unanswered`)
                turn.pending[rank] = (states, publisher)
            why = f"{publisher} closes the conversation; it counts once every speaking slot passed here"
            self._deferred(turn, publisher, rank, "turn_not_over", why, out)

    def _deferred(
        self, turn: Turn, publisher: str | None, rank: int, reason: str, why: str, out: list[Effect]
    ) -> None:
        self._log(
            out,
            "states_deferred",
            "warning",
            publisher=publisher,
            message_id=turn.message_id,
            rank=rank,
            reason=reason,
            why=why,
        )

    def _accept(
        self,
        turn: Turn,
        states: list[State],
        rank: int,
        publisher: str | None,
        now: float,
        out: list[Effect],
        *,
        closes: bool = False,
        quiet: bool = False,
        final: bool = False,
    ) -> None:
        """``states`` count for ``turn`` (``closes``: it is a closing array, see :meth:`_unanswered`;
        ``quiet``: the sender's quiet closing, see :meth:`_close_quietly`; ``final``: an array that
        ends the conversation and that no later one may replace). A closing or a final array
        leaves nobody to speak (each says ``terminal``) and moves the turn to ``CLOSED``.

        The stage is raised to this node's floor. Where the floor alone reaches ``terminal`` (the
        array does not), the conversation is over for this companion only: cards' limits differ,
        so the others may go on. It gives its slot up (a ``terminal`` yield) but keeps following
        the turn, so a turn nobody answers still finds it to close the conversation for everyone.
        A bystander has the companions' shared limit, if any, and reports the end by it."""
        first = turn.states is None
        if first:
            turn.accepted_at = now
        turn.states, turn.priority = states, rank
        turn.closing_at = None
        turn.pending.clear()  # what was held never counts now (a late earlier array is weighed on arrival)
        speaking: SpeakingOrder = speaking_order(states)
        decision = speaking.first
        floor = self._floor(turn)
        closing = later(decision.closing, floor.stage)
        ended = decision.conversation_over or decision.closing == "terminal"
        floor_ends = closing == "terminal" and not ended
        over = ended or (floor_ends and self.bystander)
        why = decision.why
        if quiet:
            why = (
                f"{turn.message.params.from_} addressed its reply to nobody who can answer "
                "(only people): the conversation ends here"
            )
        elif closes:
            why = (
                f"{publisher or 'a leader'} closed the conversation: nobody answered the message "
                "(every speaker gave its slot up or stayed silent)"
            )
        elif closing != decision.closing:
            why += f"; closing raised to {closing} ({floor.why})"
            if floor_ends and not self.bystander:
                why += ": this companion gives its slot up"
        turn.closing = closing
        turn.order = () if over or closes or final else speaking.order
        turn.slot_opens = [turn.accepted_at + k * self.reply_timeout for k in range(len(turn.order))]
        turn.ends = turn.accepted_at + len(turn.order) * self.reply_timeout
        turn.slot = -1
        self._log(
            out,
            "speaker_chosen",
            message_id=turn.message_id,
            turn=turn.replies,
            speaker=None if over else decision.speaker,
            reason="terminal" if over else decision.reason,
            why=why,
            closing=closing,
            order=list(turn.order),
            source=publisher,
        )
        if turn.phase is Phase.LEADING:
            out.append(Withdraw(turn.message_id, "lead", "another leader's array counted first"))
        if floor_ends and self.me is not None and self.me in speaking.order and self.me not in turn.yielded:
            # The array gives this node a slot its own floor forbids: the others need not wait for it.
            turn.yielded[self.me] = "terminal"
            out.append(PublishSignal(YIELD_SIGNAL, {"in_reply_to": turn.message_id, "reason": "terminal"}))
        if not turn.order:
            if turn.phase is Phase.SPEAKING:
                self._withdraw_speech(turn, publisher, "the accepted array ends the turn", out)
            if closes or final:
                self._goto(turn, Phase.CLOSED)
            elif turn.phase not in (Phase.DONE, Phase.REPLIED):
                self._goto(turn, Phase.DONE)
            if over:
                reason = "quiet" if quiet else "unanswered" if closes else "terminal"
                self._over(out, turn.message_id, turn.replies, reason)
            return
        if turn.phase in (Phase.AWAITING_STATES, Phase.LEADING, Phase.LED, Phase.DONE):
            self._goto(turn, Phase.AWAITING_SPEAKER)
        elif turn.phase is Phase.SPEAKING:
            slot = turn.slot_at(now)
            if slot >= len(turn.order) or turn.order[slot] != self.me or self.me in turn.yielded:
                reason = (
                    "this companion's own closing floor ends the conversation"
                    if self.me in turn.yielded
                    else "the earlier leader's array gives this slot to another companion"
                )
                self._withdraw_speech(turn, publisher, reason, out)
                self._goto(turn, Phase.AWAITING_SPEAKER)

    def _unanswered(self, turn: Turn, now: float, out: list[Effect]) -> None:
        """Every slot of the order passed without a reply: nobody will ever answer this message,
        so the conversation would neither go on nor end. It ends, visibly and the same for all.

        Why end rather than hand the turn back: every addressed companion was in the order (the
        stand-ins are all of them), and each gave its slot up (its model failed, its own limit
        ended the conversation) or stayed silent (it is gone). The sender just spoke; asking it
        to answer its own message would be a monologue, and with a failing provider it fails
        too. People expect a conversation that fell silent to say so and to be over: then
        anyone may open a new one (a person's message always does).

        So the leader whose array counted publishes a *closing array* (every addressee listens,
        ``terminal``, tagged for the message; aikyo reads it as any terminal array) at once; if
        it is gone, the next candidate in the takeover order one leader slot later, and so on.
        Every node and the bystander accept it (:meth:`_offer_closing`) and log
        ``conversation_over`` with reason ``unanswered``."""
        gave_up = turn.gave_up()
        self._log(
            out,
            "turn_unanswered",
            "warning",
            message_id=turn.message_id,
            order=list(turn.order),
            gave_up=gave_up,
            reason="every candidate stayed silent or gave up",
        )
        self._goto(turn, Phase.DONE)
        if turn.pending:  # a later candidate's closing array, held until now
            rank = min(turn.pending)
            states, publisher = turn.pending.pop(rank)
            self._accept(turn, list(states), rank, publisher, now, out, closes=True)
        elif turn.rank is not None:
            # one leader slot per candidate before this one, from the leader whose array counted,
            # that will close it: aikyo's never publish a closing array, so they take no slot
            n = len(turn.plan.order)
            ahead = [turn.plan.order[(turn.priority + j) % n] for j in range((turn.rank - turn.priority) % n)]
            k = sum(1 for cid in ahead if not self.slotless(cid))
            turn.closing_at = now + k * self.takeover_after
            if k == 0:
                self._publish_closing(turn, out)

    def _publish_closing(self, turn: Turn, out: list[Effect]) -> None:
        turn.closing_at = None
        if turn.phase is Phase.CLOSED:
            return
        gave_up = ", ".join(f"{cid} ({why})" for cid, why in turn.gave_up().items())
        self._log(
            out,
            "states_published",
            message_id=turn.message_id,
            rank=turn.rank,
            source="unanswered",
            stage="terminal",
            reason="unanswered",
            why=f"nobody answered the message: {gave_up}; the conversation ends here",
        )
        assert self.me is not None  # a bystander never closes: it never sees a turn unanswered
        states = closing_states(turn.addressed, turn.message, self.me)
        out.append(PublishStates(turn.message_id, states))
