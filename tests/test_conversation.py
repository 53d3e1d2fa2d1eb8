"""The conversation state machine alone: every transition and every turn-integrity rule, with
plain values and a hand-moved clock (no trio, no sockets)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.conversation.events import (
    THINKING_SIGNAL,
    YIELD_SIGNAL,
    CompanionJoined,
    CompanionLeft,
    Effect,
    Lead,
    MessageSeen,
    PublishSignal,
    PublishStates,
    ReplyPublished,
    Speak,
    SpeakingFailed,
    StatesReady,
    StatesSeen,
    ThinkingSeen,
    Tick,
    Withdraw,
    YieldSeen,
    read_signal,
)
from companion.conversation.machine import HANDLERS, Conversation
from companion.conversation.rules import (
    MAX_CANDIDATES,
    META_CLOSING,
    META_IN_REPLY_TO,
    META_TURN,
    StateDecision,
    ends_conversation,
    plan_leaders,
)
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES
from companion.conversation.state import ONE_MESSAGE
from companion.conversation.turn import SLOT_GRACE, TRANSITIONS, Phase, TransitionError
from companion.protocol import Action, ClosingStage, Message, State
from support.conversations import (
    USER,
    A,
    B,
    C,
    D,
    E,
    R,
    T,
    array,
    decisions,
    machine,
    message_led_by,
    of,
    reply,
)


def phase(m: Conversation) -> Phase | None:
    return None if m.turn is None else m.turn.phase


# --- transitions -----------------------------------------------------------------------------


def test_a_move_outside_the_table_is_a_bug() -> None:
    m = machine(A)
    m.receive(MessageSeen(message_led_by(B, [A, B, C])), 0.0)
    turn = m.turn
    assert turn is not None and turn.phase is Phase.AWAITING_STATES
    for source, target in itertools.product(Phase, Phase):
        turn.phase = source
        if target in TRANSITIONS[source]:
            m._goto(turn, target)
        else:
            with pytest.raises(TransitionError):
                m._goto(turn, target)


def test_a_phase_and_event_pair_outside_the_table_raises() -> None:
    """The table drives ``receive``: this node's reply is news only while it speaks, so a
    ``ReplyPublished`` in any other phase (or with no turn) is the driver's bug, said at once."""
    m = machine(A)
    message = message_led_by(B, [A, B, C])
    stamped = reply(A, [USER, B], message)
    with pytest.raises(TransitionError, match="ReplyPublished in no turn"):
        m.receive(ReplyPublished(message.params.id, stamped), 0.0)
    m.receive(MessageSeen(message), 0.0)
    assert phase(m) is Phase.AWAITING_STATES and (Phase.AWAITING_STATES, ReplyPublished) not in HANDLERS
    with pytest.raises(TransitionError, match="ReplyPublished in AWAITING_STATES"):
        m.receive(ReplyPublished(message.params.id, stamped), 0.1)
    assert phase(m) is Phase.AWAITING_STATES  # nothing moved


def test_events_valid_in_every_phase_are_listed_for_every_phase() -> None:
    everywhere = (MessageSeen, StatesSeen, StatesReady, SpeakingFailed, YieldSeen, ThinkingSeen, Tick)
    for kind in (*everywhere, CompanionJoined, CompanionLeft):
        assert all((p, kind) in HANDLERS for p in (None, *Phase)), kind
    assert [p for p in (None, *Phase) if (p, ReplyPublished) in HANDLERS] == [Phase.SPEAKING]


def test_the_leader_leads_at_once_and_the_others_wait_their_slot() -> None:
    message = message_led_by(A, [A, B, C])
    plan = plan_leaders(message, [A, B, C])
    machines = {cid: machine(cid) for cid in (A, B, C)}
    out = {cid: m.receive(MessageSeen(message), 0.0) for cid, m in machines.items()}
    [lead] = of(out[A], Lead)
    assert (lead.addressed, lead.rank, lead.floor, lead.turn) == ((A, B, C), 0, "none", 0)
    assert phase(machines[A]) is Phase.LEADING
    for rank, cid in enumerate(plan.order):
        [chosen] = decisions(out[cid], "leader_chosen")
        assert chosen.fields["leader"] == A and chosen.fields["rank"] == rank and chosen.fields["why"]
        if rank:
            assert phase(machines[cid]) is Phase.AWAITING_STATES and not of(out[cid], Lead)
            assert machines[cid].deadline() == rank * T


def test_states_ready_publishes_one_tagged_array_and_a_late_answer_is_withheld() -> None:
    message = message_led_by(A, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    out = m.receive(StatesReady(message.params.id, None, "fallback_model_error"), 1.0)
    [published] = of(out, PublishStates)
    assert [s.params.from_ for s in published.states] == [A, B, C]
    [logged] = decisions(out, "states_published")
    assert logged.fields["source"] == "fallback_model_error" and logged.fields["floor"] == "none"
    again = m.receive(StatesReady(message.params.id, [], "model"), 1.5)
    assert not of(again, PublishStates) and decisions(again, "states_withheld")


def test_the_own_array_counts_when_it_comes_back_and_its_speaker_prepares() -> None:
    message = message_led_by(A, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    states = of(m.receive(StatesReady(message.params.id, None, "fallback_timeout"), 1.0), PublishStates)[0]
    assert phase(m) is Phase.LED  # its lead is over, but the array counts when the transport echoes it
    out = m.receive(StatesSeen(states.states, A), 1.1)
    [chosen] = decisions(out, "speaker_chosen")
    assert chosen.fields["speaker"] == A and chosen.fields["reason"] == "wants_to_speak"  # rule-based
    assert phase(m) is Phase.SPEAKING
    [thinking] = of(out, PublishSignal)
    assert (thinking.name, dict(thinking.params)) == (THINKING_SIGNAL, {"in_reply_to": message.params.id})
    [speak] = of(out, Speak)
    assert (speak.turn, speak.closing, speak.recipients, speak.fallback) == (1, "none", (USER, B, C), (USER,))


def test_rank_k_takes_over_after_k_slots_without_states() -> None:
    message = message_led_by(A, [A, B, C])
    order = plan_leaders(message, [A, B, C]).order
    second, third = order[1], order[2]
    m2, m3 = machine(second), machine(third)
    for m in (m2, m3):
        m.receive(MessageSeen(message), 0.0)
    assert not of(m2.receive(Tick(), T - 0.01), Lead)
    out = m2.receive(Tick(), T)
    assert decisions(out, "takeover")[0].fields["rank"] == 1 and of(out, Lead)
    assert phase(m2) is Phase.LEADING
    assert not of(m3.receive(Tick(), T), Lead)
    assert of(m3.receive(Tick(), 2 * T), Lead)


def test_an_array_that_counts_while_leading_withdraws_the_lead() -> None:
    message = message_led_by(A, [A, B, C])
    order = plan_leaders(message, [A, B, C]).order
    m = machine(order[1])
    m.receive(MessageSeen(message), 0.0)
    m.receive(Tick(), T)  # takes over, its model is still thinking
    out = m.receive(StatesSeen(array(message, C), A), T + 0.5)  # the leader was only slow
    assert Withdraw(message.params.id, "lead", "another leader's array counted first") in out
    assert phase(m) in (Phase.AWAITING_SPEAKER, Phase.SPEAKING)
    assert decisions(m.receive(StatesReady(message.params.id, None, "model"), T + 1), "states_withheld")


def test_a_lead_is_withdrawn_only_before_its_array_is_out() -> None:
    """LEADING -> LED when this node publishes its array: from then on there is no lead to
    withdraw, whether another leader's array counts first or the thread moves on; before, both
    withdraw it."""
    message = message_led_by(A, [A, B, C])
    takeover = plan_leaders(message, [A, B, C]).order[1]
    for published in (False, True):
        m, n = machine(takeover), machine(A)
        m.receive(MessageSeen(message), 0.0)
        m.receive(Tick(), T)  # takes over
        n.receive(MessageSeen(message), 0.0)  # the leader, at once
        assert phase(m) is phase(n) is Phase.LEADING
        if published:
            assert of(m.receive(StatesReady(message.params.id, None, "model"), T + 0.2), PublishStates)
            assert of(n.receive(StatesReady(message.params.id, None, "model"), 0.2), PublishStates)
            assert phase(m) is phase(n) is Phase.LED
            assert m.in_turn and m.prepared_for == message.params.id
        out = m.receive(StatesSeen(array(message, C), A), T + 0.5)  # the leader's array counts
        assert decisions(out, "speaker_chosen")
        assert bool([w for w in of(out, Withdraw) if w.what == "lead"]) is not published
        out = n.receive(MessageSeen(reply(B, [USER], message)), 1.0)  # the thread moves on
        assert n.turn is None
        assert (Withdraw(message.params.id, "lead", "the conversation moved on") in out) is not published


def test_a_closing_array_that_overtakes_the_own_reply_closes_the_turn_and_it_stays_answered() -> None:
    """REPLIED -> CLOSED: the leader's closing array may come before this node's reply comes
    back. No array counts any more, and a second message is still refused as one too many."""
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, A), B), 0.5)
    stamped = m.outgoing(Message.create(A, [USER, B], "Hi!"))
    assert isinstance(stamped, Message)
    m.receive(ReplyPublished(message.params.id, stamped), 1.0)
    assert phase(m) is Phase.REPLIED
    out = m.receive(StatesSeen(array(message, C, closing="terminal"), B), 1.2)
    assert decisions(out, "conversation_over") and phase(m) is Phase.CLOSED and not m.in_turn
    assert m.outgoing(Message.create(A, [USER], "again")) == ONE_MESSAGE
    out = m.receive(StatesSeen(array(message, C), plan_leaders(message, [A, B, C]).order[0]), 1.3)
    assert decisions(out, "states_ignored")[0].fields["reason"] == "the conversation closed at this message"


