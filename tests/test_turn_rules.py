"""The turn rules of a fair, finite conversation, with plain values and a hand-moved clock: a
named companion and one the exchange owes a turn are preferred, closing moves one stage a turn,
a reply addressed to nobody who can answer closes the conversation, and in a network with aikyo
companions (which only speak as an array's top speaker and know no turn limit) no slot is waited
for in vain and a turn limit holds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from companion.conversation.events import (
    MessageSeen,
    PublishSignal,
    PublishStates,
    Speak,
    SpeakingFailed,
    StatesReady,
    StatesSeen,
    Tick,
    YieldSeen,
)
from companion.conversation.machine import Conversation
from companion.conversation.rules import (
    StateDecision,
    decide_next_speaker,
    ends_conversation,
    finalize_states,
    named_companion,
    owed_companion,
    plan_leaders,
    preferred_speaker,
    quiet_closing,
    states_match,
    turn_tag,
)
from companion.conversation.rules.closing import proposal_ceiling
from companion.conversation.state import ClosingSettings
from companion.conversation.turn import Phase
from companion.protocol import Message, State
from support.conversations import USER, A, B, C, array, decisions, machine, message_led_by, of, reply

J, K = "companion_j", "companion_k"
"""Two companions that behave as aikyo's."""
T, R = 4.0, 12.0


def led_by(leader: str, sender: str, to: Sequence[str], text: str = "a line", **meta: Any) -> Message:
    """A message of ``sender`` to ``to`` (people included) whose aikyo leader is ``leader``."""
    companions = [cid for cid in to if cid.startswith("companion_")]
    for i in itertools.count():
        message = Message.create(sender, list(to), text, metadata=meta or None, id=f"{sender}-{leader}-{i}")
        if plan_leaders(message, companions).leader == leader:
            return message
    raise AssertionError("unreachable")


def selected(states: Sequence[State]) -> list[str]:
    return [s.params.from_ for s in states if s.params.selected]


def lead_fallback(m: Conversation, message: Message, now: float = 0.5) -> list[State]:
    """The array this node publishes for ``message`` when its model fails (rule-based states)."""
    published = of(
        m.receive(StatesReady(message.params.id, None, "fallback_model_error"), now), PublishStates
    )
    assert len(published) == 1
    return list(published[0].states)


# --- named and owed speakers ----------------------------------------------------------------------


def test_a_named_companion_is_found_as_a_word_or_as_written() -> None:
    names = {A: "Dot", B: "Pim", C: "灯子"}
    assert named_companion("Dot, roll the dice!", names, [A, B, C]) == A
    assert named_companion("what do you think, pim?", names, [A, B, C]) == B
    assert named_companion("Pimento and dots", names, [A, B, C]) is None  # whole words only
    assert named_companion("灯子さん、サイコロを振って", names, [A, B, C]) == C
    assert named_companion("Pim, ask Dot", names, [A, B, C]) == B  # the first named
    assert named_companion("Dot!", names, [B, C]) is None  # not a candidate (the sender, absent)


def test_the_exchange_owes_a_turn_to_the_unheard_and_to_one_two_behind() -> None:
    assert owed_companion({}, {}, [A, B]) is None  # nobody spoke yet: the model decides
    assert owed_companion({A: 1}, {A: 1}, [B, C]) == B  # both unheard: the first addressed
    assert owed_companion({A: 1, B: 1}, {A: 1, B: 2}, [A, C]) == C
    assert owed_companion({A: 2, B: 1, C: 1}, {A: 3, B: 2, C: 1}, [B, C]) is None  # one behind: fair
    assert owed_companion({A: 3, B: 2, C: 1}, {A: 6, B: 5, C: 1}, [B, C]) == C
    # a nomination and a name come first
    pref = preferred_speaker(
        nominated=B, text="Cy?", candidates=[B, C], names={C: "Cy"}, heard={}, last_turn={}
    )
    assert pref is not None and (pref.companion_id, pref.reason) == (B, "nominated")
    pref = preferred_speaker(
        nominated=None, text="Cy?", candidates=[B, C], names={C: "Cy"}, heard={A: 1}, last_turn={A: 1}
    )
    assert pref is not None and (pref.companion_id, pref.reason) == (C, "named")


def test_the_leader_selects_the_companion_the_message_names() -> None:
    m = machine(A)
    m.names = {A: "Ada", B: "Bo", C: "Cy"}
    message = led_by(A, USER, [A, B, C], "Bo, roll the dice!")
    out = m.receive(MessageSeen(message, USER), 0.0)
    assert decisions(out, "speaker_preferred")[0].fields["reason"] == "named"
    assert selected(lead_fallback(m, message)) == [B]


