"""Pure turn-taking rules: leader and takeover order, next speaker, closing, metadata extensions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from companion.conversation.rules import (
    MAX_CANDIDATES,
    META_CLOSING,
    META_IN_REPLY_TO,
    META_NEXT_SPEAKER,
    META_TURN,
    ConversationThread,
    EarlyStates,
    Placement,
    StateDecision,
    advance,
    bigram_jaccard,
    closing_floor,
    decide_next_speaker,
    fallback_decisions,
    farewell_counts,
    finalize_states,
    later,
    leader_candidates,
    leading_floor,
    plan_leaders,
    repetition_score,
    reply_recipients,
    select_leader,
    speaking_order,
    stamp_reply,
    states_match,
    states_tag,
    turn_info,
    turn_tag,
)
from companion.protocol import (
    COMPANION_ID_PREFIX,
    MESSAGES,
    ClosingStage,
    Message,
    PayloadError,
    State,
    parse_payload,
)

VECTORS = Path(__file__).resolve().parent / "vectors" / "leader.json"
A, B, C, D = "companion_a", "companion_b", "companion_c", "companion_d"


def _state(
    cid: str, state: str = "listen", importance: float = 0, selected: bool = False, closing: str = "none"
) -> State:
    return State.create(cid, state, importance, selected, closing)  # type: ignore[arg-type]


# --- leader ---------------------------------------------------------------------------------


def test_plan_starts_with_aikyo_leader_on_every_vector() -> None:
    vectors: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))
    checked = 0
    for vector in vectors:
        parsed = parse_payload(MESSAGES, vector["raw"].encode("utf-8"))
        if isinstance(parsed, PayloadError):
            continue
        assert isinstance(parsed, Message)
        plan = plan_leaders(parsed, vector["active"])
        assert plan.leader == vector["leader"]
        expected = set(parsed.params.to) & set(vector["active"])
        assert set(plan.order) == expected and len(plan.order) == len(expected)
        if plan.leader is not None:
            assert plan.order[0] == plan.leader and plan.rank(plan.leader) == 0
        checked += 1
    assert checked > 200


def test_takeover_order_wraps_after_the_leader_in_to_order() -> None:
    message = Message.create("user", [A, B, "user_x", C, B, D], "hi")
    plan = plan_leaders(message, [A, B, C, D])
    unique = [A, B, C, D]
    start = unique.index(plan.leader or "")
    assert list(plan.order) == unique[start:] + unique[:start]
    assert plan.rank("user_x") is None
    assert plan.reason == "hash" and plan.leader is not None and plan.leader in plan.why


def test_inactive_addressees_never_lead() -> None:
    message = Message.create("user", [A, B, C], "hi")
    plan = plan_leaders(message, [C])
    assert plan.leader == C and plan.order == (C,)
    none = plan_leaders(message, [D])
    assert none.leader is None and none.order == () and none.reason == "no_active_addressee"
    assert none.rank(A) is None


def test_candidates_are_the_known_companions_addressed_at_most_64() -> None:
    ghosts = [f"companion_ghost{i}" for i in range(1000)]
    message = Message.create("user", [*ghosts[:10], B, "user_x", *ghosts[10:], A, B], "hi")
    found = leader_candidates(message, {A, B, C})
    assert found.ids == (B, A) and found.unknown == 1000 and found.capped == 0
    plan = plan_leaders(message, found.ids)
    assert set(plan.order) == {A, B}  # no ghost takes a slot: the second known ranks 1, not 500
    many = [f"companion_{i:03d}" for i in range(80)]
    capped = leader_candidates(Message.create("user", many, "hi"), set(many))
    assert capped.ids == tuple(many[:MAX_CANDIDATES]) and capped.capped == 80 - MAX_CANDIDATES


# --- next speaker ---------------------------------------------------------------------------


def test_selected_wins_over_a_more_important_speaker() -> None:
    states = [_state(A, "speak", 9), _state(B, "listen", 2, selected=True)]
    decision = decide_next_speaker(states, [A, B])
    assert (decision.speaker, decision.reason) == (B, "selected")
    assert "selected" in decision.why


def test_highest_importance_among_selected() -> None:
    states = [_state(A, "speak", 3, True), _state(B, "speak", 7, True), _state(C, "speak", 10)]
    assert decide_next_speaker(states, [A, B, C]).speaker == B


def test_speakers_by_importance_when_nobody_selected() -> None:
    states = [_state(A, "speak", 3), _state(B, "listen", 10), _state(C, "speak", 6)]
    decision = decide_next_speaker(states, [A, B, C])
    assert (decision.speaker, decision.reason, decision.importance) == (C, "wants_to_speak", 6)


def test_the_reason_says_how_many_were_compared() -> None:
    """One candidate is "the only one": "the highest of 1" was read as a second importance."""
    alone = decide_next_speaker([_state(A, "speak", 2, True), _state(B, "listen", 9)], [A, B])
    assert alone.why == f"{A} is selected with importance 2, the only one"
    two = decide_next_speaker([_state(A, "speak", 3), _state(B, "speak", 7)], [A, B])
    assert two.why == f"{B} wants to speak with importance 7, the highest of 2"


def test_ties_go_to_the_earlier_state() -> None:
    states = [_state(C, "speak", 5), _state(A, "speak", 5), _state(B, "speak", 5)]
    decision = decide_next_speaker(states, [A, B, C])
    assert decision.speaker == C and "tie" in decision.why


def test_inactive_and_excluded_companions_are_skipped() -> None:
    states = [_state(A, "speak", 9), _state(B, "speak", 5), _state(C, "speak", 1)]
    assert decide_next_speaker(states, [B, C]).speaker == B
    decision = decide_next_speaker(states, [A, B, C], exclude={A})
    assert decision.speaker == B and "silent" in decision.why


def test_nobody_when_nobody_qualifies() -> None:
    decision = decide_next_speaker([_state(A), _state(B)], [A, B])
    assert (decision.speaker, decision.reason) == (None, "nobody")
    assert decide_next_speaker([], [A]).speaker is None
    assert decide_next_speaker([_state(A, "speak", 5)], [B]).reason == "nobody"


def test_terminal_winner_ends_the_conversation() -> None:
    states = [_state(A, "speak", 5, closing="terminal"), _state(B, "listen", closing="terminal")]
    decision = decide_next_speaker(states, [A, B])
    assert decision.speaker is None and decision.conversation_over and decision.closing == "terminal"


def _aikyo_reference(states: list[State], active: list[str]) -> str | None:
    """aikyo's decideNextSpeaker: filter, then a stable sort by importance, descending."""
    valid = [s for s in states if s.params.from_ in active]
    for pool in ([s for s in valid if s.params.selected], [s for s in valid if s.params.state == "speak"]):
        if pool:
            best = sorted(pool, key=lambda s: -s.params.importance)[0]
            return None if best.params.closing == "terminal" else best.params.from_
    return None