def test_the_reply_is_stamped_once_and_recorded() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, A), B), 0.5)
    assert phase(m) is Phase.SPEAKING
    draft = Message.create(A, [USER, B], "Hi!")
    stamped = m.outgoing(draft)
    assert isinstance(stamped, Message)
    meta = stamped.params.metadata or {}
    assert (meta[META_IN_REPLY_TO], meta[META_TURN], meta[META_CLOSING]) == (message.params.id, 1, "none")
    out = m.receive(ReplyPublished(message.params.id, stamped), 1.0)
    assert phase(m) is Phase.REPLIED and decisions(out, "replied")[0].fields["reply_id"] == stamped.params.id
    assert "one message per turn" in str(m.outgoing(draft))
    m.receive(MessageSeen(stamped, A), 1.1)  # its echo moves the thread on
    assert m.turn is None and m.thread.current == stamped.params.id
    assert "moved on" in str(m.outgoing(draft))


def test_replied_before_the_reply_leaves_so_nothing_can_start_a_second_one() -> None:
    """Why the driver feeds ``ReplyPublished`` before the publish, not after it: while the reply
    is on its way out (up to ``publish_timeout``), the leader's late array may give the open slot
    to another companion and this one a later slot. Still SPEAKING, this node would withdraw the
    speech (its publish half done) and start a second ``Speak`` for the same message when its
    new slot opens; REPLIED, nothing of its own turn moves."""
    message = next(
        m
        for m in (Message.create(USER, [A, B, C], f"line {i}", id=f"w-{i}") for i in itertools.count())
        if tuple(plan_leaders(m, [A, B, C]).order) == (B, C, A)
    )
    for replied in (False, True):
        m = machine(A)
        m.receive(MessageSeen(message), 0.0)
        m.receive(StatesSeen(array(message, A), C), T)  # the takeover's array: A speaks first
        assert phase(m) is Phase.SPEAKING
        if replied:
            stamped = m.outgoing(Message.create(A, [USER], "hello"))
            assert isinstance(stamped, Message)
            m.receive(ReplyPublished(message.params.id, stamped), T + 0.1)
        out = m.receive(StatesSeen(array(message, C), B), T + 0.2)  # the leader's, late: C first
        assert decisions(out, "states_switched")
        later = [effect for k in (1, 2, 3) for effect in m.receive(Tick(), T + 0.2 + k * R)]
        withdrawn = [w for w in of(out, Withdraw) if w.what == "speech"]
        if replied:
            assert not withdrawn and not of(later, Speak) and phase(m) is Phase.REPLIED
        else:
            assert withdrawn and [s.message_id for s in of(later, Speak)] == [message.params.id]


def test_a_silent_speaker_is_skipped_after_a_reply_deadline_then_the_turn_goes_unanswered() -> None:
    message = message_led_by(B, [A, B, C])
    states = array(message, C)
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(states, B), 1.0)
    order = m.turn.order if m.turn else ()
    assert order[0] == C and phase(m) is Phase.AWAITING_SPEAKER and m.deadline() == 1.0 + R
    out = m.receive(Tick(), 1.0 + R)
    silent = decisions(out, "speaker_silent")[0]
    assert silent.fields["silent"] == C and silent.fields["speaker"] == order[1]
    if order[1] == A:
        assert phase(m) is Phase.SPEAKING and of(out, Speak)
        m.receive(SpeakingFailed(message.params.id, "no_reply"), 2.0 + R)
    out = m.receive(Tick(), 1.0 + len(order) * R)
    assert decisions(out, "turn_unanswered") and phase(m) is Phase.DONE
    closing_slot = plan_leaders(message, [A, B, C]).rank(A)  # after B, whose array counted
    assert m.deadline() == pytest.approx(1.0 + len(order) * R + (closing_slot or 0) * T)


def test_terminal_or_nobody_ends_the_turn() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    out = m.receive(StatesSeen(array(message, A, closing="terminal"), B), 1.0)
    assert decisions(out, "conversation_over") and phase(m) is Phase.DONE and not of(out, Speak)
    other = machine(A)
    other.receive(MessageSeen(message), 0.0)
    nobody = [State.create(c, "listen", 3, False) for c in (A, B, C)]
    out = other.receive(StatesSeen(nobody, B), 1.0)
    assert decisions(out, "speaker_chosen")[0].fields["reason"] == "nobody" and phase(other) is Phase.DONE