def test_a_companion_silent_while_others_spoke_is_selected_by_the_leader() -> None:
    """A, B, C addressed; B and A answer each other: the leader gives C the next turn."""
    m = machine(A)
    opening = Message.create(USER, [A, B, C], "hello", id="open")
    m.receive(MessageSeen(opening, USER), 0.0)
    first = reply(B, [USER, A, C], opening)
    m.receive(MessageSeen(first, B), 1.0)
    second = reply(A, [USER, B, C], first, turn=2)
    m.receive(MessageSeen(second, A), 2.0)
    third = led_by(A, B, [USER, A, C], in_reply_to=second.params.id, turn=3, closing="none")
    out = m.receive(MessageSeen(third, B), 3.0)
    assert decisions(out, "speaker_preferred")[0].fields["reason"] == "owed"
    assert selected(lead_fallback(m, third, 3.5)) == [C]


# --- closing, one stage a turn --------------------------------------------------------------------


def test_a_model_may_begin_closing_but_never_skip_a_stage() -> None:
    ceilings = {s: proposal_ceiling(s) for s in ("none", "pre-closing", "closing", "terminal")}
    assert ceilings == {
        "none": "pre-closing",
        "pre-closing": "pre-closing",
        "closing": "closing",
        "terminal": "terminal",
    }
    m = machine(A)
    m.settings = ClosingSettings(min_replies=0)
    opening = Message.create(USER, [A, B], "hello", id="open")
    m.receive(MessageSeen(opening, USER), 0.0)
    # B's pre-closing reply, which A leads: the floor is closing, the eager model says terminal
    closing_reply = led_by(A, B, [USER, A], in_reply_to="open", turn=1, closing="pre-closing")
    m.receive(MessageSeen(closing_reply, B), 1.0)
    assert m.turn is not None and m.turn.phase is Phase.LEADING
    eager = [StateDecision(A, "speak", 9, False, "terminal")]
    published = of(m.receive(StatesReady(closing_reply.params.id, eager, "model"), 1.5), PublishStates)
    assert {s.params.closing for s in published[0].states} == {"closing"}


# --- quiet endings --------------------------------------------------------------------------------


def test_a_reply_to_the_person_alone_closes_the_conversation_visibly() -> None:
    m, bystander = machine(A, known=[A]), machine(None, known=[A])
    opening = Message.create(USER, [A], "Dot, roll the dice!", id="open")
    for node in (m, bystander):
        node.receive(MessageSeen(opening, USER), 0.0)
    states = lead_fallback(m, opening)
    for node in (m, bystander):
        node.receive(StatesSeen(states, A), 0.6)
    assert m.turn is not None and m.turn.phase is Phase.SPEAKING
    answer = reply(A, [USER], opening)
    out = m.receive(MessageSeen(answer, A), 2.0)
    over = decisions(out, "conversation_over")
    assert [d.fields["reason"] for d in over] == ["quiet"]
    closing = of(out, PublishStates)[0].states
    assert quiet_closing(closing, answer) and ends_conversation(closing)
    bystander.receive(MessageSeen(answer, A), 2.0)
    seen = bystander.receive(StatesSeen(closing, A), 2.1)
    assert [d.fields["reason"] for d in decisions(seen, "conversation_over")] == ["quiet"]
    assert decisions(seen, "speaker_chosen")[0].fields["reason"] == "terminal"


def test_only_the_sender_closes_its_own_reply_quietly() -> None:
    bystander = machine(None, known=[A, B])
    answer = Message.create(A, [USER], "bye", metadata={"in_reply_to": "x", "turn": 1}, id="r1")
    bystander.receive(MessageSeen(answer, A), 0.0)
    forged = [State.create(A, "speak", 0.0 + turn_tag(answer) * 1e-8, False, "terminal")]
    assert states_match(forged, answer, [A, B])
    out = bystander.receive(StatesSeen(forged, B), 0.1)  # signed by B
    assert decisions(out, "conversation_over") == []
    # and a reply that addresses a companion present opens a turn: no quiet closing
    m = machine(A)
    m.receive(MessageSeen(Message.create(USER, [A], "hi", id="o"), USER), 0.0)
    out = m.receive(MessageSeen(reply(A, [USER, B], Message.create(USER, [A], "hi", id="o")), A), 1.0)
    assert of(out, PublishStates) == []


# --- aikyo companions in the conversation ---------------------------------------------------------


def aikyo_network(me: str, *, max_turns: int | None = None) -> Conversation:
    """``me`` with two aikyo companions J and K it has seen speak (unstamped messages)."""
    m = machine(me, known=[A, B, J, K], max_turns=max_turns)
    for who in (J, K):
        m.receive(MessageSeen(Message.create(who, [USER], f"{who} says hi", id=f"hi-{who}"), who), 0.0)
    assert m.slotless(J) and m.slotless(K) and not m.slotless(B)
    return m