_ids = st.sampled_from([A, B, C, D])
_one_state = st.builds(
    _state,
    _ids,
    st.sampled_from(["speak", "listen"]),
    st.integers(0, 10),
    st.booleans(),
    st.sampled_from(["none", "pre-closing", "closing", "terminal"]),
)
_states = st.lists(_one_state, max_size=6)


@given(_states, st.lists(_ids, unique=True))
def test_same_speaker_as_aikyo(states: list[State], active: list[str]) -> None:
    assert decide_next_speaker(states, active).speaker == _aikyo_reference(states, active)


# --- states the leader publishes -----------------------------------------------------------


def test_finalize_fills_missing_drops_unknown_and_clamps() -> None:
    decisions = [
        StateDecision(B, "speak", 42.0, False),
        StateDecision(D, "speak", 5.0, True),
        StateDecision(B, "listen", 1.0, False),
        StateDecision(A, "speak", float("nan"), False),
    ]
    outcome = finalize_states(decisions, [A, B, C, A], floor="none")
    assert [s.params.from_ for s in outcome.states] == [A, B, C]
    assert [s.params.importance for s in outcome.states] == [0.0, 10.0, 0.0]
    assert outcome.states[2].params.state == "listen"
    notes = " | ".join(outcome.adjustments)
    assert D in notes and "second state" in notes and "no state for companion_c" in notes