def test_an_earlier_leaders_late_array_replaces_a_takeovers_and_can_reopen_a_done_turn() -> None:
    message = message_led_by(B, [A, B, C])
    order = plan_leaders(message, [A, B, C]).order
    takeover = order[1]
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, None), takeover), T)  # nobody speaks: DONE
    assert phase(m) is Phase.DONE
    out = m.receive(StatesSeen(array(message, A), B), T + 1)  # the leader's, late
    assert decisions(out, "states_switched")[0].fields["replaced_rank"] == 1
    assert phase(m) is Phase.SPEAKING
    # and a switch that gives the open slot to another withdraws the speech in progress
    n = machine(A)
    n.receive(MessageSeen(message), 0.0)
    n.receive(StatesSeen(array(message, A), takeover), T)
    assert phase(n) is Phase.SPEAKING
    out = n.receive(StatesSeen(array(message, C), B), T + 1)
    assert of(out, Withdraw) and decisions(out, "speech_withdrawn") and phase(n) is Phase.AWAITING_SPEAKER


# --- rule: only the same conversation withdraws a reply --------------------------------------


def _speaking(me: str = A, to: Sequence[str] = (A, B, C)) -> tuple[Conversation, Message]:
    message = message_led_by(B, to)
    m = machine(me, known=to)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, me), B), 0.5)
    assert phase(m) is Phase.SPEAKING
    return m, message


def test_chatter_other_conversations_and_strangers_never_withdraw_a_reply() -> None:
    m, message = _speaking()
    noise = [
        Message.create("user_stranger", [], "unaddressed chatter"),
        Message.create("user_stranger", ["companion_zed"], "to someone else"),
        Message.create(B, ["user_y"], "B talks with another person"),
        Message.create(D, [E], "another group", metadata={META_IN_REPLY_TO: "their-message"}),
        Message.create("user_y", [B], "a reply outside", metadata={META_IN_REPLY_TO: "unknown-id"}),
    ]
    for i, line in enumerate(noise * 20):
        out = m.receive(
            MessageSeen(
                line.model_copy(update={"params": line.params.model_copy(update={"id": f"noise-{i}"})})
            ),
            1.0 + i * 0.02,
        )
        assert not of(out, Withdraw) and not decisions(out, "speech_withdrawn")
    assert phase(m) is Phase.SPEAKING and m.thread.current == message.params.id
    assert m.memory()["voices"].keys() == {USER}  # nothing of it reached the conversation


def test_a_message_addressing_this_companion_or_answering_its_thread_withdraws_it() -> None:
    m, message = _speaking()
    out = m.receive(MessageSeen(reply(C, [USER, B], message)), 1.0)  # answers the turn, not addressed
    assert [w.reason for w in of(out, Withdraw)] == ["another companion replied first"]
    m, _ = _speaking()
    out = m.receive(MessageSeen(Message.create("user_z", [A], "Wait, A!")), 1.0)
    assert [w.reason for w in of(out, Withdraw)] == ["a newer message of the conversation arrived"]
    assert m.turn is not None and m.turn.message.params.from_ == "user_z"


def test_two_groups_hold_separate_conversations_on_one_network() -> None:
    first, second = machine(A, known=(A, B, D, E)), machine(D, known=(A, B, D, E))
    one = message_led_by(B, [A, B], sender="user_1")
    two = message_led_by(E, [D, E], sender="user_2")
    for m in (first, second):
        m.receive(MessageSeen(one), 0.0)
        m.receive(MessageSeen(two), 0.1)
    assert first.thread.current == one.params.id and second.thread.current == two.params.id
    first.receive(StatesSeen(array(one, A), B), 0.5)
    second.receive(StatesSeen(array(two, D), E), 0.5)
    assert phase(first) is Phase.SPEAKING and phase(second) is Phase.SPEAKING
    for m in (first, second):  # each group's replies reach every node
        out = m.receive(MessageSeen(reply(B, ["user_1"], one)), 1.0)
        out += m.receive(MessageSeen(reply(E, ["user_2"], two)), 1.1)
        assert len(of(out, Withdraw)) == 1
    assert first.thread.current != second.thread.current


def test_a_message_answered_elsewhere_before_it_arrived_opens_no_turn() -> None:
    m = machine(A)
    message = message_led_by(A, [A, B])
    m.receive(MessageSeen(reply(B, [USER], message)), 0.0)  # its reply first, not addressed to A
    out = m.receive(MessageSeen(message), 0.1)
    assert decisions(out, "message_stale")[0].fields["placement"] == "overtaken"
    assert m.turn is None and not of(out, Lead)


# --- rule: only a due leader's array counts ------------------------------------------------------


def test_the_companion_whose_line_was_the_last_records_the_end_too() -> None:
    """A's reply opens no turn on A (its own line), so A took in no array for it, and when the
    leader of A's line ended the conversation there, every companion recorded the end but A.
    Now A does, once, and only from a leader of its line, only for an array that ends it."""
    opening = Message.create(USER, [A, B, C], "hi")
    meta: dict[str, Any] = {META_IN_REPLY_TO: opening.params.id, META_TURN: 1, META_CLOSING: "none"}
    line = message_led_by(B, [USER, B, C], sender=A, **meta)
    m = machine(A)
    m.receive(MessageSeen(opening), 0.0)
    m.receive(MessageSeen(line), 1.0)
    assert not decisions(m.receive(StatesSeen(array(line, C), B), 1.1), "conversation_over")  # it goes on
    forged = m.receive(StatesSeen(array(line, None, closing="terminal"), "companion_mallory"), 1.2)
    assert not decisions(forged, "conversation_over")
    [over] = decisions(
        m.receive(StatesSeen(array(line, None, closing="terminal"), B), 1.3), "conversation_over"
    )
    assert over.fields["message_id"] == line.params.id and over.fields["closing"] == "terminal"
    assert over.fields["source"] == B
    again = m.receive(StatesSeen(array(line, None, closing="terminal"), C), 1.4)
    assert not decisions(again, "conversation_over")  # recorded once


def test_an_array_from_a_non_candidate_is_ignored_whatever_it_says() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A, known=(A, B, C, "companion_mallory"))
    m.receive(MessageSeen(message), 0.0)
    for forged in (array(message, C, closing="terminal"), array(message, C), array(message, None)):
        for publisher in ("companion_mallory", None, "12D3KooWpeer"):
            out = m.receive(StatesSeen(forged, publisher), 0.1)
            assert decisions(out, "states_ignored")[0].fields["reason"] == "not_a_leader"
    assert m.turn is not None and m.turn.states is None and phase(m) is Phase.AWAITING_STATES
    assert not decisions(m.receive(Tick(), 1.0), "conversation_over")


def test_a_later_candidate_waits_for_its_slot_and_loses_to_the_leader() -> None:
    message = message_led_by(B, [A, B, C])
    order = plan_leaders(message, [A, B, C]).order
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    early = array(message, order[2], closing="terminal")
    out = m.receive(StatesSeen(early, order[2]), 0.2)  # rank 2, far too soon
    assert decisions(out, "states_deferred")[0].fields["reason"] == "slot_not_due"
    assert m.deadline() == pytest.approx(min(T if order[1] == A else 2 * T, (2 - SLOT_GRACE) * T))
    out = m.receive(StatesSeen(array(message, C), B), 1.0)  # the leader's
    assert decisions(out, "speaker_chosen")[0].fields["reason"] != "terminal"
    assert not m.turn or not m.turn.pending
    # without the leader's, the deferred array counts once its slot has come
    n = machine(order[1] if order[1] != A else order[2])
    n.receive(MessageSeen(message), 0.0)
    rank1 = array(message, C)
    n.receive(StatesSeen(rank1, order[1]), 0.5)
    out = n.receive(Tick(), (1 - SLOT_GRACE) * T)
    assert decisions(out, "speaker_chosen") and n.turn is not None and n.turn.priority == 1


