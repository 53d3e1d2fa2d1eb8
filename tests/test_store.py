"""The SQLite store: history, working memory and seen ids survive restarts and crashes."""

from __future__ import annotations

import sqlite3
import textwrap
import time
from pathlib import Path

import pytest

from companion.ports import ConversationStore
from companion.protocol import Message
from companion.store.history import ConversationHistory
from companion.store.layout import LayoutError
from companion.store.sqlite import DB_FILENAME, MemoryStore, Store, StoreError
from support.processes import killed_after


def _msg(i: int, sender: str = "companion_a") -> Message:
    return Message.create(
        sender, ["companion_b"], f"line {i} ＡＩ", metadata={"emotion": "happy", "n": i}, id=f"m{i}"
    )


def test_history_in_order_once_per_id(tmp_path: Path) -> None:
    with Store.in_directory(tmp_path) as store:
        history: ConversationHistory = store
        for i in range(7):
            history.append(_msg(i))
        assert store.add(_msg(3)) is False
        history.append(Message.create("x", [], "a different body", id="m3"))
        assert len(store) == 7
        assert [m.params.id for m in history.recent(3)] == ["m4", "m5", "m6"]
        assert history.recent(0) == [] and len(history.recent(100)) == 7
        assert history.recent(1)[0] == _msg(6)
        assert store.has_message("m0") and not store.has_message("m9")
    assert (tmp_path / DB_FILENAME).exists()


def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    with Store.in_directory(tmp_path) as store:
        store.append(_msg(1))
        store.remember("conversation", {"turn": 4, "closing": "pre-closing"})
        store.remember("mood", "cheerful")
        store.forget("mood")
        assert store.mark_seen("messages", "m1") is True
    with Store.in_directory(tmp_path) as store:
        assert store.recent(5) == [_msg(1)]
        assert store.recall("conversation") == {"turn": 4, "closing": "pre-closing"}
        assert store.recall("mood", "none") == "none"
        assert store.memory() == {"conversation": {"turn": 4, "closing": "pre-closing"}}
        assert store.seen("messages", "m1") and store.mark_seen("messages", "m1") is False
        assert not store.seen("states", "m1")


def test_seen_ids_are_bounded(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db", seen_limit=10) as store:
        for i in range(25):
            store.mark_seen("messages", f"id{i}")
        assert store.seen("messages", "id24") and store.seen("messages", "id15")
        assert not store.seen("messages", "id0")


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from companion.protocol import Message
    from companion.store.sqlite import Store
    store = Store.in_directory(sys.argv[1])
    for i in range(50):
        store.append(Message.create("companion_a", ["companion_b"], f"durable {i}", id=f"d{i}"))
    store.remember("conversation", {"turn": 50})
    store.mark_replied("d49")
    if sys.argv[2] == "flush":
        assert store.sync(10)
    print("queued", flush=True)
    sys.stdin.read()
    """
)


def _committed(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])


@pytest.mark.parametrize("flush", ["flush", "no-flush"])
def test_a_killed_writer_loses_nothing_it_flushed_and_commits_within_its_window(
    tmp_path: Path, flush: str
) -> None:
    """SIGKILL, no close: after ``flush`` returned, nothing is lost; without it the writer thread
    commits on its own, so another process sees every message within a bounded time."""
    with killed_after(_KILLED_WRITER, str(tmp_path), flush, says="queued"):
        if flush == "no-flush":
            deadline = time.monotonic() + 5.0
            while _committed(tmp_path / DB_FILENAME) < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
    with Store.in_directory(tmp_path) as store:
        assert len(store) == 50
        assert [m.params.message for m in store.recent(50)] == [f"durable {i}" for i in range(50)]
        assert store.recall("conversation") == {"turn": 50}
        assert store.replied("d49")


def test_stop_then_reopen_sees_every_message_in_order(tmp_path: Path) -> None:
    """A burst far beyond one batch, closed at once: the close flushes all of it, in order, and
    the ids stay unique across the restart (a replayed message is a duplicate)."""
    with Store.in_directory(tmp_path) as store:
        for i in range(3000):
            assert store.record(_msg(i))
        store.remember_companion("companion_b")
    with Store.in_directory(tmp_path, tail=16, id_window=100) as store:
        assert len(store) == 3000
        assert [m.params.id for m in store.recent(3000)] == [f"m{i}" for i in range(3000)]
        assert store.record(_msg(5)) is False and store.record(_msg(2999)) is False  # disk, view
        assert store.has_message("m0") and not store.has_message("m3000")
        assert store.known_companions() == ["companion_b"]


def test_reads_beyond_the_view_merge_the_file_with_what_is_still_queued(tmp_path: Path) -> None:
    """A slow writer (a long batch window) leaves the newest messages only in the view: a read of
    more history than the tail must still give every message once, oldest first."""
    with Store.in_directory(tmp_path) as store:
        for i in range(20):
            store.record(_msg(i))
    with Store.in_directory(tmp_path, tail=10, id_window=5, batch_window=30.0) as store:
        for i in range(20, 28):
            assert store.record(_msg(i))
        assert _committed(tmp_path / DB_FILENAME) == 20  # the eight new ones are queued
        assert [m.params.id for m in store.recent(14)] == [f"m{i}" for i in range(14, 28)]
        assert [m.params.id for m in store.recent(100)] == [f"m{i}" for i in range(28)]
        assert store.record(_msg(3)) is False and store.record(_msg(25)) is False
        assert len(store) == 28
    assert _committed(tmp_path / DB_FILENAME) == 28  # closing did not wait for the window


def test_refuses_a_newer_schema_and_a_closed_store(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=99")
    with pytest.raises(LayoutError, match="data layout 99"):
        Store(path)
    store = Store(tmp_path / "ok.db")
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.recent(1)


def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open"):
        Store(blocker / "sub" / "x.db")


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_the_engines_store_records_once_remembers_replies_and_companions(tmp_path: Path, kind: str) -> None:
    """Both stores keep the :class:`companion.ports.ConversationStore` promises."""
    store: ConversationStore = Store.in_directory(tmp_path) if kind == "sqlite" else MemoryStore()
    assert store.record(_msg(1)) is True and store.record(_msg(1)) is False
    assert store.mark_replied("m1") is True and store.mark_replied("m1") is False
    assert store.replied("m1") and not store.replied("m2")
    for cid in ("companion_b", "companion_a", "companion_b"):
        store.remember_companion(cid)
    assert store.known_companions() == ["companion_b", "companion_a"]
    assert [m.params.id for m in store.recent(5)] == ["m1"]
    if isinstance(store, Store):
        store.close()
        with Store.in_directory(tmp_path) as again:
            assert again.known_companions() == ["companion_b", "companion_a"] and again.replied("m1")


def test_odd_strings_from_the_network_are_stored_not_refused(tmp_path: Path) -> None:
    """JSON allows lone surrogates; SQLite cannot bind them. They are stored escaped and come back."""
    odd = "\ud800"
    message = Message.create(f"user_{odd}", [f"companion_{odd}"], f"text {odd}", id=f"id-{odd}")
    with Store.in_directory(tmp_path) as store:
        assert store.record(message) is True and store.record(message) is False
        assert store.has_message(f"id-{odd}")
        assert store.recent(1) == [message]
        store.remember_companion(f"companion_{odd}")
        assert store.mark_replied(odd) and store.replied(odd)
        store.remember(f"key {odd}", {"said": odd})
        assert store.recall(f"key {odd}") == {"said": odd}
        assert store.record(_msg(2))  # and the next write is unaffected