def test_finalize_applies_one_stage_at_least_the_floor() -> None:
    decisions = [StateDecision(A, "speak", 5, False, "none"), StateDecision(B, "listen", 0, False, "closing")]
    outcome = finalize_states(decisions, [A, B], floor="pre-closing")
    assert outcome.stage == "closing"
    assert {s.params.closing for s in outcome.states} == {"closing"}
    outcome = finalize_states([StateDecision(A, "speak", 5, False)], [A], floor="terminal")
    assert outcome.states[0].params.closing == "terminal"


def test_nominee_is_the_only_selected_and_speaks() -> None:
    decisions = [StateDecision(A, "speak", 9, True), StateDecision(B, "listen", 0, False)]
    outcome = finalize_states(decisions, [A, B], floor="none", nominated=B)
    assert [(s.params.from_, s.params.selected, s.params.state) for s in outcome.states] == [
        (A, False, "speak"),
        (B, True, "speak"),
    ]
    assert decide_next_speaker(outcome.states, [A, B]).speaker == B
    ignored = finalize_states(decisions, [A, B], floor="none", nominated=D)
    assert ignored.states[0].params.selected and any(
        "ignored the nomination" in n for n in ignored.adjustments
    )


def test_fallback_picks_the_nominee_or_the_first_addressee() -> None:
    plain = finalize_states(fallback_decisions([B, A, B]), [B, A], floor="none")
    assert decide_next_speaker(plain.states, [A, B]).speaker == B
    nominated = finalize_states(fallback_decisions([B, A], nominated=A), [B, A], floor="none")
    assert decide_next_speaker(nominated.states, [A, B]).speaker == A


def test_states_match_ties_arrays_to_their_message() -> None:
    first = Message.create("user", [A, B, C], "hi")
    reply = Message.create(B, ["user", A, C], "hello")
    interjection = Message.create("user", [A, B, C], "wait!")
    array_for_first = [_state(A), _state(B, "speak", 5), _state(C)]
    array_for_reply = [_state(A), _state(C, "speak", 4)]
    active = [A, B, C]
    assert states_match(array_for_first, first, active)
    assert not states_match(array_for_first, reply, active)  # the reply's sender is in it: a late array
    assert states_match(array_for_reply, reply, active)
    assert not states_match(array_for_reply, interjection, active)  # B is addressed but has no state
    assert states_match(array_for_reply, interjection, [A, C])  # ...unless B is not active here
    assert not states_match([], first, active)
    assert not states_match([_state(D)], first, active)
    aikyo_style = [_state("user"), _state(A), _state(C)]  # JavaScript leaders cover every `to` entry
    assert states_match(aikyo_style, reply, active)


# --- closing ------------------------------------------------------------------------------


def test_stage_order() -> None:
    assert [advance(s) for s in ("none", "pre-closing", "closing", "terminal")] == [
        "pre-closing",
        "closing",
        "terminal",
        "terminal",
    ]
    assert later("closing", "pre-closing") == "closing" and later("none", "terminal") == "terminal"


def test_bigram_jaccard_normalises() -> None:
    assert bigram_jaccard("ＡＢＣ　ｄｅ", "abc de") == 1.0
    assert bigram_jaccard("ｶﾞｷﾞ", "ガギ") == 1.0
    assert bigram_jaccard("hello there", "goodbye now") < 0.2
    assert bigram_jaccard("", "") == 1.0 and bigram_jaccard("a", "") == 0.0