def test_an_array_that_overtook_its_message_still_follows_the_rules() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    assert decisions(m.receive(StatesSeen(array(message, A), "companion_mallory"), 0.0), "states_ignored")
    assert decisions(m.receive(StatesSeen(array(message, C), B), 0.0), "states_ignored")[0].fields["held"]
    out = m.receive(MessageSeen(message), 0.1)
    assert decisions(out, "speaker_chosen")[0].fields["speaker"] == C  # the leader's, not the forger's


def test_an_untagged_array_must_speak_for_every_addressee_present() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    partial = array(message, A, tagged=False, addressed=[A, B])
    assert decisions(m.receive(StatesSeen(partial, B), 0.1), "states_ignored")
    full = array(message, A, tagged=False)
    assert decisions(m.receive(StatesSeen(full, B), 0.2), "speaker_chosen")


# --- rule: known companions lead; unknown ids never delay a turn ---------------------------------


def test_ghost_addressees_never_delay_the_turn() -> None:
    ghosts = [f"companion_ghost{i}" for i in range(1000)]
    to = [*ghosts[:500], B, *ghosts[500:], A]
    message = Message.create(USER, to, "Hello, thousand ghosts!")
    machines = {cid: machine(cid, known=(A, B)) for cid in (A, B)}
    outs = {cid: m.receive(MessageSeen(message), 0.0) for cid, m in machines.items()}
    leaders = {cid for cid, out in outs.items() if of(out, Lead)}
    assert len(leaders) == 1  # one of the two real companions leads at once
    [lead] = of(outs[leaders.pop()], Lead)
    assert lead.addressed == (B, A)
    for out in outs.values():
        chosen = decisions(out, "leader_chosen")[0]
        assert chosen.fields["unknown_addressees"] == 1000 and set(chosen.fields["order"]) == {A, B}


def test_at_most_64_candidates_and_the_cap_is_logged() -> None:
    many = [f"companion_{i:03d}" for i in range(100)]
    m = machine(many[0], known=many)
    out = m.receive(MessageSeen(Message.create(USER, many, "everyone!")), 0.0)
    capped = decisions(out, "addressees_capped")[0]
    assert (
        capped.fields["dropped"] == 100 - MAX_CANDIDATES and capped.fields["reason"] == "too_many_addressees"
    )
    assert m.turn is not None and len(m.turn.plan.order) == MAX_CANDIDATES


def test_a_companion_once_present_stays_known() -> None:
    message = message_led_by(B, [A, B])
    m = machine(A, known=(A,), present=(A, B))
    m.receive(CompanionLeft(B), 0.0)
    m.receive(MessageSeen(message), 0.0)
    assert m.turn is not None and m.turn.plan.leader == B  # gone, but known: the plan is the same
    restarted = Conversation(A, takeover_after=T, reply_timeout=R, known=[A, B])  # from the store
    restarted.receive(MessageSeen(message), 0.0)
    assert restarted.turn is not None and restarted.turn.plan.order == m.turn.plan.order


# --- rule: a failing speaker yields at once ------------------------------------------------------


def _chosen(message: Message, speaker: str, *others: str) -> dict[str, Conversation]:
    group = {cid: machine(cid) for cid in (speaker, *others)}
    for m in group.values():
        m.receive(MessageSeen(message), 0.0)
        m.receive(StatesSeen(array(message, speaker), B), 1.0)
    return group


def test_a_failing_speaker_yields_and_every_node_moves_on_at_once() -> None:
    message = message_led_by(B, [A, B, C])
    group = _chosen(message, A, B, C)
    turn = group[A].turn
    order = turn.order if turn else ()
    out = group[A].receive(SpeakingFailed(message.params.id, "model_error", "provider down"), 3.0)
    [failed] = decisions(out, "speaker_failed")
    assert (
        failed.fields["reason"] == "model_error"
        and failed.fields["next"] == order[1]
        and failed.fields["why"]
    )
    [signal] = of(out, PublishSignal)
    assert signal.name == YIELD_SIGNAL
    assert dict(signal.params) == {
        "in_reply_to": message.params.id,
        "reason": "model_error",
        "detail": "provider down",  # the reason in words, for the people watching
    }
    assert phase(group[A]) is Phase.AWAITING_SPEAKER and not of(out, Speak)
    action = Action.create(A, signal.name, dict(signal.params))
    parsed = read_signal(action)
    assert isinstance(parsed, YieldSeen) and parsed.detail == "provider down"
    nxt = group[order[1]]
    out = nxt.receive(YieldSeen(parsed.in_reply_to, parsed.companion, parsed.reason, A), 3.05)
    assert decisions(out, "speaker_yielded") and of(out, Speak)  # at once, not after the deadline
    third = group[order[2]]
    third.receive(YieldSeen(parsed.in_reply_to, A, parsed.reason, A), 3.05)
    assert third.deadline() == pytest.approx(3.05 + R)


def test_a_yield_counts_only_from_the_companion_whose_slot_it_is() -> None:
    message = message_led_by(B, [A, B, C])
    group = _chosen(message, C, A)
    m = group[A]
    mid = message.params.id
    cases = [
        (YieldSeen(mid, C, "timeout", "companion_mallory"), "signed by another companion"),
        (YieldSeen(mid, C, "timeout", None), "signed by another companion"),
        (YieldSeen(mid, "companion_zed", "timeout", "companion_zed"), "not in the speaking order"),
    ]
    for event, reason in cases:
        out = m.receive(event, 2.0)
        assert decisions(out, "yield_ignored")[0].fields["reason"] == reason and not of(out, Speak)
    assert m.turn is not None and m.turn.slot == 0 and not m.turn.yielded
    out = m.receive(YieldSeen(message.params.id, C, "timeout", C), 2.5)
    assert decisions(out, "speaker_yielded") and of(out, Speak)  # C's own: A goes at once


def test_a_yield_that_overtook_the_array_or_the_message_still_counts() -> None:
    message = message_led_by(B, [A, B, C])
    early = machine(A)
    held = early.receive(YieldSeen(message.params.id, C, "model_error", C), 0.0)  # before the message
    assert decisions(held, "yield_held")
    early.receive(MessageSeen(message), 0.1)
    out = early.receive(StatesSeen(array(message, C), B), 0.2)
    assert of(out, Speak)  # C gave up before the array said it should speak: A goes at once
    before_array = machine(A)
    before_array.receive(MessageSeen(message), 0.0)
    assert decisions(
        before_array.receive(YieldSeen(message.params.id, C, "timeout", C), 0.1), "speaker_yielded"
    )
    assert of(before_array.receive(StatesSeen(array(message, C), B), 0.2), Speak)
    stale = machine(A)
    stale.receive(MessageSeen(message), 0.0)
    stale.receive(MessageSeen(Message.create(USER, [A], "newer")), 0.1)
    out = stale.receive(YieldSeen(message.params.id, C, "timeout", C), 0.2)
    assert decisions(out, "yield_ignored")[0].fields["reason"] == "not the current turn"


