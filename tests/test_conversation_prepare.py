"""The state machine's hook for a reply prepared early (:class:`Prepare`): only the turn's
likely speaker gets one, and it announces the very :class:`Speak` an array that confirms it
gives, so the engine can keep what it prepared."""

from __future__ import annotations

from typing import Any

from companion.conversation.events import MessageSeen, Prepare, Speak, StatesSeen
from companion.protocol import Message
from support.conversations import USER, A, B, C, array, machine, message_led_by, of


def _prepares(message: Message, ids: tuple[str, ...], names: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cid in ids:
        m = machine(cid)
        if names:
            m.names = names
        out[cid] = of(m.receive(MessageSeen(message), 0.0), Prepare)
    return out


def test_the_companion_addressed_alone_prepares_the_speak_its_slot_gets() -> None:
    message = Message.create(USER, [A], "How is the sea tonight?", id="m-1")
    m = machine(A)
    [prepare] = of(m.receive(MessageSeen(message), 0.0), Prepare)
    [speak] = of(m.receive(StatesSeen(array(message, A), A), 1.0), Speak)
    assert prepare.speak == speak
    assert (speak.recipients, speak.closing, speak.turn) == ((USER,), "none", 1)


def test_only_the_named_companion_prepares() -> None:
    message = message_led_by(A, [A, B, C])
    named = Message.create(USER, [A, B, C], "Bea, how is the sea?", id=message.params.id)
    prepared = _prepares(named, (A, B, C), names={A: "Aki", B: "Bea", C: "Cai"})
    assert [cid for cid, p in prepared.items() if p] == [B]


def test_nobody_prepares_when_nobody_is_likelier_than_another() -> None:
    message = message_led_by(A, [A, B, C])
    assert not any(_prepares(message, (A, B, C)).values())


def test_a_companion_past_its_turn_limit_prepares_nothing() -> None:
    message = Message.create(USER, [A], "How is the sea tonight?", id="m-1")
    m = machine(A, max_turns=0)
    assert not of(m.receive(MessageSeen(message), 0.0), Prepare)