def test_repetition_score_needs_five_and_detects_loops() -> None:
    assert repetition_score(["a b", "c d", "e f", "g h"]) is None
    same = ["今日はいい天気ですね。"] * 5
    assert repetition_score(same) == 1.0
    varied = ["I love the sea.", "Mountains are great", "What about lunch?", "Jazz is my thing", "Rain again"]
    score = repetition_score(["ignored older line", *varied])
    assert score is not None and score < 0.2


def test_closing_floor_open_by_default() -> None:
    decision = closing_floor(previous="none", turn=3, utterances=["a", "b"])
    assert (decision.stage, decision.reason, decision.repetition) == ("none", "open", None)


def test_closing_continues_once_begun() -> None:
    stages = []
    previous = "pre-closing"
    for turn in range(3):
        decision = closing_floor(previous=previous, turn=turn, utterances=[])  # type: ignore[arg-type]
        stages.append(decision.stage)
        assert decision.reason == "continues"
        previous = decision.stage
    assert stages == ["closing", "terminal", "terminal"]


def test_turn_limit_closes_gracefully() -> None:
    stages = [closing_floor(previous="none", turn=t, utterances=[], max_turns=4).stage for t in range(6)]
    assert stages == ["none", "none", "pre-closing", "closing", "terminal", "terminal"]
    assert closing_floor(previous="none", turn=0, utterances=[], max_turns=1).stage == "closing"
    assert closing_floor(previous="none", turn=4, utterances=[], max_turns=4).reason == "turn_limit"


def test_a_goodbye_begins_closing_and_closing_then_runs_its_course() -> None:
    said = closing_floor(previous="none", turn=5, utterances=[], farewell=True)
    assert (said.stage, said.reason) == ("pre-closing", "farewell")
    # a goodbye never holds back a stage already reached, nor the turn limit
    assert closing_floor(previous="pre-closing", turn=6, utterances=[], farewell=True).stage == "closing"
    at_limit = closing_floor(previous="none", turn=4, utterances=[], max_turns=4, farewell=True)
    assert (at_limit.stage, at_limit.reason) == ("terminal", "turn_limit")
    assert closing_floor(previous="none", turn=5, utterances=[], farewell=False).stage == "none"
    # whose goodbye counts: a person's at once, a companion's from min_replies on
    assert farewell_counts("user_mika", 0, 4) and farewell_counts("companion_pim", 4, 4)
    assert not farewell_counts("companion_pim", 3, 4)


def test_a_leader_s_own_limit_begins_closing_an_open_conversation() -> None:
    """Cards' limits differ: at this leader's limit the thread may still be open (the leaders
    before it had higher limits); its array then begins closing, it does not end the talk. Only
    that step, at the limit itself: past it, or once closing has begun, the floor stands."""
    at_limit = closing_floor(previous="none", turn=10, utterances=[], max_turns=10)
    assert at_limit.stage == "terminal"
    opened = leading_floor(at_limit, "none", turn=10, max_turns=10)
    assert (opened.stage, opened.reason) == ("pre-closing", "turn_limit")
    past = closing_floor(previous="none", turn=11, utterances=[], max_turns=10)
    assert leading_floor(past, "none", turn=11, max_turns=10) == past
    begun = closing_floor(previous="pre-closing", turn=10, utterances=[], max_turns=10)
    assert leading_floor(begun, "pre-closing", turn=10, max_turns=10).stage == "terminal"
    # one limit for all: the thread reaches the limit closing, nothing changes
    thread: list[tuple[int, ClosingStage]] = [(8, "none"), (9, "pre-closing"), (10, "closing")]
    for turn, previous in thread:
        floor = closing_floor(previous=previous, turn=turn, utterances=[], max_turns=10)
        assert leading_floor(floor, previous, turn=turn, max_turns=10) == floor
    # repetition or a closing thread are as they were
    repeated = closing_floor(previous="none", turn=3, utterances=["same line"] * 5)
    assert leading_floor(repeated, "none", turn=3, max_turns=None) == repeated