def test_a_yield_for_a_later_slot_skips_it_when_it_opens() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(B)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, C), B), 1.0)
    assert m.turn is not None
    order = m.turn.order
    later_one = order[1]
    m.receive(YieldSeen(message.params.id, later_one, "timeout", later_one), 2.0)  # before its slot
    out = m.receive(Tick(), 1.0 + R)  # C stayed silent: the next open slot is the third's
    assert m.turn.slot == 2 and (of(out, Speak) if order[2] == B else True)


def test_a_thinking_speaker_keeps_its_slot_open_on_every_node() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, C), B), 1.0)  # this node accepted the array early
    assert m.turn is not None and m.turn.order[0] == C and m.deadline() == 1.0 + R
    m.receive(ThinkingSeen(message.params.id, C, C), 5.0)  # C accepted it 4 s later, and began
    assert m.deadline() == 5.0 + R  # C's slot lasts a reply deadline from its start
    out = m.receive(Tick(), 1.0 + R)
    assert not of(out, Speak) and m.turn.slot == 0
    forged = m.receive(ThinkingSeen(message.params.id, C, "companion_mallory"), 6.0)
    assert forged == [] and m.deadline() == 5.0 + R


def test_an_earlier_candidate_still_preparing_gives_way_to_a_later_one_already_thinking() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, A), B), 5.0)  # late: the others' A-slot is nearly over
    assert phase(m) is Phase.SPEAKING and m.turn is not None
    later_one = m.turn.order[1]
    out = m.receive(ThinkingSeen(message.params.id, later_one, later_one), 6.0)
    assert of(out, Withdraw) and phase(m) is Phase.AWAITING_SPEAKER and m.turn.slot == 1
    deadline = m.deadline()
    assert deadline is not None and deadline >= 6.0 + R  # its slot lasts at least a deadline from now


def test_the_ordering_of_a_slot_ending_while_speaking_is_safe() -> None:
    m, _ = _speaking()
    out = m.receive(Tick(), 0.5 + R)  # the speaking deadline should have ended it; here it did not
    assert of(out, Withdraw) and phase(m) in (Phase.AWAITING_SPEAKER, Phase.DONE)


# --- rule: the closing stage and the count follow the thread -----------------------------------


def test_an_aikyo_leaders_plain_states_never_move_the_stage_back() -> None:
    m = machine(A)
    opening = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(opening), 0.0)
    pre = reply(B, [USER, A], opening, turn=1, closing="pre-closing")
    m.receive(MessageSeen(pre), 1.0)
    plain = [State.create(A, "speak", 7, True, "none")]
    out = m.receive(StatesSeen(plain, A), 2.0)  # aikyo's leader A: no tag, closing none
    [chosen] = decisions(out, "speaker_chosen")
    assert chosen.fields["closing"] == "closing" and "closing raised to closing" in chosen.fields["why"]
    [speak] = of(out, Speak)
    assert speak.closing == "closing" and speak.turn == 2


def test_max_turns_holds_from_the_companion_replies_in_the_thread_whoever_leads() -> None:
    m = machine(A, max_turns=3)
    previous = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(previous), 0.0)
    for n in range(3):  # aikyo replies: no turn, no closing in their metadata
        line = Message.create(
            B if n % 2 == 0 else A, [A, B], f"plain {n}", metadata={META_IN_REPLY_TO: previous.params.id}
        )
        m.receive(MessageSeen(line), 1.0 + n)
        previous = line
    assert m.replies == 3
    last = Message.create(B, [A], "plain 3", metadata={META_IN_REPLY_TO: previous.params.id})
    m.receive(MessageSeen(last), 5.0)
    plain = [State.create(A, "speak", 9, True, "none")]
    out = m.receive(StatesSeen(plain, A), 6.0)
    assert not of(out, Speak) and not decisions(out, "conversation_over")  # over here, not on the wire
    [closing] = of(out, PublishStates)  # A gave its only slot up: the turn is unanswered, A closes it
    assert {s.params.closing for s in closing.states} == {"terminal"}
    assert decisions(m.receive(StatesSeen(closing.states, A), 6.1), "conversation_over")


def test_a_stamped_count_cannot_hold_the_conversation_open() -> None:
    m = machine(A, max_turns=2)
    previous = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(previous), 0.0)
    for n in range(3):
        line = reply(B, [A], previous, turn=0)  # a buggy or hostile peer says turn 0 every time
        m.receive(MessageSeen(line), 1.0 + n)
        previous = line
    assert m.replies == 3


def test_a_node_whose_floor_ends_the_conversation_yields_its_slot() -> None:
    m = machine(A, max_turns=1)
    opening = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(opening), 0.0)
    first = reply(B, [A], opening, turn=1, closing="closing")
    m.receive(MessageSeen(first), 1.0)
    out = m.receive(StatesSeen([State.create(A, "speak", 9, True, "none")], A), 2.0)
    assert [s.params["reason"] for s in of(out, PublishSignal)] == ["terminal"]


def _lead_floor(m: Conversation, message: Message, now: float) -> ClosingStage:
    [lead] = of(m.receive(MessageSeen(message), now), Lead)
    floor: ClosingStage = lead.floor
    return floor


def test_a_goodbye_begins_closing_once_the_conversation_has_had_its_first_replies() -> None:
    """SmolLM2's companions said "Good night, all!" at the fifth reply and talked on for six more
    (measured). A goodbye now begins closing: a person's at once, a companion's from the replies
    on which a leader's model may begin closing too (before, a small model's goodbye is as random
    as its proposal)."""
    goodbye = "That's me shutting a rare book. Good night, all!"
    user_says = machine(A)
    assert (
        _lead_floor(user_says, message_led_by(A, [A, B, C], text="Good night, everyone!"), 0.0)
        == "pre-closing"
    )

    for replies, floor in ((2, "none"), (DEFAULT_MIN_REPLIES, "pre-closing")):
        m = machine(A)
        previous = Message.create(USER, [A, B, C], "hi")
        m.receive(MessageSeen(previous), 0.0)
        for n in range(1, replies):
            previous = reply((B, C)[n % 2], [A, B, C], previous, turn=n)
            m.receive(MessageSeen(previous), float(n))
        meta: dict[str, Any] = {
            META_IN_REPLY_TO: previous.params.id,
            META_TURN: replies,
            META_CLOSING: "none",
        }
        said = message_led_by(A, [A, C], sender=B, text=goodbye, **meta)
        assert _lead_floor(m, said, 10.0) == floor, replies
    # the same line, asked back as a question, is no goodbye
    m = machine(A)
    assert _lead_floor(m, message_led_by(A, [A, B], text="Good night already, Ostra?"), 0.0) == "none"


