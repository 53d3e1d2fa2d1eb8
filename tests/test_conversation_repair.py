"""The thread mended when gossip's order misled it (``companion/conversation/repair.py``): a late
message that turns out older gives the turn it set aside back; a thread nobody answers joins the
one the others follow. Both shapes left a conversation silent for good in the fault suite
(``scripts/bench_faults.py --seeds 1000``, seeds 581 and 363)."""

from __future__ import annotations

import copy
import itertools

from companion.conversation.arrays import EARLY_PLAIN
from companion.conversation.events import (
    Lead,
    MessageSeen,
    PublishStates,
    Speak,
    StatesSeen,
    ThinkingSeen,
    Tick,
    Withdraw,
)
from companion.conversation.machine import Conversation
from companion.conversation.rules import plan_leaders
from companion.conversation.turn import Phase
from companion.protocol import Message
from support.conversations import USER, A, B, C, T, array, decisions, machine, message_led_by, of, reply


def _led_by(leader: str, message: Message) -> Message:
    """``message`` under the first id (``<id>-<n>``) whose aikyo leader is ``leader``."""
    params = message.params
    for n in itertools.count():
        again = message.model_copy(update={"params": params.model_copy(update={"id": f"{params.id}-{n}"})})
        if plan_leaders(again, [c for c in params.to if c.startswith("companion_")]).leader == leader:
            return again
    raise AssertionError("unreachable")


def _late_opening(leader: str) -> tuple[Message, Message, Message]:
    """The user's opening, A's reply to it, and B's reply to A's, which addresses A and C and
    whose leader is ``leader``."""
    opening = Message.create(USER, [A, B, C], "Good evening, everyone!")
    first = reply(A, [USER, B, C], opening)
    return opening, first, _led_by(leader, reply(B, [A, C], first, turn=2))


def test_a_late_opening_that_turns_out_older_gives_the_turn_back_and_its_array_counts() -> None:
    """Seed 581: C saw B's reply first (its turn opened), then the user's opening, delayed: it
    answers nothing, so the conversation moved to it and C's turn ended; A's array for B's
    reply then came and was dropped; then A's reply, which answers the opening, showed the
    opening was older. C sat out the slot A's array gave it, and the closing array found no
    turn to close. Now the turn comes back with the array, and C speaks in its slot."""
    opening, first, second = _late_opening(A)
    m = machine(C)
    m.receive(MessageSeen(second), 0.0)
    assert m.turn is not None and m.turn.message_id == second.params.id
    m.receive(MessageSeen(opening), 0.05)  # late: a person's message, a new exchange
    assert m.turn is not None and m.turn.message_id == opening.params.id
    m.receive(StatesSeen(array(second, C), A), 0.06)  # for the turn set aside
    out = m.receive(MessageSeen(first), 0.1)  # answers the opening: it was older
    [resumed] = decisions(out, "turn_resumed")
    assert resumed.fields["message_id"] == second.params.id
    assert m.thread.current == second.params.id
    assert m.turn is not None and m.turn.message_id == second.params.id
    assert [d.fields["speaker"] for d in decisions(out, "speaker_chosen")] == [C]
    assert of(out, Speak) and phase(m) is Phase.SPEAKING
    assert m.replies == 2  # the count at B's reply, not the opening's 0


def test_a_lead_its_end_withdrew_starts_again_when_the_turn_comes_back() -> None:
    opening, first, second = _late_opening(C)
    m = machine(C)
    out = m.receive(MessageSeen(second), 0.0)
    assert of(out, Lead)
    out = m.receive(MessageSeen(opening), 0.05)
    assert [w.what for w in of(out, Withdraw)] == ["lead"]
    out = m.receive(MessageSeen(first), 0.1)
    assert decisions(out, "turn_resumed")
    [lead] = of(out, Lead)
    assert lead.message_id == second.params.id and phase(m) is Phase.LEADING


def test_a_stale_reply_moves_nothing_while_the_thread_is_answered() -> None:
    """A person's message crossing a reply: the reply is stale, the person's message gets its
    array, and the reply never takes the thread, however long one waits."""
    old = message_led_by(B, [A, B, C])
    m = machine(A)
    m.receive(MessageSeen(old), 0.0)
    newer = message_led_by(B, [A, B, C], text="Wait, one more thing!")
    m.receive(MessageSeen(newer), 1.0)
    m.receive(MessageSeen(reply(C, [USER, A, B], old)), 1.1)  # crossed the newer message: stale
    m.receive(StatesSeen(array(newer, C), B), 1.2)
    for now in (10.0, 30.0, 100.0):
        assert not decisions(m.receive(Tick(), now), "thread_adopted")
    assert m.thread.current == newer.params.id