def test_repetition_pushes_to_pre_closing_with_configurable_threshold() -> None:
    lines = [
        "Nice weather today!",
        "Nice weather today.",
        "nice weather today",
        "Nice weather, today!",
        "Nice",
    ]
    high = closing_floor(previous="none", turn=5, utterances=lines, threshold=0.5)
    assert (high.stage, high.reason) == ("pre-closing", "repetition")
    assert high.repetition is not None and high.repetition >= 0.5
    strict = closing_floor(previous="none", turn=5, utterances=lines, threshold=0.99)
    assert strict.stage == "none" and strict.repetition == high.repetition


def test_most_advanced_force_wins() -> None:
    lines = ["same"] * 5
    decision = closing_floor(previous="closing", turn=1, utterances=lines, max_turns=10)
    assert (decision.stage, decision.reason) == ("terminal", "continues")


# --- metadata extensions -----------------------------------------------------------------


def test_turn_info_reads_extensions_and_ignores_bad_values() -> None:
    meta = {META_TURN: 3, META_CLOSING: "closing", META_NEXT_SPEAKER: B, META_IN_REPLY_TO: "m1"}
    info = turn_info(Message.create(A, [B], "x", metadata=meta))
    assert (info.turn, info.closing, info.nominated, info.in_reply_to) == (3, "closing", B, "m1")
    bad = {META_TURN: True, META_CLOSING: "over", META_NEXT_SPEAKER: 5, META_IN_REPLY_TO: ""}
    info = turn_info(Message.create(A, [B], "x", metadata=bad))
    assert (info.turn, info.closing, info.nominated, info.in_reply_to) == (0, "none", None, None)
    assert turn_info(Message.create(A, [B], "x", metadata={META_TURN: -2})).turn == 0


def test_stamp_reply_keeps_the_speakers_keys() -> None:
    reply = Message.create(B, [A], "hello", metadata={"emotion": "happy", META_NEXT_SPEAKER: C})
    stamped = stamp_reply(reply, in_reply_to="m0", turn=2, closing="pre-closing")
    assert stamped.params.metadata == {
        "emotion": "happy",
        META_NEXT_SPEAKER: C,
        META_IN_REPLY_TO: "m0",
        META_TURN: 2,
        META_CLOSING: "pre-closing",
    }
    assert stamped.params.id == reply.params.id and reply.params.metadata == {
        "emotion": "happy",
        META_NEXT_SPEAKER: C,
    }


def test_reply_recipients_are_the_conversation_not_everyone_present() -> None:
    message = Message.create("user", [A, B, "companion_ghost", "user_2", A], "hi")
    # the sender, then its known or human addressees; never the speaker, a ghost or a bystander C
    assert reply_recipients(message, B, [A, B, C]) == ["user", A, "user_2"]
    assert reply_recipients(Message.create(A, [B], "hi"), B, [A, B]) == [A]


def test_select_leader_is_kept() -> None:
    message = Message.create("user", [A, B, C], "hi", id="fixed")
    assert select_leader(message, [A, B, C]) == plan_leaders(message, [A, B, C]).leader


def test_stand_in_only_after_silence() -> None:
    states = [_state(A, "speak", 9), _state(B, "listen", 2), _state(C, "listen", 6)]
    assert decide_next_speaker(states, [A, B, C], exclude={A}).reason == "nobody"
    decision = decide_next_speaker(states, [A, B, C], exclude={A}, stand_in=True)
    assert (decision.speaker, decision.reason) == (C, "stand_in")
    assert decide_next_speaker(states, [A, B, C], stand_in=True).speaker == A
    assert decide_next_speaker(states, [A, B, C], exclude={A, B, C}, stand_in=True).speaker is None


# --- speaking order ---------------------------------------------------------------------------