def test_a_leader_at_its_own_limit_lets_the_others_close_the_conversation() -> None:
    """Five SmolLM2 companions, mixed limits: the one with the lowest led at its limit while the
    leaders before it had kept the thread open, and its ``terminal`` array cut the talk off with
    no closing line. Now its array begins closing (``pre-closing``); it listens (its own floor
    ends its part) and another companion speaks, even when its model chose itself."""
    m = machine(A, max_turns=2)
    opening = Message.create(USER, [A, B, C], "hi")
    m.receive(MessageSeen(opening), 0.0)
    first = reply(B, [A, C], opening, turn=1)
    m.receive(MessageSeen(first), 1.0)
    meta: dict[str, Any] = {META_IN_REPLY_TO: first.params.id, META_TURN: 2, META_CLOSING: "none"}
    message = message_led_by(A, [A, C], sender=B, **meta)
    out = m.receive(MessageSeen(message), 2.0)
    [lead] = of(out, Lead)
    assert lead.floor == "pre-closing"
    chose = [StateDecision(A, "speak", 9.0, True), StateDecision(C, "listen", 2.0, False)]
    out = m.receive(StatesReady(message.params.id, chose, "model"), 2.5)
    [published] = of(out, PublishStates)
    assert {s.params.closing for s in published.states} == {"pre-closing"}
    assert [(s.params.from_, s.params.state) for s in published.states] == [(A, "listen"), (C, "speak")]
    [log] = decisions(out, "states_published")
    assert log.fields["floor_reason"] == "turn_limit" and "past its own turn limit" in str(log.fields)
    out = m.receive(StatesSeen(published.states, A), 2.6)
    assert not of(out, Speak) and not decisions(out, "conversation_over")


def test_a_leader_at_its_own_limit_ends_a_conversation_with_aikyo_companions_in_it() -> None:
    """aikyo's companions know no limit: the one reply more could be theirs, past every limit
    (the mixed network's conversations ran past the highest cap, measured), so the floor stands."""
    m = machine(A, max_turns=2)
    opening = Message.create(USER, [A, B, C], "hi")
    m.receive(MessageSeen(opening), 0.0)
    m.receive(StatesSeen(array(opening, B, tagged=False), C), 0.5)  # C's array, untagged: aikyo's
    first = reply(B, [A, C], opening, turn=1)
    m.receive(MessageSeen(first), 1.0)
    assert m.slotless(C)
    meta: dict[str, Any] = {META_IN_REPLY_TO: first.params.id, META_TURN: 2, META_CLOSING: "none"}
    out = m.receive(MessageSeen(message_led_by(A, [A, C], sender=B, **meta)), 2.0)
    [published] = of(out, PublishStates)
    assert not of(out, Lead) and {s.params.closing for s in published.states} == {"terminal"}


def test_a_leader_at_its_limit_with_nobody_else_to_close_ends_the_conversation() -> None:
    m = machine(A, max_turns=1)
    opening = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(opening), 0.0)
    first = reply(A, [B], opening, turn=1)
    m.receive(MessageSeen(first), 1.0)
    out = m.receive(MessageSeen(reply(B, [A], first, turn=2)), 2.0)  # A alone addressed
    [published] = of(out, PublishStates)
    assert not of(out, Lead) and {s.params.closing for s in published.states} == {"terminal"}


# --- rule: a turn nobody answers ends the conversation, visibly, for everyone --------------------


class _Net:
    """A few machines and a bystander that hear every array and signal any of them publishes, at
    once and in order, the publisher included (the echo rule). Bounded: a loop of publications
    would fail the test, not hang it."""

    def __init__(self, message: Message, *, max_turns: dict[str, int] | None = None) -> None:
        ids = [c for c in message.params.to if c.startswith("companion_")]
        limits = max_turns or {}
        self.nodes = {cid: machine(cid, known=ids, max_turns=limits.get(cid)) for cid in ids}
        self.bystander = machine(None, known=ids)
        self.dead: set[str] = set()
        self.log: dict[str | None, list[Effect]] = {cid: [] for cid in [*ids, None]}
        self.arrays: list[tuple[str, list[State]]] = []

    def machines(self) -> list[tuple[str | None, Conversation]]:
        alive = [(cid, m) for cid, m in self.nodes.items() if cid not in self.dead]
        return [*alive, (None, self.bystander)]

    def all(self, event: Any, now: float) -> None:
        for cid, m in self.machines():
            self._deliver(cid, m.receive(event, now), now)

    def one(self, cid: str, event: Any, now: float) -> list[Effect]:
        out = self.nodes[cid].receive(event, now)
        self._deliver(cid, out, now)
        return out

    def _deliver(self, cid: str | None, out: list[Effect], now: float) -> None:
        self.log[cid].extend(out)
        if cid is None or cid in self.dead:
            return
        for effect in out:
            if isinstance(effect, PublishStates):
                self.arrays.append((cid, effect.states))
                assert len(self.arrays) < 20
                self.all(StatesSeen(effect.states, cid), now)
            elif isinstance(effect, PublishSignal):
                signal = read_signal(Action.create(cid, effect.name, dict(effect.params)))
                assert signal is not None
                if isinstance(signal, YieldSeen):
                    self.all(YieldSeen(signal.in_reply_to, cid, signal.reason, cid, signal.detail), now)
                else:
                    self.all(ThinkingSeen(signal.in_reply_to, cid, cid), now)


def test_a_turn_whose_every_speaker_failed_ends_the_conversation_on_every_node() -> None:
    """Seeds 166 and 999 of the fault suite: the speakers the array chose gave their slots up
    one after the other (their models failed), so nobody would ever speak again. The leader ends
    the conversation visibly: a ``terminal`` array for the message, which every node and the
    bystander accept, with the reason in the decision log."""
    message = message_led_by(B, [A, B, C])
    net = _Net(message)
    net.all(MessageSeen(message), 0.0)
    net.all(StatesSeen(array(message, A), B), 1.0)
    turn = net.nodes[A].turn
    order = turn.order if turn else ()
    assert len(order) == 3 and not net.arrays
    for k, speaker in enumerate(order):
        assert phase(net.nodes[speaker]) is Phase.SPEAKING
        net.one(speaker, SpeakingFailed(message.params.id, "model_error", "provider down"), 2.0 + k)
    [(closer, closing)] = net.arrays
    assert closer == B and {s.params.closing for s in closing} == {"terminal"}  # the leader, at once
    assert ends_conversation(closing)  # as the leader's last array: clients and aikyo see the end
    assert [s.params.from_ for s in closing if s.params.state == "speak"] == [B]
    [unanswered] = decisions(net.log[B], "turn_unanswered")
    assert unanswered.fields["gave_up"] == {cid: "model_error" for cid in order}
    [published] = [d for d in decisions(net.log[B], "states_published") if d.fields["stage"] == "terminal"]
    assert published.fields["source"] == "unanswered" and published.fields["why"]
    for cid, m in net.machines():
        [over] = decisions(net.log[cid], "conversation_over")
        assert over.fields["reason"] == "unanswered", cid
        assert phase(m) is Phase.CLOSED and m.deadline() is None
    ended = [d for d in decisions(net.log[None], "speaker_chosen") if d.fields["reason"] == "terminal"]
    assert len(ended) == 1 and ended[0].fields["source"] == B  # the transcript's "end" line