def _split() -> tuple[Conversation, Message, Message]:
    """Seed 363's shape on C: C's own line answers a message the others left; nobody answers
    C's line; B's reply in the others' thread, which addresses C, is stale here."""
    opening = Message.create(USER, [A, B, C], "Good evening, everyone!")
    left = reply(A, [USER, B, C], opening)  # the others left it (a late message split them)
    m = machine(C)
    m.receive(MessageSeen(opening), 0.0)
    m.receive(MessageSeen(left), 1.0)
    own = reply(C, [USER, A, B], left, turn=2)
    m.receive(MessageSeen(own), 2.0)
    theirs = _led_by(A, reply(B, [USER, A, C], opening, turn=3))
    out = m.receive(MessageSeen(theirs), 3.0)
    assert decisions(out, "message_stale")[0].fields["placement"] == "stale"
    return m, own, theirs


def test_a_thread_nobody_answers_joins_the_one_the_others_follow() -> None:
    m, own, theirs = _split()
    m.receive(StatesSeen(array(theirs, C), A), 3.1)  # their leader's array, dropped until now
    dead_at = 2.0 + (2 + 1) * T  # one leader slot per candidate of C's line (A, B), and one more
    assert m.deadline() == dead_at
    assert not decisions(m.receive(MessageSeen(Message.create("user_other", [], "noise")), dead_at - 0.1))
    out = m.receive(Tick(), dead_at)
    [adopted] = decisions(out, "thread_adopted")
    assert adopted.fields["left"] == own.params.id and adopted.fields["message_id"] == theirs.params.id
    assert m.thread.current == theirs.params.id
    assert m.turn is not None and m.turn.message_id == theirs.params.id
    assert [d.fields["speaker"] for d in decisions(out, "speaker_chosen")] == [C]
    assert of(out, Speak)


def test_a_line_the_others_answer_keeps_its_thread() -> None:
    m, own, _theirs = _split()
    m.receive(StatesSeen(array(own, A), B), 3.2)  # an array for C's own line: the others follow it
    assert m.deadline() is None
    out = m.receive(Tick(), 60.0)
    assert not decisions(out, "thread_adopted") and m.thread.current == own.params.id


def phase(m: Conversation) -> Phase | None:
    return None if m.turn is None else m.turn.phase


def test_a_reply_to_the_person_alone_that_crossed_a_newer_message_still_closes_where_it_is_current() -> None:
    """Seed 1203: A answered an aikyo companion's message with a line to the person alone; here
    a newer message came first, so A's line is stale and the conversation goes on; a bystander
    got the line first and is at it, where only its quiet closing can end the conversation."""
    older = Message.create("companion_j", [A, B], "A plain aikyo line.")
    newer = Message.create("companion_j", [A, B], "Another plain aikyo line.")
    m, bystander = machine(A), machine(None)
    for node in (m, bystander):
        node.receive(MessageSeen(older), 0.0)
    m.receive(MessageSeen(newer), 0.1)
    line = reply(A, [USER], older, turn=2)
    out = m.receive(MessageSeen(line), 0.2)
    assert decisions(out, "message_stale") and not decisions(out, "conversation_over")
    [closing] = of(out, PublishStates)
    bystander.receive(MessageSeen(line), 0.2)
    seen = bystander.receive(StatesSeen(closing.states, A), 0.3)
    assert [d.fields["reason"] for d in decisions(seen, "conversation_over")] == ["quiet"]


def _began() -> tuple[Conversation, Message]:
    """A's node: the takeover's array counted with C to speak, and C said it is preparing."""
    message = message_led_by(B, [A, B, C])
    takeover = plan_leaders(message, [A, B, C]).order[1]
    m = machine(A)
    m.receive(MessageSeen(message), 0.0)
    m.receive(StatesSeen(array(message, C), takeover), T)
    m.receive(ThinkingSeen(message.params.id, C, C), T + 0.1)
    return m, message


def test_a_late_array_never_puts_another_speaker_before_one_that_began() -> None:
    """Seed 2631: a takeover's array counted and its speaker said it was preparing; then an
    earlier leader's array came (an aikyo one, matched by its addressees, another message's)
    that put this companion first: it spoke beside the one that began. The first to begin goes
    on; a late array that agrees on it still counts."""
    m, message = _began()
    out = m.receive(StatesSeen(array(message, A), B), T + 0.2)
    [kept] = decisions(out, "states_ignored")
    assert kept.fields["began"] == C and not decisions(out, "states_switched")
    assert not of(out, Speak) and phase(m) is Phase.AWAITING_SPEAKER
    out = m.receive(StatesSeen(array(message, C, closing="pre-closing"), B), T + 0.3)
    assert decisions(out, "states_switched")  # it agrees on who speaks: it counts


def test_a_line_another_companion_is_answering_keeps_its_thread() -> None:
    m, own, _theirs = _split()
    m.receive(ThinkingSeen(own.params.id, A, A), 3.2)  # A prepares its answer to C's line
    assert m.deadline() is None
    assert not decisions(m.receive(Tick(), 60.0), "thread_adopted") and m.thread.current == own.params.id