def test_speaking_order_is_aikyos_choice_then_stand_ins() -> None:
    states = [
        _state(A, "listen", 3),
        _state(B, "speak", 5),
        _state(C, "speak", 8),
        _state(D, "listen", 9, selected=True),
        _state("user_x", "speak", 10),
    ]
    speaking = speaking_order(states)
    assert speaking.first.speaker == D and speaking.first.reason == "selected"
    assert speaking.order == (D, C, B, A)  # selected, speakers by importance, then listeners
    assert speaking.slot(B) == 2 and speaking.slot("user_x") is None


def test_speaking_order_is_empty_when_nobody_wants_to_or_at_terminal() -> None:
    assert speaking_order([_state(A), _state(B)]).order == ()
    over = speaking_order([_state(A, "speak", 5, closing="terminal"), _state(B, closing="terminal")])
    assert over.order == () and over.first.conversation_over


@given(_states)
def test_speaking_order_depends_on_the_array_alone(states: list[State]) -> None:
    speaking = speaking_order(states)
    companions = {s.params.from_ for s in states}
    assert len(set(speaking.order)) == len(speaking.order) and set(speaking.order) <= companions
    if speaking.order:
        assert speaking.order[0] == _aikyo_reference(states, sorted(companions))


@given(st.lists(_one_state, max_size=12))
def test_each_slot_is_the_rule_with_the_earlier_speakers_excluded(states: list[State]) -> None:
    """The definition the one-pass order must keep: slot k is aikyo's rule over the array with
    the speakers of slots before k excluded, stand-ins allowed, until it chooses nobody."""
    speaking = speaking_order(states)
    everyone = [s.params.from_ for s in states if s.params.from_.startswith(COMPANION_ID_PREFIX)]
    expected: list[str] = []
    first = decide_next_speaker(states, everyone)
    while first.speaker is not None:
        expected.append(first.speaker)
        first = decide_next_speaker(states, everyone, exclude=expected, stand_in=True)
    assert speaking.order == tuple(expected)


# --- turn tags --------------------------------------------------------------------------------


def test_turn_tags_tie_our_arrays_to_their_message_without_changing_the_ranking() -> None:
    first = Message.create(A, [B, C], "one", id="m-1")
    again = Message.create(A, [B, C], "two", id="m-2")  # same sender, same addressees
    decisions = [StateDecision(B, "speak", 7.0, False), StateDecision(C, "speak", 7.0, False)]
    tagged = finalize_states(decisions, [B, C], floor="none", tag=turn_tag(first)).states
    assert states_tag(tagged) == turn_tag(first) != turn_tag(again)
    assert states_match(tagged, first, [A, B, C]) and not states_match(tagged, again, [A, B, C])
    plain = finalize_states(decisions, [B, C], floor="none").states
    assert states_tag(plain) is None and states_match(plain, again, [A, B, C])
    assert decide_next_speaker(tagged, [B, C]).speaker == decide_next_speaker(plain, [B, C]).speaker == B
    top = finalize_states([StateDecision(B, "speak", 10, False)], [B], floor="none", tag=400_000).states
    assert 9.99 < top[0].params.importance < 10 and states_tag(top) == 400_000
    assert 1 <= turn_tag(first) <= 400_000


@given(
    st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=6),
    st.integers(1, 400_000),
)
def test_tags_survive_any_importance_and_keep_the_order(values: list[float], tag: int) -> None:
    ids = [f"companion_{i}" for i in range(len(values))]
    decisions = [StateDecision(cid, "speak", v, False) for cid, v in zip(ids, values, strict=True)]
    tagged = finalize_states(decisions, ids, floor="none", tag=tag).states
    assert states_tag(tagged) == tag
    assert all(0 <= s.params.importance <= 10 for s in tagged)
    rounded = [round(v, 2) for v in values]
    for (i, a), (j, b) in itertools.combinations(enumerate(tagged), 2):
        if rounded[i] != rounded[j]:
            assert (rounded[i] < rounded[j]) == (a.params.importance < b.params.importance)