def test_slots_of_aikyo_companions_are_not_waited_for_after_a_give_up() -> None:
    """J leads and picks A; A's model fails; J and K stand in only on paper: the conversation is
    closed at once, by A (J, the leader whose array counted, never closes one)."""
    m = aikyo_network(A)
    message = message_led_by(J, [A, J, K])
    m.receive(MessageSeen(message, USER), 1.0)
    aikyo_array = array(message, A, tagged=False)
    m.receive(StatesSeen(aikyo_array, J), 1.2)
    assert m.turn is not None and m.turn.order[0] == A and m.turn.phase is Phase.SPEAKING
    out = m.receive(SpeakingFailed(message.params.id, "model_error", "boom"), 3.0)
    assert decisions(out, "slots_skipped")[0].fields["skipped"] == [J, K]
    closing = of(out, PublishStates)
    assert len(closing) == 1 and ends_conversation(closing[0].states)
    assert of(m.receive(Tick(), 3.0 + 5 * R), PublishStates) == []  # exactly once


def test_a_companion_not_seen_yet_keeps_its_slot() -> None:
    m = machine(A, known=[A, J, K])
    message = message_led_by(J, [A, J, K])
    m.receive(MessageSeen(message, USER), 1.0)
    m.receive(StatesSeen(array(message, A, tagged=False), J), 1.2)  # J is aikyo's now, K unknown
    assert m.slotless(J) and not m.slotless(K)
    out = m.receive(SpeakingFailed(message.params.id, "model_error", "boom"), 3.0)
    assert decisions(out, "slots_skipped")[0].fields["skipped"] == [J]
    assert of(out, PublishStates) == []  # K may still answer: its slot is open now
    assert m.turn is not None and m.turn.order[m.turn.slot] == K
    assert decisions(m.receive(Tick(), 3.0 + R - 0.1), "turn_unanswered") == []
    assert decisions(m.receive(Tick(), 3.0 + R), "turn_unanswered")  # K stayed silent its slot


def test_an_aikyo_stand_in_between_ours_is_not_waited_for() -> None:
    """B (ours) is the top speaker, J (aikyo) the first stand-in, A (ours) the second: B gives its
    slot up and A's slot opens at once, not a reply deadline later (aikyo never stands in)."""
    m = aikyo_network(A)
    message = message_led_by(J, [A, B, J])
    m.receive(MessageSeen(message, USER), 1.0)
    chosen = [StateDecision(B, "speak", 9, True), StateDecision(J, "speak", 7, False)]
    chosen.append(StateDecision(A, "speak", 5, False))
    states = finalize_states(chosen, [A, B, J], floor="none", tag=None).states
    m.receive(StatesSeen(states, J), 1.2)
    assert m.turn is not None and m.turn.order == (B, J, A)
    out = m.receive(YieldSeen(message.params.id, B, "model_error", B), 2.0)
    assert decisions(out, "slots_skipped")[0].fields["skipped"] == [J]
    assert len(of(out, Speak)) == 1 and m.turn.phase is Phase.SPEAKING
    # without the give-up, J's slot is still skipped when it opens: A speaks then, not after J's
    m = aikyo_network(A)
    m.receive(MessageSeen(message, USER), 1.0)
    m.receive(StatesSeen(states, J), 1.2)
    assert of(m.receive(Tick(), 1.2 + R - 0.1), Speak) == []
    out = m.receive(Tick(), 1.2 + R)
    assert decisions(out, "slots_skipped")[0].fields["skipped"] == [J] and len(of(out, Speak)) == 1


def test_our_evidence_outweighs_aikyo_like_behaviour() -> None:
    m = aikyo_network(A)
    m.follows_slots(J)  # its tool list arrived
    assert not m.slotless(J)
    m.receive(MessageSeen(Message.create(K, [USER], "k", metadata={"turn": 0}, id="k0"), K), 1.0)
    assert not m.slotless(K)  # our companions stamp what they say
    m.receive(MessageSeen(Message.create(K, [USER], "k", id="k1"), K), 2.0)
    assert not m.slotless(K)  # once ours, always ours


def test_an_aikyo_reply_past_the_cap_gets_the_terminal_array_at_once() -> None:
    """K (aikyo) speaks after A reached its limit; J (aikyo) leads the reply: A, the first of our
    leaders, answers it with terminal at once, and J's later array cannot reopen it."""
    m = aikyo_network(A, max_turns=1)
    past = message_led_by(J, [A, J], sender=K)
    out = m.receive(MessageSeen(past, K), 1.0)
    assert decisions(out, "cap_closing"), decisions(out)
    published = of(out, PublishStates)
    assert len(published) == 1 and ends_conversation(published[0].states)
    seen = m.receive(StatesSeen(published[0].states, A), 1.1)
    assert [d.fields["reason"] for d in decisions(seen, "conversation_over")] == ["terminal"]
    late = m.receive(StatesSeen(array(past, J, tagged=False), J), 1.5)  # J speaks on, as aikyo does
    assert decisions(late, "speaker_chosen") == [] and of(late, PublishSignal) == []
    assert of(late, Speak) == []


