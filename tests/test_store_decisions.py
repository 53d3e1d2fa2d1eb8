"""Each companion's decisions per message, in its store: kept, bounded, read back beside a node.

The table comes with data layout 2 (``companion.store.layout``): a store of layout 1 gets it when it is
migrated, without losing anything else; a reader never writes, and a file without the table reads
as empty.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import companion.store.sqlite as store_module
from companion.protocol import Message
from companion.store.sqlite import DB_FILENAME, Store, read_decisions, read_message


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])


def test_decisions_are_read_back_by_message_and_by_the_reply_they_produced(tmp_path: Path) -> None:
    with Store.in_directory(tmp_path) as store:
        store.record(Message.create("user_mika", ["companion_a"], "hello", id="m-1"))
        store.record_decision(
            "m-1", "leader_chosen", {"message_id": "m-1", "leader": "companion_a", "why": "md5"}
        )
        store.record_decision("m-2", "leader_chosen", {"message_id": "m-2", "leader": "companion_b"})
        store.record_decision("m-1", "replied", {"message_id": "m-1", "reply_id": "r-1"}, level="INFO")
    path = tmp_path / DB_FILENAME
    about = read_decisions(path, message_id="m-1")
    assert [(d.kind, d.fields.get("leader")) for d in about] == [
        ("leader_chosen", "companion_a"),
        ("replied", None),
    ]
    assert [d.kind for d in read_decisions(path, message_id="r-1")] == ["replied"]  # the reply's turn
    assert [d.message_id for d in read_decisions(path, limit=2)] == ["m-2", "m-1"]  # the newest, oldest first
    assert read_decisions(path, message_id="m-9") == []
    message = read_message(path, "m-1")
    assert message is not None and message.params.message == "hello"
    assert read_message(path, "m-9") is None
    # read beside a stopped node, nothing is left on disk (no empty -wal and -shm)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(DB_FILENAME)) == [DB_FILENAME]


async def test_decisions_are_read_beside_a_node_that_writes(tmp_path: Path) -> None:
    """With its write-ahead log in use, what was committed to the log is read too."""
    with Store.in_directory(tmp_path) as store:
        store.record_decision("m-1", "leader_chosen", {"message_id": "m-1"})
        assert await store.flush()
        assert (tmp_path / f"{DB_FILENAME}-wal").exists()
        assert [d.kind for d in read_decisions(tmp_path / DB_FILENAME, message_id="m-1")] == ["leader_chosen"]


def test_fields_beyond_the_bound_are_cut_to_their_first_keys(tmp_path: Path) -> None:
    with Store.in_directory(tmp_path) as store:
        store.record_decision(
            "m-1", "instructions", {"message_id": "m-1", "why": "short", "big": "x" * 10_000}
        )
    (decision,) = read_decisions(tmp_path / DB_FILENAME, message_id="m-1")
    assert decision.fields == {"message_id": "m-1", "why": "short", "truncated": True}


def test_a_store_keeps_only_the_newest_decisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "DECISIONS_KEPT", 50)
    with Store.in_directory(tmp_path) as store:
        for n in range(300):
            store.record_decision(f"m-{n}", "speaker_chosen", {"message_id": f"m-{n}"})
    path = tmp_path / DB_FILENAME
    assert 50 <= _rows(path) <= 55  # pruned every tenth of the bound
    assert read_decisions(path, limit=1)[0].message_id == "m-299"


def test_a_layout_1_file_gets_the_table_when_migrated_and_keeps_its_history(tmp_path: Path) -> None:
    with Store.in_directory(tmp_path) as store:
        store.record(Message.create("user_mika", ["companion_a"], "kept", id="m-1"))
    path = tmp_path / DB_FILENAME
    with sqlite3.connect(path) as db:  # as a file written before the table existed
        db.execute("DROP TABLE decisions")
        db.execute("PRAGMA user_version=1")
    assert read_decisions(path, message_id="m-1") == []  # a reader of such a file sees nothing
    with Store.in_directory(tmp_path) as store:
        assert [m.params.id for m in store.recent(10)] == ["m-1"]
        store.record_decision("m-1", "leader_chosen", {"message_id": "m-1"})
    assert [d.kind for d in read_decisions(path, message_id="m-1")] == ["leader_chosen"]


def test_a_reader_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "companion_x" / DB_FILENAME
    assert read_decisions(path) == [] and read_message(path, "m-1") is None
    assert not path.exists()