# --- where the conversation is ---------------------------------------------------------------


def test_thread_follows_replies_and_interjections() -> None:
    thread = ConversationThread()
    assert thread.place("m1", None) == Placement("current", None)
    assert thread.place("r1", "m1") == Placement("current", "m1")
    assert thread.place("u1", None) == Placement("current", "r1")  # a person interjects
    assert thread.place("r2", "r1") == Placement("stale")  # crossed the interjection
    assert thread.current == "u1"


def test_thread_skips_messages_whose_reply_came_first() -> None:
    thread = ConversationThread()
    thread.place("m1", None)
    assert thread.place("r2", "r1") == Placement("current", "m1")  # r1 not seen yet
    assert thread.place("r1", "m1") == Placement("overtaken")
    assert thread.current == "r2"
    late = ConversationThread()
    late.place("m1", None)
    late.place("r1", "m1")
    assert late.place("r3", "r2") == Placement("current", "r1")
    assert late.place("r2", "r1") == Placement("overtaken")  # r3 had answered it already
    assert late.current == "r3"


def test_thread_jumps_to_the_newest_known_reply() -> None:
    thread = ConversationThread()
    thread.place("u0", None)
    thread.place("r3", "r2")  # r2 and r1 still on the way
    thread.place("r2", "r1")
    thread.place("opening", None)  # a late first message becomes current for a moment...
    assert thread.current == "opening"
    placed = thread.place("r1", "opening")  # ...until its reply shows it was answered long ago
    assert placed == Placement("overtaken", "opening") and thread.current == "r3"


def test_thread_takes_an_answer_that_names_nothing_from_the_caller() -> None:
    """aikyo's replies name no message: the machine knows one answered a late message by the
    arrays (``answered_by``). A late person's message stays behind; a late reply jumps to its
    answer; an answer that is one of the message's own ancestors is no answer (it went round:
    seed 2722's bystander stayed at an old message for good)."""
    thread = ConversationThread()
    thread.place("plain", None)  # an aikyo answer to "opening", which is still on the way
    assert thread.place("opening", None, answered_by="plain") == Placement("overtaken")
    assert thread.current == "plain"
    jump = ConversationThread()
    jump.place("plain", None)
    jump.place("u1", None)  # a late person's message moves it on...
    placed = jump.place("r1", "u1", answered_by="plain")  # ...and its reply was answered already
    assert placed == Placement("overtaken", "u1") and jump.current == "plain"
    chain = ConversationThread()
    for mid, answers in (("a0", None), ("r1", "a0"), ("r2", "r1")):
        chain.place(mid, answers)
    assert chain.place("r3", "r2", answered_by="a0") == Placement("current", "r2")
    assert chain.current == "r3"
    assert chain.place("x", None, answered_by="never-seen") == Placement("current", "r3")


def test_early_states_wait_for_their_message_only() -> None:
    early: EarlyStates[str] = EarlyStates(capacity=2)
    older = Message.create(A, [B, C], "older", id="m-old")
    newer = Message.create(A, [B, C], "newer", id="m-new")
    decisions = [StateDecision(B, "speak", 5, False), StateDecision(C, "listen", 1, False)]
    for_newer = finalize_states(decisions, [B, C], floor="none", tag=turn_tag(newer)).states
    for_older = finalize_states(decisions, [B, C], floor="none", tag=turn_tag(older)).states
    early.message_seen(older)
    assert early.hold(for_older, "late") is False  # its message was already seen: late, not early
    assert early.hold(finalize_states(decisions, [B, C], floor="none").states, "untagged") is False
    assert early.hold(for_newer, "leader") is True
    assert early.take(older, [A, B, C]) == []  # the tag keeps it for its own message
    assert early.take(newer, [A, B, C]) == [(for_newer, "leader")]
    assert early.take(newer, [A, B, C]) == []
