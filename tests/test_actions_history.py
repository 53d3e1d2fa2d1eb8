"""The in-memory conversation history the runtime records into."""

from __future__ import annotations

import pytest

from companion.protocol import Message
from companion.store.history import ConversationHistory, InMemoryHistory


def _msg(text: str, id: str | None = None) -> Message:
    return Message.create("user", ["companion_a"], text, id=id)


def test_recent_is_oldest_first_and_bounded_by_limit() -> None:
    history = InMemoryHistory()
    messages = [_msg(str(i)) for i in range(5)]
    for message in messages:
        history.append(message)
    assert history.recent(3) == messages[2:]
    assert history.recent(10) == messages
    assert history.recent(0) == []


def test_the_same_message_id_is_kept_once() -> None:
    history = InMemoryHistory()
    first = _msg("hello", id="m1")
    history.append(first)
    history.append(_msg("hello again", id="m1"))  # gossip echo of our own message
    assert history.recent(5) == [first] and len(history) == 1


def test_capacity_drops_the_oldest() -> None:
    history = InMemoryHistory(capacity=2)
    a, b, c = _msg("a"), _msg("b"), _msg("c")
    for message in (a, b, c):
        history.append(message)
    assert history.recent(5) == [b, c]
    with pytest.raises(ValueError):
        InMemoryHistory(capacity=0)


def test_it_satisfies_the_protocol() -> None:
    history: ConversationHistory = InMemoryHistory()
    history.append(_msg("x"))
    assert len(history.recent(1)) == 1
