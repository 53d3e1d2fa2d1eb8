"""One companion's part in a group conversation, as a state machine without I/O.

Theory of operation
-------------------
Like h11 for HTTP, a :class:`Conversation` owns every transition and does nothing itself. Its
driver (:mod:`companion.engine.driver`) feeds it *events* -- what the node saw (a message, a states
array, a peer's yield signal, a companion joining or leaving) and what the driver finished (the
leader's model answered, the reply went out, speaking failed) -- each with the current time:
``receive(event, now) -> list[Effect]``. Effects say what to do: ask the model for states,
publish the array, speak, withdraw a speech or a lead in progress, publish a signal, log a
decision. ``deadline()`` is the earliest time at which the machine wants a :class:`Tick`; the
driver sleeps until then (or until the next event). No clock is read here, nothing is awaited,
no socket is touched, so every rule below is a unit test with plain values. The events, the
effects and the thinking and yield signals are :mod:`companion.conversation.events`.

The conversation is one *thread* of messages (:mod:`companion.conversation.rules.thread`): those
that address this companion, and those that answer a message of the thread. Anything else on
the network -- unaddressed chatter, other groups' conversations, strangers -- never moves the
thread, never opens a turn and never withdraws a reply. Each message of the thread that
addresses this companion opens a *turn* (:mod:`companion.conversation.turn`: its record and its
phases), which the machine moves by a table, like h11's: :data:`HANDLERS` maps (the turn's
phase, the event's type) to the handler that takes it (``None`` for the phase when no turn is
open). ``receive`` looks the pair up and calls it; a pair not in the table is a bug in the
driver and raises :class:`TransitionError`, so the events valid in every phase are listed as
such, one by one. After every event, time is looked at (:meth:`Conversation._on_time`): an
array held for its slot counts, a leader takes over, a speaking slot opens or passes.

Rules (the rule book itself is :mod:`companion.conversation.rules`; which array counts and the
closing array of a turn nobody answered: :mod:`companion.conversation.arrays`; the speaking
slots: :mod:`companion.conversation.slots`):

- *Leader*: the candidates are the addressed ids this node knows as companions (bound now or
  earlier), at most :data:`~companion.conversation.rules.MAX_CANDIDATES`; aikyo's md5 rule picks
  the leader among them, rank ``k`` leads when no array counted ``k x takeover_after`` after the
  message (aikyo's candidates after the first never take over and take no slot:
  ``rules.leader_slot``).
- *Closing*: the stage of the accepted array is raised to this node's closing floor (the thread's
  stage, the turn limit, repetition), so a leader that does not know our rules (aikyo's) cannot
  move the stage back or run past ``max_turns``; the turn count is the thread's companion replies.
  Where only this node's floor reaches ``terminal``, the conversation is over for this companion
  alone: it gives its slot up (a ``terminal`` yield) and keeps following the turn. Leading at its
  own limit a conversation nobody has begun to close, with no aikyo companion in it, its array
  begins closing instead of ending it (``rules.leading_floor``) and it listens: another speaks.
- *Preferred speaker*: the leader marks one companion ``selected`` when the message names it,
  else when the exchange owes it a turn (:func:`~companion.conversation.rules.preferred_speaker`).
- *Quiet ending*: a reply of this companion that addresses nobody who can answer opens no turn
  anywhere; this node publishes its quiet closing (:meth:`Conversation._close_quietly`).
- *aikyo companions*: a companion seen behaving as aikyo's and never as ours is
  :meth:`~Conversation.slotless`: aikyo lets only an array's top speaker talk, so a slot after
  the first that belongs to such a companion is never waited for, wherever it stands
  (:func:`~companion.conversation.rules.slot_can_be_filled`). This node, leading, holds back an
  aikyo companion that said the message answered (:func:`~companion.conversation.rules.held_back`:
  aikyo's agent is still finishing and ignores arrays). When one of them speaks past this
  companion's turn limit and the leaders before this node are all aikyo's, this node publishes
  the ``terminal`` array at once; its own reply at its limit addresses only the people
  (:meth:`~Conversation._last_word`).
- *Mending the thread* (:mod:`companion.conversation.repair`): a turn that a late message set
  aside comes back when that message turns out older; a thread whose message nobody answers
  joins the newer thread the others follow.
- *Restarts*: a message this companion answered before a restart (the store's marks, read back
  at start) is never answered again: chosen for it, this node gives its slot up (``no_reply``).

The same machine runs as a *bystander* (``me=None``, e.g. the demo's transcript): it follows the
thread of the companions it knows, accepts arrays by the same rules and reports the speaker
decisions, but never leads or speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from companion.conversation.events import (
    THINKING_SIGNAL,
    CompanionJoined,
    CompanionLeft,
    Effect,
    Event,
    Lead,
    MessagePreviewed,
    MessageSeen,
    Prepare,
    PublishSignal,
    PublishStates,
    ReplyPublished,
    SpeakingFailed,
    StatesReady,
    StatesSeen,
    ThinkingSeen,
    Tick,
    Withdraw,
    YieldSeen,
)
from companion.conversation.preview import PreviewRules
from companion.conversation.repair import RepairRules
from companion.conversation.rules import (
    StateDecision,
    TurnInfo,
    fallback_decisions,
    finalize_states,
    held_back,
    later,
    leader_candidates,
    plan_leaders,
    preferred_speaker,
    slot_can_be_filled,
    states_match,
    turn_tag,
)
from companion.conversation.rules.closing import counted_proposal
from companion.conversation.slots import SlotRules
from companion.conversation.state import latest, state_summary
from companion.conversation.turn import Phase, TransitionError, Turn
from companion.protocol import COMPANION_ID_PREFIX, Message

__all__ = [
    "HANDLERS",
    "Conversation",
]

_VOICES: Final = 16
"""Participants whose last line the machine keeps (and whose replies it counts)."""
_VOICE_CHARS: Final = 160
_PEOPLE: Final = 16
_REPLIED_BEFORE: Final = "it replied before a restart"


class Conversation(PreviewRules, RepairRules, SlotRules):
    """The conversation as one node follows it (``me``: its companion id; ``None``: a bystander).

    ``known``: companions this node knew before (the store remembers them across restarts);
    ``replied``: messages it answered before (likewise); ``takeover_after`` and
    ``reply_timeout``: the lengths of a leader slot and a speaking slot.
    """

    def receive(self, event: Event, now: float) -> list[Effect]:
        """Feed one event; the effects the driver must carry out, in order."""
        phase = None if self.turn is None else self.turn.phase
        handler = HANDLERS.get((phase, type(event)))
        if handler is None:
            where = "no turn" if phase is None else phase.name
            raise TransitionError(f"{type(event).__name__} in {where}: not in the table of handlers")
        out: list[Effect] = []
        handler(self, event, now, out)
        self._on_time(now, out)
        return out

    # --- the handlers of events valid whatever the phase ------------------------------------------

    def _joined(self, event: CompanionJoined, now: float, out: list[Effect]) -> None:
        self.known.add(event.companion_id)
        self.present.add(event.companion_id)

    def _left(self, event: CompanionLeft, now: float, out: list[Effect]) -> None:
        self.present.discard(event.companion_id)

    def _tick(self, event: Tick, now: float, out: list[Effect]) -> None:
        """Time passed: :meth:`_on_time`, which follows every event, does the rest."""

    def _states_seen(self, event: StatesSeen, now: float, out: list[Effect]) -> None:
        self._offer(list(event.states), event.publisher, now, out)

    def _yield_seen(self, event: YieldSeen, now: float, out: list[Effect]) -> None:
        self._live = self._live or event.in_reply_to == self.thread.current
        if event.publisher == event.companion:
            self._evidence(event.publisher, True)  # aikyo sends no signals
        self._on_yield(event, now, out)

    def _thinking_seen(self, event: ThinkingSeen, now: float, out: list[Effect]) -> None:
        self._live = self._live or event.in_reply_to == self.thread.current
        if event.publisher == event.companion:
            self._evidence(event.publisher, True)
        self._on_thinking(event, now, out)

    def _too_late(self, event: SpeakingFailed, now: float, out: list[Effect]) -> None:
        """This node's speech ended after its turn moved on (withdrawn, replied, ended): nothing
        is left to give up."""

    # --- messages ------------------------------------------------------------------------------

    def _on_message(self, event: MessageSeen, now: float, out: list[Effect]) -> None:
        message = event.message
        params = message.params
        info = event.info
        self._settle_preview(message, out)  # work started from its preview goes on, or is dropped
        if self.thread.knows(params.id):
            self._log(out, "message_duplicate", "debug", message_id=params.id, sender=params.from_)
            return
        if event.publisher is not None and event.publisher == params.from_:
            # our companions stamp what they say; aikyo's messages carry no turn extensions
            self._evidence(params.from_, info.stamped or info.in_reply_to is not None)
        member = self.belongs(message, info)
        answered_by = self._answered_early(message, now) if member else None
        placed = self.thread.place(params.id, info.in_reply_to, member=member, answered_by=answered_by)
        if not member:
            return  # another conversation, or chatter: it changes nothing here
        latest(self._messages, params.id, message, 256)
        self._seen += 1
        if info.in_reply_to is None and params.from_.startswith(COMPANION_ID_PREFIX):
            latest(self._said, params.from_, (self._seen, params.id), _VOICES)  # as aikyo's lines are
        self._early.message_seen(message)
        self._utterances.append(params.message)
        if not params.from_.startswith(COMPANION_ID_PREFIX) and params.from_ != self.me:
            latest(self.people, params.from_, None, _PEOPLE)
        if placed.kind == "current" and placed.closes is not None and info.in_reply_to != placed.closes:
            self._set_aside(placed.closes)  # it may turn out older than the thread (repair.py)
        if self.turn is not None and placed.closes == self.turn.message_id:
            self._end_turn(self.turn, message, info, out)
        if placed.kind != "current":
            if placed.kind == "stale" and params.from_ != self.me:
                self._rival = message
            elif placed.kind == "stale" and not event.replayed and self._quiet(message, info):
                self._close_quietly(message, out, stale=True)  # for the nodes it is current at
            self._log(
                out,
                "message_stale",
                message_id=params.id,
                sender=params.from_,
                in_reply_to=info.in_reply_to,
                current=self.thread.current,
                placement=placed.kind,
                reason="its reply arrived first"
                if placed.kind == "overtaken"
                else "answers a message that a newer one superseded",
            )
            if placed.kind == "overtaken" and placed.closes is not None:
                self._resume(now, out)  # the thread went back to where this message had moved it from
            return
        self._moved(message, info, now, out, replayed=event.replayed)

    def _moved(
        self, message: Message, info: TurnInfo, now: float, out: list[Effect], *, replayed: bool
    ) -> None:
        """The conversation is at ``message`` now: count it, and open its turn if it addresses
        this companion."""
        params = message.params
        self._at(message, now)
        if params.from_.startswith(COMPANION_ID_PREFIX) and not opens_exchange(info):
            # The count follows the thread: our replies say it, aikyo's do not; nobody holds it down.
            self.replies = max(self.replies + 1, info.turn if info.stamped else 0)
            self.stage = later(self.stage, info.closing)
            latest(self._heard, params.from_, self._heard.get(params.from_, 0) + 1, _VOICES)
            self._last_turn = {cid: self._last_turn.get(cid, -1) for cid in self._heard}
            self._last_turn[params.from_] = self.replies
        else:
            # a person speaking opens a new exchange, as does a companion that says it opens one;
            # a person's ``closing: terminal`` (a client's stop) ends it: the floor is terminal,
            # so whoever leads publishes a terminal array without asking its model
            person_stops = info.closing == "terminal" and not params.from_.startswith(COMPANION_ID_PREFIX)
            self.replies, self.stage = 0, "terminal" if person_stops else "none"
            self._heard.clear()
            self._last_turn.clear()
        latest(
            self.voices, params.from_, {"said": params.message[:_VOICE_CHARS], "turn": self.replies}, _VOICES
        )
        if replayed:
            return
        if params.from_ == self.me:
            if self._quiet(message, info):
                self._close_quietly(message, out)
            else:
                self._own_line = message
            return
        if self.me is not None and self.me not in params.to:
            self._log(out, "not_addressed", "debug", message_id=params.id, sender=params.from_)
            return
        self._open_turn(message, info, now, out)

    def _open_turn(self, message: Message, info: TurnInfo, now: float, out: list[Effect]) -> None:
        params, nominated, answers = message.params, info.nominated, info.in_reply_to
        candidates = leader_candidates(message, self.known)
        if candidates.capped:
            self._log(
                out,
                "addressees_capped",
                "warning",
                message_id=params.id,
                dropped=candidates.capped,
                reason="too_many_addressees",
                why=f"more than {len(candidates.ids)} companions addressed; the rest take no part",
            )
        plan = plan_leaders(message, candidates.ids)
        addressed = tuple(cid for cid in candidates.ids if cid in self.present)
        rank = plan.rank(self.me)
        if rank is not None:
            busy = self._finishing(answers)  # issue 33 hook: never prefer one still finishing
            preference = preferred_speaker(
                nominated=nominated,
                text=params.message,
                candidates=[cid for cid in addressed if cid != params.from_ and cid not in busy],
                names=self.names,
                heard=self._heard,
                last_turn=self._last_turn,
            )
            if preference is not None and preference.reason != "nominated":
                nominated = preference.companion_id
                self._log(
                    out,
                    "speaker_preferred",
                    message_id=params.id,
                    speaker=nominated,
                    reason=preference.reason,
                    why=preference.why,
                )
        turn = Turn(message, now, self.replies, self.stage, nominated, plan, addressed, rank, answers)
        self.turn = turn
        self._log(
            out,
            "leader_chosen",
            message_id=params.id,
            sender=params.from_,
            turn=self.replies,
            leader=plan.leader,
            rank=rank,
            order=list(plan.order),
            unknown_addressees=candidates.unknown,
            reason=plan.reason,
            why=plan.why,
        )
        for companion, reason in self._early_yields.pop(params.id, {}).items():
            fields = {"message_id": params.id, "yielder": companion, "publisher": companion}
            self._yield(turn, companion, reason, now, out, fields)
        for states, (publisher, _arrived) in self._early.take(message, self.present):
            self._offer(states, publisher, now, out)
        for item in [i for i in self._early_plain if states_match(i[0], message, self.present)]:
            self._early_plain.remove(item)
            if not now - item[2] > self._early_window():  # (without a clock, inf - inf: kept)
                self._offer(item[0], item[1], now, out)
        self._replay_missed(turn, now, out)
        # --- hook (voice, issue 30): the likely speaker prepares its reply while the leader decides
        others = [cid for cid in addressed if cid != params.from_]
        likely = nominated or (others[0] if len(others) == 1 else None)
        stage = self._floor(turn).stage if rank is not None and likely == self.me else "terminal"
        if stage != "terminal" and turn.states is None:  # at terminal it gives its slot up
            out.append(Prepare(replace(self._speak_effect(turn), closing=stage)))
        # --- end of hook
        if rank == 0 and turn.states is None:
            self._lead(turn, out)
        elif (
            rank and turn.states is None and self.slotless(params.from_) and self._first_follower(turn, rank)
        ):
            floor = self._floor(turn)
            if floor.stage == "terminal":
                self._log(
                    out,
                    "cap_closing",
                    "warning",
                    message_id=params.id,
                    sender=params.from_,
                    rank=rank,
                    reason="past_the_cap",
                    why=f"{params.from_} (aikyo's, which knows no turn limit) spoke past this "
                    f"companion's limit ({floor.why}) and the leaders before this node are aikyo's: "
                    "the terminal array goes out now",
                )
                self._lead(turn, out, cap=True)

    def _end_turn(self, turn: Turn, by: Message, info: TurnInfo, out: list[Effect]) -> None:
        """A newer message of the thread ends ``turn``: a lead or a speech in progress is withdrawn,
        unless the newer message is this node's own reply."""
        self.turn = None
        if turn.phase is Phase.LEADING:
            out.append(Withdraw(turn.message_id, "lead", "the conversation moved on"))
        if turn.phase is Phase.SPEAKING and by.params.from_ != self.me:
            answered = info.in_reply_to == turn.message_id
            reason = (
                "another companion replied first"
                if answered
                else "a newer message of the conversation arrived"
            )
            out.append(Withdraw(turn.message_id, "speech", reason))
            self._log(out, "speech_withdrawn", message_id=turn.message_id, by=by.params.from_, reason=reason)

    # --- leading -------------------------------------------------------------------------------

    def _lead(self, turn: Turn, out: list[Effect], *, cap: bool = False) -> None:
        """Lead ``turn``: the states request, or the ``terminal`` array at once when the floor
        ends the conversation (``cap``: aikyo's companions spoke past this companion's limit,
        and the leaders before it are theirs; it ends there, as they know no limit)."""
        self._goto(turn, Phase.LEADING)
        floor = self._floor(turn) if cap else self._array_floor(turn)
        assert turn.rank is not None
        if floor.stage == "terminal":  # no model needed: the floor decides
            self._publish_states(turn, None, "closing_floor_terminal", out, cap=cap)
            return
        out.append(
            Lead(
                turn.message_id,
                turn.message,
                turn.addressed,
                turn.nominated,
                floor.stage,
                turn.replies,
                turn.rank,
            )
        )

    def _on_states_ready(self, event: StatesReady, now: float, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None or turn.message_id != event.message_id:
            self._states_withheld(event, now, out)
            return
        self._publish_states(turn, event.decisions, event.source, out)

    def _states_withheld(self, event: StatesReady, now: float, out: list[Effect]) -> None:
        """The model answered after this node stopped leading: an array counted meanwhile."""
        self._log(out, "states_withheld", message_id=event.message_id, reason="states already arrived")

    def _publish_states(
        self,
        turn: Turn,
        decisions: Sequence[StateDecision] | None,
        source: str,
        out: list[Effect],
        *,
        cap: bool = False,
    ) -> None:
        own = self._floor(turn)  # (over every utterance: computed once)
        floor = own if cap else self._array_floor(turn, own)
        held: list[str] = []
        nominated = turn.nominated
        if floor.stage != "terminal" and own.stage == "terminal":
            # Past this companion's own limit, the others close the conversation: it listens.
            others = [cid for cid in turn.addressed if cid != self.me]
            nominated = None if nominated == self.me else nominated
            if decisions is not None:
                decisions = [d for d in decisions if d.companion_id != self.me]
            if not any(d.state == "speak" for d in decisions or ()):
                decisions = fallback_decisions(others, nominated)
            held.append(f"{self.me} is past its own turn limit: it listens while the others close")
        if decisions is None:
            decisions = fallback_decisions(turn.addressed, nominated)
        else:
            counted = []
            for d in decisions:
                stage = counted_proposal(
                    d.closing, floor=floor.stage, replies=turn.replies, min_replies=self.settings.min_replies
                )
                if stage != d.closing:
                    held.append(
                        f"{d.companion_id} proposed {d.closing} before {self.settings.min_replies} "
                        f"replies: held at {stage}"
                    )
                counted.append(replace(d, closing=stage))
            decisions = counted
        # issue 33 hook: an aikyo companion that said the message answered is still finishing
        busy = self._finishing(turn.answers)
        decisions, notes = held_back(decisions, busy)
        held += notes
        nominated = None if nominated in busy else nominated
        outcome = finalize_states(
            decisions, turn.addressed, floor=floor.stage, nominated=nominated, tag=turn_tag(turn.message)
        )
        self._log(
            out,
            "states_published",
            message_id=turn.message_id,
            rank=turn.rank,
            source=source,
            stage=outcome.stage,
            floor=floor.stage,
            floor_reason=floor.reason,
            floor_why=floor.why,
            repetition=floor.repetition,
            adjustments=[*held, *outcome.adjustments],
            states=[state_summary(s) for s in outcome.states],
        )
        self._goto(turn, Phase.LED)
        out.append(PublishStates(turn.message_id, outcome.states))

    # --- time --------------------------------------------------------------------------------

    def _on_time(self, now: float, out: list[Effect]) -> None:
        """What time alone does: an array held for its slot counts, a leader takes over, the
        closing array goes out, a speaking slot opens or passes, a turn nobody answered ends."""
        self._expire_previews(now, out)
        self._adopt(now, out)
        turn = self.turn
        if turn is None:
            return
        if turn.states is None:
            ready = [r for r in sorted(turn.pending) if self._due(turn, r) <= now]
            if ready:
                states, publisher = turn.pending.pop(ready[0])
                self._accept(turn, list(states), ready[0], publisher, now, out)
            elif (
                turn.phase is Phase.AWAITING_STATES
                and turn.rank
                and now >= turn.opened_at + self._lead_slot(turn, turn.rank) * self.takeover_after
            ):
                wait = self._lead_slot(turn, turn.rank) * self.takeover_after
                self._log(
                    out,
                    "takeover",
                    "warning",
                    message_id=turn.message_id,
                    rank=turn.rank,
                    reason="no_states",
                    why=f"no states within {wait:g} s from {', '.join(turn.plan.order[: turn.rank])}",
                )
                self._lead(turn, out)
        if turn.closing_at is not None and now >= turn.closing_at:
            self._publish_closing(turn, out)
        if (
            turn.states is None
            or self.bystander
            or turn.phase not in (Phase.AWAITING_SPEAKER, Phase.SPEAKING)
        ):
            return
        slot = turn.slot_at(now)
        # issue 33 hook: a slot given up, or a stand-in's slot of an aikyo companion (they speak
        # only as an array's top speaker), opens the next one at once (rules.slot_can_be_filled)
        skipped: list[str] = []
        while slot < len(turn.order) and not slot_can_be_filled(
            turn.order, slot, gave_up=turn.yielded, slotless=self.slotless
        ):
            if turn.order[slot] not in turn.yielded:
                skipped.append(turn.order[slot])
            turn.rebase(slot, now, self.reply_timeout)
            slot = turn.slot_at(now)
        if skipped:
            self._log(
                out,
                "slots_skipped",
                message_id=turn.message_id,
                skipped=skipped,
                reason="slotless",
                why="these slots belong to companions that do not follow slots (aikyo's speak "
                "only as an array's top speaker): nobody will answer in them",
            )
        if slot != turn.slot:
            previous = turn.order[turn.slot] if 0 <= turn.slot < len(turn.order) else None
            if previous is not None and previous not in turn.yielded and slot < len(turn.order):
                self._log(
                    out,
                    "speaker_silent",
                    "warning",
                    message_id=turn.message_id,
                    silent=previous,
                    speaker=turn.order[slot],
                    slot=slot,
                    why=f"no reply within {self.reply_timeout:g} s; next in the speaking order",
                )
            turn.slot = slot
        if turn.phase is Phase.SPEAKING and (slot >= len(turn.order) or turn.order[slot] != self.me):
            # Its speaking deadline keeps a speaker inside its slot; should the slot end first,
            # the next speaker must not find it still speaking.
            self._withdraw_speech(turn, None, "this node's speaking slot ended", out)
            turn.yielded[self.me or ""] = "slot_ended"
            self._goto(turn, Phase.AWAITING_SPEAKER)
        if slot >= len(turn.order):
            self._unanswered(turn, now, out)
            return
        if turn.order[slot] == self.me and turn.phase is Phase.AWAITING_SPEAKER:
            self._goto(turn, Phase.SPEAKING)
            out.append(PublishSignal(THINKING_SIGNAL, {"in_reply_to": turn.message_id}))
            if not self.replied(turn.message_id):
                out.append(self._speak_effect(turn))
                return
            # A node killed as its reply left, started again and chosen for the same message:
            # it gives the slot up rather than answer twice (the store kept the mark).
            self._on_failed(SpeakingFailed(turn.message_id, "no_reply", _REPLIED_BEFORE), now, out)
            self._on_time(now, out)


def opens_exchange(info: TurnInfo) -> bool:
    """Whether a companion's message opens a new exchange rather than continuing the thread: it
    answers nothing and says ``turn: 0`` (a routine speaking first, a client or tool speaking with
    a companion id). Replies always carry ``in_reply_to``; aikyo's carry no ``turn`` and continue."""
    return info.stamped and info.turn == 0 and info.in_reply_to is None


Handler = Callable[[Conversation, Any, float, list[Effect]], None]

_EVERY_PHASE: Final[Mapping[type[Any], Handler]] = {
    MessageSeen: Conversation._on_message,
    MessagePreviewed: Conversation._on_preview,
    StatesSeen: Conversation._states_seen,
    YieldSeen: Conversation._yield_seen,
    ThinkingSeen: Conversation._thinking_seen,
    Tick: Conversation._tick,
    CompanionJoined: Conversation._joined,
    CompanionLeft: Conversation._left,
}
"""What the network and the clock say is taken whatever the phase (a message moves the thread,
an array may be early or late, a peer's signal or a join is news in any phase)."""

HANDLERS: Final[Mapping[tuple[Phase | None, type[Any]], Handler]] = {
    **{(phase, kind): handler for phase in (None, *Phase) for kind, handler in _EVERY_PHASE.items()},
    **{(phase, StatesReady): Conversation._states_withheld for phase in (None, *Phase)},
    (Phase.LEADING, StatesReady): Conversation._on_states_ready,
    **{(phase, SpeakingFailed): Conversation._too_late for phase in (None, *Phase)},
    (Phase.SPEAKING, SpeakingFailed): Conversation._on_failed,
    (Phase.SPEAKING, ReplyPublished): Conversation._on_replied,
}
"""The table that drives :meth:`Conversation.receive`: (the turn's phase, or ``None`` without
a turn; the event's type) -> its handler. The model's states count only while this node leads
(else they are withheld: its array is out, LED, or another array counted); this node's failure
only while it speaks (else its speech was already over); its reply goes out only while it
speaks (the driver feeds :class:`ReplyPublished` right after :meth:`Conversation.outgoing` said
it may, before the publish, so that nothing withdraws the speech or opens a second one while
the reply is on its way: docs/architecture.md, "Why REPLIED comes before the publish"; any
other phase is a bug)."""