def test_a_node_whose_floor_ended_the_conversation_still_closes_a_turn_left_silent() -> None:
    """Seeds 638 and 994: A's own turn limit ends the conversation, B's does not (cards differ).
    The array chose A, which gives its slot up (``terminal``); B speaks and dies mid-reply. A
    must not drop out of the turn: it follows the slots like everyone, and when B's slot passes
    it closes the conversation in its own closing slot (one leader slot after the leader's,
    which is B's and stays empty)."""
    opening = Message.create(USER, [A, B, C], "hi")
    message = message_led_by(
        B,
        [A, B],
        sender=C,
        **dict[str, Any]({META_IN_REPLY_TO: opening.params.id, META_TURN: 1, META_CLOSING: "none"}),
    )
    net = _Net(message, max_turns={A: 1})
    net.all(MessageSeen(opening), 0.0)
    net.all(MessageSeen(message), 0.5)
    net.all(StatesSeen(array(message, A), B), 1.0)  # B led; A first, then B
    assert [p.params["reason"] for p in of(net.log[A], PublishSignal)] == ["terminal"]
    assert not decisions(net.log[A], "conversation_over")  # not over for the others: not over here
    assert phase(net.nodes[B]) is Phase.SPEAKING
    net.dead.add(B)  # killed while preparing its reply: no reply, no yield
    a = net.nodes[A]
    deadline = a.deadline()
    assert deadline is not None
    net.all(Tick(), deadline)  # B's slot passes on A: every slot has gone unanswered
    [unanswered] = decisions(net.log[A], "turn_unanswered")
    assert unanswered.fields["gave_up"] == {A: "terminal", B: "silent"} and not net.arrays
    assert a.deadline() == pytest.approx(deadline + T)  # A ranks one after B, whose array counted
    net.all(Tick(), deadline + T)
    [(closer, closing)] = net.arrays
    assert closer == A and {s.params.closing for s in closing} == {"terminal"}
    assert decisions(net.log[A], "conversation_over") and decisions(net.log[None], "conversation_over")
    assert a.deadline() is None and net.bystander.deadline() is None


def test_a_closing_array_counts_only_from_a_candidate_and_only_once_the_turn_is_over_here() -> None:
    """The closing array obeys the leader rule: from the leader whose array counted it ends the
    turn at once; from a later candidate it waits until this node saw every slot pass (a speaker
    still preparing is not cut off); from anyone else it never counts. Once closed, a late array
    of an earlier leader cannot reopen the turn."""
    message = message_led_by(B, [A, B, C])
    plan = plan_leaders(message, [A, B, C])
    later_one = C  # ranks after B, whose array counts
    terminal = array(message, C, closing="terminal")
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, C), B), 1.0)  # C speaks first, A stands in
    out = m.receive(StatesSeen(terminal, "companion_mallory"), 2.0)
    assert decisions(out, "states_ignored")[0].fields["reason"] == "not_a_leader"
    out = m.receive(StatesSeen(terminal, later_one), 2.0)
    assert decisions(out, "states_deferred") and not decisions(out, "conversation_over")
    assert phase(m) is Phase.AWAITING_SPEAKER
    out = m.receive(Tick(), 1.0 + R)  # C stayed silent: A's slot
    assert of(out, Speak) and phase(m) is Phase.SPEAKING
    out = m.receive(SpeakingFailed(message.params.id, "timeout"), 2.0 + R)
    assert not decisions(out, "conversation_over")  # B's slot, the last, is still open
    out = m.receive(Tick(), 2.0 + 2 * R)
    assert decisions(out, "turn_unanswered") and decisions(out, "conversation_over")
    assert not of(out, PublishStates)  # the held array closed it: nobody publishes a second one
    assert decisions(m.receive(StatesSeen(array(message, A), plan.order[0]), 3.0 + 2 * R), "states_ignored")
    assert phase(m) is Phase.CLOSED and m.deadline() is None
    now_leader = machine(A)
    now_leader.receive(MessageSeen(message), 0.0)
    now_leader.receive(StatesSeen(array(message, C), B), 1.0)
    out = now_leader.receive(StatesSeen(terminal, B), 2.0)  # the leader whose array counted
    assert decisions(out, "conversation_over") and phase(now_leader) is Phase.CLOSED


# --- bystander, replay, odd strings, signals ----------------------------------------------------


def test_a_bystander_follows_and_reports_but_never_leads_or_speaks() -> None:
    message = message_led_by(A, [A, B, C])
    m = machine(None)
    out = m.receive(MessageSeen(message), 0.0)
    out += m.receive(MessageSeen(Message.create("user_stranger", [], "chatter")), 0.1)
    out += m.receive(StatesSeen(array(message, A), None), 0.2)  # unauthenticated: taken as the leader's
    out += m.receive(Tick(), 100.0)
    assert not of(out, Lead) and not of(out, Speak) and not of(out, PublishSignal)
    assert decisions(out, "speaker_chosen")[0].fields["speaker"] == A
    assert m.thread.current == message.params.id and m.deadline() is None
    forged = machine(None)
    forged.receive(MessageSeen(message), 0.0)
    assert decisions(forged.receive(StatesSeen(array(message, A), "companion_zed"), 0.1), "states_ignored")


def test_a_message_answered_before_a_restart_is_not_answered_again() -> None:
    """The store's replied marks, read back at start: chosen again for the same message, this
    node gives its slot up (``no_reply``) instead of speaking twice, and the next speaker goes."""
    message = message_led_by(B, [A, B, C])
    m = Conversation(A, takeover_after=T, reply_timeout=R, known=(A, B, C), replied=[message.params.id])
    for cid in (A, B, C):
        m.receive(CompanionJoined(cid), 0.0)
    assert m.replied(message.params.id) and not m.replied("another")
    m.receive(MessageSeen(message), 0.0)
    out = m.receive(StatesSeen(array(message, A), B), 1.0)
    assert not of(out, Speak) and phase(m) is Phase.AWAITING_SPEAKER
    [thinking, gave_up] = of(out, PublishSignal)
    assert thinking.name == THINKING_SIGNAL and gave_up.name == YIELD_SIGNAL
    assert dict(gave_up.params)["reason"] == "no_reply"
    [failed] = decisions(out, "speaker_failed")
    assert failed.fields["detail"] == "it replied before a restart" and failed.fields["next"] is not None


def test_replying_is_remembered_and_speaking_to_says_for_what() -> None:
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, A), B), 1.0)
    assert m.speaking_to == message.params.id and not m.replied(message.params.id)
    stamped = m.outgoing(Message.create(A, [USER], "hello"))
    assert isinstance(stamped, Message)
    m.receive(ReplyPublished(message.params.id, stamped), 1.5)
    assert m.speaking_to is None and m.replied(message.params.id)
    assert m.outgoing(Message.create(A, [USER], "again")) == ONE_MESSAGE


def test_replayed_messages_restore_the_thread_and_open_no_turn() -> None:
    m = machine(A)
    opening = Message.create(USER, [A, B], "hi")
    answer = reply(B, [USER, A], opening, turn=1, closing="pre-closing")
    for line in (opening, answer):
        assert not of(m.receive(MessageSeen(line, replayed=True), 0.0), Lead)
    assert m.turn is None and m.thread.current == answer.params.id
    assert (m.replies, m.stage) == (1, "pre-closing")
    assert decisions(m.receive(MessageSeen(opening), 1.0), "message_duplicate")


