"""The writer thread: order kept, a refused statement dropped alone, flush's answer honest."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from companion.store.writer import SqlWriter


def _rows(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as db:
        return [(int(k), str(v)) for k, v in db.execute("SELECT k, v FROM t ORDER BY rowid")]


def test_statements_run_in_order_and_a_refused_one_costs_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    writer = SqlWriter(path, synchronous="NORMAL", batch_window=0.05)
    try:
        for k in range(300):  # one multi-row INSERT run, an UPDATE between, then more
            writer.submit("INSERT INTO t (k, v) VALUES (?, ?)", (k, f"v{k}"))
        writer.submit("UPDATE t SET v = ? WHERE k = ?", ("changed", 7))
        assert writer.flush(10) is True
        mark = writer.submitted
        writer.submit("INSERT INTO t (k, v) VALUES (?, ?)", (300, "v300"))
        writer.submit("INSERT INTO t (k, v) VALUES (?, ?)", (5, "a duplicate key"))  # refused
        writer.submit("INSERT INTO t (k, v) VALUES (?, ?)", (301, "v301"))
        assert writer.flush(10, since=mark) is False  # one of them was lost, and it says so
        assert writer.stats()["lost"] == 1 and writer.stats()["backlog"] == 0
        later = writer.submitted
        writer.submit("INSERT INTO t (k, v) VALUES (?, ?)", (302, "v302"))
        assert writer.flush(10, since=later) is True  # the next ones are unaffected
    finally:
        writer.close()
    rows = _rows(path)
    assert [k for k, _ in rows] == [*range(300), 300, 301, 302]
    assert rows[7] == (7, "changed") and rows[5] == (5, "v5")
