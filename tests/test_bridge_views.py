"""The bounds of the bridge's ``/history``: the client's limit, the bridge's cap, and a byte
budget that keeps the newest messages."""

from __future__ import annotations

import json

from companion.bridge.views import (
    DEFAULT_HISTORY,
    MAX_HISTORY,
    MAX_HISTORY_BYTES,
    RecentMessages,
    history_body,
    parse_limit,
)
from companion.protocol import Action, Message


def test_the_limit_is_a_bounded_whole_number() -> None:
    assert parse_limit(None) == DEFAULT_HISTORY
    assert parse_limit("7") == 7
    assert parse_limit(str(MAX_HISTORY * 10)) == MAX_HISTORY
    for bad in ("-1", "1.5", "x", "9" * 40, ""):
        assert isinstance(parse_limit(bad), str), bad


def test_the_body_keeps_the_newest_messages_within_the_byte_budget() -> None:
    big = "ら" * 20_000  # 60 KB of UTF-8 per message
    messages = [(float(i), Message.create("user_a", ["companion_b"], big, id=f"m-{i}")) for i in range(100)]
    body = history_body(messages, 100)
    assert len(body.encode("utf-8")) <= MAX_HISTORY_BYTES + 64
    items = json.loads(body)["messages"]
    assert 0 < len(items) < 100
    assert [i["message"]["params"]["id"] for i in items] == [f"m-{i}" for i in range(100 - len(items), 100)]
    assert items[-1]["at"] == 99.0 and items[-1]["message"]["params"]["message"] == big
    few = json.loads(history_body(messages[:3], 2))["messages"]
    assert [i["message"]["params"]["id"] for i in few] == ["m-1", "m-2"]
    assert json.loads(history_body(messages, 0)) == {"messages": []}


async def test_a_standalone_bridge_remembers_the_newest_messages_once_each() -> None:
    """Without a store, ``/history`` is the last messages relayed: a repeated id once, the
    newest kept when the memory is full, anything that is not a message left out."""
    ticks = iter(range(1000))
    recent = RecentMessages(size=3, clock=lambda: float(next(ticks)))
    said = [Message.create("user_a", ["companion_b"], f"line {i}", id=f"m-{i}") for i in range(5)]
    recent.note(said[0])
    recent.note(said[0])  # a peer repeats it
    recent.note(Action.create("companion_b", "wave", {}))
    recent.note(None)
    assert await recent.source(10) == [(0.0, said[0])]
    for message in said[1:]:
        recent.note(message)
    assert [m.params.id for _, m in await recent.source(10)] == ["m-2", "m-3", "m-4"]
    assert [m.params.id for _, m in await recent.source(1)] == ["m-4"]
    assert await recent.source(0) == []
