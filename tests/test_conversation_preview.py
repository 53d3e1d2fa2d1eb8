"""The machine's rules for a message's preview (``companion.conversation.preview``): the next
turn's model work starts from it, held; the message itself adopts it when it is the same
envelope, and a different message or none within a speaking slot drops it."""

from __future__ import annotations

from dataclasses import replace

from companion.conversation.events import (
    DropAhead,
    Lead,
    LeadAhead,
    MessagePreviewed,
    MessageSeen,
    Prepare,
    StatesSeen,
    Tick,
)
from companion.conversation.machine import Conversation
from companion.conversation.preview import PREVIEW_GAP
from companion.protocol import Message
from support.conversations import USER, A, B, R, array, decisions, machine, of, reply


def _following(me: str) -> tuple[Conversation, Message]:
    """``me``'s machine after a person asked A, and A was chosen; and A's reply to ``me``."""
    ask = Message.create(USER, [A], "What is on the shelf?", id="m-ask")
    m = machine(me)
    m.receive(MessageSeen(ask), 0.0)
    m.receive(StatesSeen(array(ask, A), A), 0.5)
    return m, reply(A, [USER, me], ask)


def test_a_preview_starts_the_lead_and_the_prepared_reply_and_moves_nothing() -> None:
    m, line = _following(B)
    turn, stage = m.turn, m.stage
    out = m.receive(MessagePreviewed(line, A), 1.0)
    [ahead] = of(out, LeadAhead)
    [prepare] = of(out, Prepare)
    assert ahead.lead.message_id == prepare.speak.message_id == line.params.id
    assert m.turn is turn and m.stage == stage and not m.thread.knows(line.params.id)
    assert m.prepared_for == line.params.id  # the engine keeps the reply prepared from it
    assert m.deadline() == 1.0 + R


def test_the_same_message_adopts_the_held_work() -> None:
    m, line = _following(B)
    out = m.receive(MessagePreviewed(line, A), 1.0)
    [ahead], [early] = of(out, LeadAhead), of(out, Prepare)
    later = m.receive(MessageSeen(line, A), 3.0)
    assert not of(later, DropAhead)
    assert decisions(later, "preview_adopted")
    assert of(later, Lead) == [ahead.lead]  # the driver gives it the held answer
    assert early.ahead  # from the preview: the line before is still voiced
    assert of(later, Prepare) == [replace(early, ahead=False)]  # the same reply, now the message's
    assert m.thread.knows(line.params.id)
    assert m.previews.deadline() is None


def test_a_message_that_differs_from_its_preview_drops_the_held_work_first() -> None:
    m, line = _following(B)
    m.receive(MessagePreviewed(line, A), 1.0)
    cut = line.model_copy(update={"params": line.params.model_copy(update={"message": "A says"})})
    assert cut != line and cut.params.id == line.params.id
    out = m.receive(MessageSeen(cut, A), 2.0)
    [drop] = of(out, DropAhead)
    assert drop.message_id == line.params.id
    assert out.index(drop) < out.index(of(out, Lead)[0])  # dropped before the new lead starts
    [lead] = of(out, Lead)
    assert lead.message == cut


def test_a_message_that_never_comes_drops_the_held_work_at_the_end_of_a_slot() -> None:
    m, line = _following(B)
    m.receive(MessagePreviewed(line, A), 1.0)
    assert not of(m.receive(Tick(), 1.0 + R - 0.01), DropAhead)
    [drop] = of(m.receive(Tick(), 1.0 + R), DropAhead)
    assert drop.message_id == line.params.id and "did not arrive" in drop.reason
    assert m.prepared_for is None or m.prepared_for != line.params.id
    later = m.receive(MessageSeen(line, A), 1.0 + R + 1)  # late: it opens its turn as usual
    assert not of(later, DropAhead) and of(later, Lead)


def test_a_preview_not_from_its_speaker_or_already_here_is_ignored() -> None:
    m, line = _following(B)
    assert m.receive(MessagePreviewed(line, None), 1.0) == []
    assert m.receive(MessagePreviewed(line, B), 1.0) == []  # someone else's line
    m.receive(MessageSeen(line, A), 2.0)
    assert not of(m.receive(MessagePreviewed(line, A), 2.5), LeadAhead)


def test_a_preview_that_gives_this_node_nothing_to_do_holds_nothing() -> None:
    m, _line = _following(B)
    to_user = reply(A, [USER], Message.create(USER, [A], "?", id="m-ask"))
    out = m.receive(MessagePreviewed(to_user, A), 1.0)
    assert not of(out, LeadAhead) and not of(out, Prepare)
    assert len(m.previews) == 0 and to_user.params.id not in m.previews
    assert m.deadline() != 1.0 + R


def test_a_bystander_ignores_previews() -> None:
    _m, line = _following(B)
    watcher = machine(None)
    assert watcher.receive(MessagePreviewed(line, A), 1.0) == []
    assert len(watcher.previews) == 0


def test_a_flood_of_previews_from_one_sender_starts_work_at_most_once_a_gap() -> None:
    """Each preview held starts model work (paid, with a hosted model); a peer sending them at
    150/s gets one a second, the rest ignored before the machine is even copied, and counted."""
    m, line = _following(B)
    started = 0
    for i in range(150):
        fake = line.model_copy(update={"params": line.params.model_copy(update={"id": f"m-flood-{i}"})})
        started += len(of(m.receive(MessagePreviewed(fake, A), 1.0 + i / 150), LeadAhead))
    assert started == 1
    assert m.previews_too_soon == 149
    out = m.receive(MessagePreviewed(line, A), 1.0 + PREVIEW_GAP)
    assert of(out, LeadAhead) and decisions(out, "preview_held")[0].fields["too_soon"] == 149