def test_odd_strings_never_poison_the_machine() -> None:
    odd = "\ud800"
    m = machine(A, known=(A, B, f"companion_{odd}"))
    for i, message in enumerate(
        [
            Message.create(USER + odd, [A, B], f"text {odd}", id=f"id-{odd}"),
            Message.create(
                f"companion_{odd}", [A], odd, id=f"{odd}{odd}", metadata={META_IN_REPLY_TO: f"id-{odd}"}
            ),
            Message.create(B, [A, odd], "", id=odd),
        ]
    ):
        out = m.receive(MessageSeen(message, f"companion_{odd}"), float(i))
        for effect in of(out, Lead):
            m.receive(StatesReady(effect.message_id, None, "model"), float(i) + 0.1)
    out = m.receive(Tick(), 1000.0)
    assert isinstance(out, list)
    assert read_signal(Action.create(A, YIELD_SIGNAL, {"in_reply_to": odd, "reason": odd})) is not None


def test_read_signal_accepts_only_well_formed_signals() -> None:
    good = read_signal(Action.create(A, YIELD_SIGNAL, {"in_reply_to": "m1", "reason": "timeout"}))
    assert good == YieldSeen("m1", A, "timeout")
    assert read_signal(Action.create(A, THINKING_SIGNAL, {"in_reply_to": "m1"})) == ThinkingSeen("m1", A)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("companion.other", {"in_reply_to": "m1"}),
        (THINKING_SIGNAL, {"in_reply_to": ""}),
        (YIELD_SIGNAL, {"in_reply_to": 3, "reason": "timeout"}),
        (YIELD_SIGNAL, {"reason": "timeout"}),
        (YIELD_SIGNAL, {"in_reply_to": "", "reason": "x"}),
    ]
    for name, params in cases:
        assert read_signal(Action.create(A, name, params)) is None


# --- the timer contract ---------------------------------------------------------------------


_IDS = [A, B, C, "companion_mallory", None]


@st.composite
def _events(draw: st.DrawFn) -> list[tuple[float, Any]]:
    base = [Message.create(USER, [A, B, C], "hi", id="m0")]
    out: list[tuple[float, Any]] = []
    now = 0.0
    for i in range(draw(st.integers(1, 25))):
        now += draw(st.sampled_from([0.0, 0.1, 1.0, T * 0.8, T, R, R * 1.5]))
        kind = draw(
            st.sampled_from(["message", "reply", "states", "ready", "failed", "yield", "tick", "leave"])
        )
        target = draw(st.sampled_from(base))
        who = draw(st.sampled_from(_IDS))
        if kind == "message":
            line = Message.create(
                draw(st.sampled_from([USER, B, C])), [A, B, C][: draw(st.integers(0, 3))], "x", id=f"m{i}"
            )
            base.append(line)
            out.append((now, MessageSeen(line, who)))
        elif kind == "reply":
            line = reply(draw(st.sampled_from([A, B, C])), [A, B], target)
            base.append(line)
            out.append((now, MessageSeen(line, line.params.from_)))
        elif kind == "states":
            speaker = draw(st.sampled_from([A, B, C, None]))
            stages: list[ClosingStage] = ["none", "closing", "terminal"]
            closing = draw(st.sampled_from(stages))
            out.append(
                (now, StatesSeen(array(target, speaker, closing=closing, tagged=draw(st.booleans())), who))
            )
        elif kind == "ready":
            out.append((now, StatesReady(target.params.id, None, "model")))
        elif kind == "failed":
            out.append((now, SpeakingFailed(target.params.id, "model_error")))
        elif kind == "yield":
            out.append((now, YieldSeen(target.params.id, who or A, "timeout", who)))
        elif kind == "leave":
            out.append((now, CompanionLeft(draw(st.sampled_from([A, B, C])))))
        else:
            out.append((now, Tick()))
    return out


@settings(max_examples=300, deadline=None)
@given(events=_events(), me=st.sampled_from([A, B, C, None]))
def test_after_any_event_nothing_is_overdue(events: list[tuple[float, Any]], me: str | None) -> None:
    """Whatever arrives in whatever order, the machine never raises, and once it has answered an
    event at ``now`` its next deadline lies in the future: the driver never spins."""
    m = machine(me, max_turns=4)
    for now, event in events:
        m.receive(event, now)
        deadline = m.deadline()
        assert deadline is None or deadline > now
        if m.turn is not None and m.turn.phase is Phase.SPEAKING:
            assert m.turn.order[m.turn.slot] == me


def test_after_terminal_a_companion_message_saying_turn_0_opens_a_new_exchange() -> None:
    """A conversation that reached ``terminal`` stays over for replies (aikyo's carry no count),
    but a companion id that opens a fresh exchange (``turn: 0``, answering nothing) is heard."""
    m = machine(A, max_turns=1)
    opening = Message.create(USER, [A, B], "hi")
    m.receive(MessageSeen(opening), 0.0)
    m.receive(MessageSeen(reply(B, [A], opening, turn=1, closing="terminal")), 1.0)
    assert m.stage == "terminal"
    late = Message.create(D, [A], "an aikyo reply, no count")
    m.receive(MessageSeen(late), 2.0)
    assert m.stage == "terminal"
    fresh = Message.create(D, [A], "are you there?", metadata={META_TURN: 0, META_CLOSING: "none"})
    m.receive(MessageSeen(fresh), 3.0)
    assert (m.replies, m.stage) == (0, "none")


# --- a person's stop ------------------------------------------------------------------------------


def test_a_persons_terminal_closing_stops_the_conversation_on_every_node() -> None:
    """A client's stop button: the person's message carries ``closing: terminal`` (aikyo keeps
    unknown metadata). The leader publishes a terminal array without asking its model, every node
    accepts it and nobody speaks; a reply in preparation is withdrawn. A person's ordinary line
    after it opens a new conversation."""
    opening = message_led_by(A, [A, B, C])
    machines = {cid: machine(cid) for cid in (A, B, C)}
    for m in machines.values():
        m.receive(MessageSeen(opening), 0.0)
    machines[A].receive(StatesReady(opening.params.id, None, "fallback_model_error"), 0.5)
    speaking = array(opening, B)
    out = {cid: m.receive(StatesSeen(speaking, A), 1.0) for cid, m in machines.items()}
    assert of(out[B], Speak)  # B prepares its reply

    stop = message_led_by(C, [A, B, C], **{META_CLOSING: "terminal"})
    out = {cid: m.receive(MessageSeen(stop), 2.0) for cid, m in machines.items()}
    assert of(out[B], Withdraw)  # the reply in preparation is given up
    assert not of(out[C], Lead)  # no model call: the floor decides
    [published] = of(out[C], PublishStates)
    assert {s.params.closing for s in published.states} == {"terminal"}
    for cid, m in machines.items():
        after = m.receive(StatesSeen(published.states, C), 2.5)
        assert not of(after, Speak) and decisions(after, "conversation_over"), cid
        assert m.stage == "terminal"

    again = message_led_by(A, [A, B, C], sender="user_y")
    assert of(machines[A].receive(MessageSeen(again), 3.0), Lead)
    assert machines[A].stage == "none"


def test_only_a_persons_terminal_is_a_stop_its_other_stages_are_ignored() -> None:
    for closing in ("closing", "pre-closing", "none"):
        m = machine(A)
        message = message_led_by(A, [A, B], **{META_CLOSING: closing})
        assert of(m.receive(MessageSeen(message), 0.0), Lead)
        assert m.stage == "none"