def test_an_earlier_leaders_late_terminal_array_still_ends_a_turn_a_speaker_began() -> None:
    m, message = _began()
    for states in (array(message, None, closing="terminal"), array(message, A, closing="terminal")):
        n = copy.deepcopy(m)
        out = n.receive(StatesSeen(states, B), T + 0.2)
        assert decisions(out, "states_switched") and decisions(out, "conversation_over")


def _plain(sender: str, to: list[str], text: str = "A plain aikyo line.") -> Message:
    """A line as aikyo's companions say it: no turn, no reply named."""
    return Message.create(sender, to, text)


def test_a_companion_keeps_an_aikyo_array_that_came_before_its_message() -> None:
    """Seeds 2309 and 2799: an aikyo leader's array (untagged) reached A before the message it
    was for; A dropped it, took over with its own array and its own order while the others
    followed aikyo's, and two companions reached their slots at once. Kept for a leader slot
    (as a bystander keeps them), it decides A's turn as it does the others'."""
    message = message_led_by(B, [A, B, C])
    m = machine(A)
    out = m.receive(StatesSeen(array(message, C, tagged=False), B), 0.0)
    assert [d.fields["held"] for d in decisions(out, "states_ignored")] == [True]
    out = m.receive(MessageSeen(message), 0.1)
    assert [(d.fields["speaker"], d.fields["source"]) for d in decisions(out, "speaker_chosen")] == [(C, B)]
    assert not decisions(m.receive(Tick(), 0.1 + T), "takeover")


def test_a_late_message_its_aikyo_speaker_already_answered_moves_nothing() -> None:
    """Seed 363: the user's message reached C after A's array for it (untagged) and A's reply
    to it (which names nothing): it looked new, C gave it a turn of its own, and the group
    went on in two threads past the turn cap. The speaker the array put first spoke since it
    came: that was the answer, and the message is older than its answer."""
    opening = _led_by(A, Message.create(USER, [A, B, C], "Good evening, everyone!"))
    answer = _plain(A, [USER, B, C])
    m = machine(C)
    m.receive(StatesSeen(array(opening, A, tagged=False), A), 0.0)
    m.receive(MessageSeen(answer), 0.1)
    out = m.receive(MessageSeen(opening), 0.2)
    [late] = decisions(out, "message_stale")
    assert late.fields["placement"] == "overtaken" and not decisions(out, "leader_chosen")
    assert m.thread.current == answer.params.id
    assert m.turn is not None and m.turn.message_id == answer.params.id


def test_a_late_reply_its_aikyo_speaker_already_answered_gives_the_answer_its_turn_back() -> None:
    """Seed 580: B got A's array (untagged) for C's reply, then A's answer to it (naming
    nothing; it looked new), then the user's message late (it moved the thread), then C's
    reply to it: C's reply looked like the thread's next message, B gave it a turn, and when
    A, the array's speaker, stayed silent (it had spoken), B answered C's reply a second time.
    C's reply was answered already: the thread goes on at A's answer, its turn comes back."""
    opening = Message.create(USER, [A, B, C], "Good evening, everyone!")
    second = _led_by(A, reply(C, [USER, A, B], opening))
    answer = _plain(A, [USER, B, C])
    m = machine(B)
    m.receive(StatesSeen(array(second, A, tagged=False), A), 0.0)
    m.receive(MessageSeen(answer), 0.1)
    m.receive(MessageSeen(opening), 0.2)  # late: it moves the thread, A's answer set aside
    out = m.receive(MessageSeen(second), 0.3)
    assert [d.fields["placement"] for d in decisions(out, "message_stale")] == ["overtaken"]
    assert [d.fields["message_id"] for d in decisions(out, "turn_resumed")] == [answer.params.id]
    assert m.thread.current == answer.params.id
    assert m.turn is not None and m.turn.message_id == answer.params.id


def test_an_aikyo_array_older_than_gossips_reordering_is_no_early_one_for_a_companion() -> None:
    """The mixed-network test stalled: aikyo's leaders publish their array for a message after
    our ``terminal``, and kept for the next message (which it matched by its addressees) it
    chose that message's speaker, and its speaker's line, said since, passed for the next
    message's answer. A companion keeps an untagged array for :data:`EARLY_PLAIN` seconds, the
    reordering of gossip; a bystander, which only reports, for a leader slot."""
    opening = _led_by(A, Message.create(USER, [A, B, C], "Good evening, everyone!"))
    late = EARLY_PLAIN + 0.5
    m, bystander = machine(C), machine(None)
    for node in (m, bystander):
        node.receive(StatesSeen(array(opening, A, tagged=False), A), 0.0)
    m.receive(MessageSeen(_plain(A, [USER, B, C])), 0.1)
    out = m.receive(MessageSeen(opening), late)
    assert not decisions(out, "message_stale") and m.thread.current == opening.params.id
    assert not decisions(out, "speaker_chosen")
    seen = bystander.receive(MessageSeen(opening), late)
    assert [d.fields["speaker"] for d in decisions(seen, "speaker_chosen")] == [A]