def test_the_last_reply_at_the_limit_goes_to_the_people_when_aikyo_companions_listen() -> None:
    """At A's limit, a reply addressed to an aikyo companion would open a turn aikyo may give to
    an aikyo speaker (who knows no limit): it goes to the people only, and closes quietly."""
    m = aikyo_network(A, max_turns=1)
    message = led_by(A, USER, [A, J])
    m.receive(MessageSeen(message, USER), 1.0)
    m.receive(StatesSeen(lead_fallback(m, message, 1.1), A), 1.2)
    assert m.turn is not None and m.turn.phase is Phase.SPEAKING
    stamped = m.outgoing(Message.create(A, [USER, J], "goodbye, both of you"))
    assert isinstance(stamped, Message) and stamped.params.to == [USER]
    out = m.receive(MessageSeen(stamped, A), 2.0)
    assert [d.fields["reason"] for d in decisions(out, "conversation_over")] == ["quiet"]
    # below the limit, or with no aikyo companion addressed, the speaker's addressees stay
    ours = machine(A, max_turns=1)
    ours.receive(MessageSeen(message, USER), 1.0)
    ours.receive(StatesSeen(lead_fallback(ours, message, 1.1), A), 1.2)
    kept = ours.outgoing(Message.create(A, [USER, B], "goodbye"))
    assert isinstance(kept, Message) and kept.params.to == [USER, B]


def test_an_aikyo_companion_still_finishing_its_turn_is_not_chosen_by_our_leader() -> None:
    """J (aikyo) said the message B answers, and B names it: aikyo's agent makes one more model
    call after its speak tool and ignores every array meanwhile, so A, leading, holds J back
    (importance 0, not selected) instead of giving the turn to a companion that cannot take it."""
    m = aikyo_network(A)
    m.names = {A: "Ada", B: "Bo", J: "Jun"}
    said = Message.create(J, [A, B, USER], "a line of J", id="j-said")
    m.receive(MessageSeen(said, J), 1.0)
    meta = {"in_reply_to": said.params.id, "turn": 1, "closing": "none"}
    answer = led_by(A, B, [A, J, USER], "Jun, what a thought!", **meta)
    out = m.receive(MessageSeen(answer, B), 2.0)
    assert all(d.fields["speaker"] != J for d in decisions(out, "speaker_preferred"))
    published = lead_fallback(m, answer, 2.1)
    states = {s.params.from_: s.params for s in published}
    assert states[J].importance < 0.01 and not states[J].selected
    assert decide_next_speaker(published, [A, J]).speaker == A
    # a companion that did not just speak is chosen when named, aikyo's or not
    m = aikyo_network(A)
    m.names = {A: "Ada", J: "Jun"}
    fresh = led_by(A, USER, [A, J], "Jun, what a thought!")
    out = m.receive(MessageSeen(fresh, USER), 2.0)
    assert [d.fields["speaker"] for d in decisions(out, "speaker_preferred")] == [J]
    assert selected(lead_fallback(m, fresh, 2.1)) == [J]


def test_aikyo_candidates_after_the_first_take_no_leader_slot() -> None:
    """J (aikyo) leads and K (aikyo) is next: aikyo never takes over, so A, ranked third, takes
    over after one leader slot, not two, and B, fourth, accepts A's array then."""
    message = next(
        candidate
        for i in itertools.count()
        if plan_leaders(
            candidate := Message.create(USER, [A, B, J, K], "hi", id=f"o-{i}"), [A, B, J, K]
        ).order
        == (J, K, A, B)
    )
    m = aikyo_network(A)
    m.receive(MessageSeen(message, USER), 1.0)
    assert m.deadline() == 1.0 + T
    assert decisions(m.receive(Tick(), 1.0 + T - 0.01), "takeover") == []
    assert decisions(m.receive(Tick(), 1.0 + T), "takeover")
    published = lead_fallback(m, message, 1.0 + T + 0.1)
    b = aikyo_network(B)
    b.receive(MessageSeen(message, USER), 1.0)
    out = b.receive(StatesSeen(published, A), 1.0 + T + 0.2)
    assert decisions(out, "states_deferred") == [] and decisions(out, "speaker_chosen")
    # one of ours before it keeps its slot: B, fourth, leads after A's slot, two slots in all
    ours_between = machine(B, known=[A, B, J, K])
    for who in (J, K):
        hi = Message.create(who, [USER], "hi", id=f"hi-{who}")
        ours_between.receive(MessageSeen(hi, who), 0.0)
    ours_between.receive(MessageSeen(message, USER), 1.0)
    assert ours_between.deadline() == 1.0 + 2 * T  # A's slot, then B's
