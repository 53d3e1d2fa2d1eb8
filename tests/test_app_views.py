"""The history ``companion run --ws`` serves: the union of its companions' stores, each message
once at the earliest time it was stored, oldest first, bounded; real SQLite stores on disk."""

from __future__ import annotations

from pathlib import Path

from companion.app.views import gather_history
from companion.protocol import Message
from companion.store.sqlite import MemoryStore, Store, read_history


async def test_the_stores_are_merged_once_per_message_at_the_earliest_time(tmp_path: Path) -> None:
    first = Message.create("user_mika", ["companion_a", "companion_b"], "Hello both", id="m-1")
    reply = Message.create(
        "companion_a", ["user_mika", "companion_b"], "Hi!", {"in_reply_to": "m-1"}, id="m-2"
    )
    a = Store.in_directory(tmp_path / "companion_a")
    b = Store.in_directory(tmp_path / "companion_b")
    try:
        a.record(first)
        await a.flush()
        b.record(first)  # the same message, stored later by the other companion
        b.record(reply)
        a.record(reply)
        history = await gather_history({"companion_a": a, "companion_b": b}, 10)
        assert [m.params.id for _, m in history] == ["m-1", "m-2"]
        at_a = dict((m.params.id, t) for t, m in read_history(a.path, 10))
        assert history[0][0] == at_a["m-1"] <= read_history(b.path, 10)[0][0]
        assert [m.params.id for _, m in await gather_history({"a": a, "b": b}, 1)] == ["m-2"]
        assert await gather_history({"a": a}, 0) == []

        # a store in memory has no times: its messages come after the timed ones
        memory = MemoryStore()
        late = Message.create("user_ken", ["companion_c"], "Anyone?", id="m-3")
        memory.record(late)
        merged = await gather_history({"a": a, "c": memory}, 10)
        assert [(m.params.id, t is None) for t, m in merged] == [
            ("m-1", False),
            ("m-2", False),
            ("m-3", True),
        ]
    finally:
        a.close()
        b.close()
