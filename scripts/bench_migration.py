"""How long an upgrade holds a companion's start: migrating a store of layout 1 with N messages.

A store of the first layout (``messages``, ``memory``, ``seen``, as the release of 2026-11-30
wrote it: ``companion.store.layout.MIGRATIONS[:1]``) is filled with ``--messages`` messages from
``--senders`` companions and the seen ids of each, then migrated to today's layout with
:func:`companion.store.layout.migrate_sqlite` (the copy beside it, then the steps in one transaction),
as ``companion run`` does before its nodes start. The reference, measured in the same run on a
twin of the same file: SQLite's backup of it alone (the copy every migration makes), and reading
every row of it (what opening any store of that size costs at least). Each is the median of
``--rounds`` fresh files.

    python scripts/bench_migration.py [--messages 100000] [--senders 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from companion.protocol import Message, encode
from companion.store import layout
from companion.store.layout import migrate_sqlite
from companion.store.writer import transaction


def old_store(path: Path, messages: int, senders: int) -> None:
    """A layout-1 store as its release left it: the tables of ``MIGRATIONS[0]``, user_version 1."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    with transaction(db):
        layout.MIGRATIONS[0](db)
        rows = []
        for n in range(messages):
            sender = f"companion_{n % senders}"
            body = encode(Message.create(sender, ["user_x"], f"line {n} " + "word " * 20, id=f"m{n}"))
            rows.append((f"m{n}", sender, body.decode(), 1_796_000_000.0 + n))
        db.executemany("INSERT INTO messages (id, sender, body, stored_at) VALUES (?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO seen (kind, id) VALUES ('messages', ?)", [(r[0],) for r in rows])
        db.execute("PRAGMA user_version=1")
    db.close()


def backup_only(path: Path) -> None:
    source, copy = sqlite3.connect(path), sqlite3.connect(path.with_name("copy.sqlite3"))
    source.backup(copy)
    copy.close()
    source.close()


def read_all(path: Path) -> None:
    db = sqlite3.connect(path)
    for table in ("messages", "seen"):
        db.execute(f"SELECT * FROM {table}").fetchall()
    db.close()


def migrate(path: Path) -> None:
    assert migrate_sqlite(path) == 1


def timed(template: Path, work: Callable[[Path], None], rounds: int) -> float:
    """The median seconds of ``work`` on fresh copies of ``template``."""
    spent = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-migration-") as tmp:
            path = Path(tmp) / "companion.sqlite3"
            shutil.copyfile(template, path)
            started = time.perf_counter()
            work(path)
            spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--senders", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-migration-") as tmp:
        template = Path(tmp) / "template.sqlite3"
        old_store(template, args.messages, args.senders)
        size = template.stat().st_size
        migration = f"migrate 1 -> {layout.DATA_LAYOUT}"
        results = {
            "backup only (reference)": timed(template, backup_only, args.rounds),
            "read every row (reference)": timed(template, read_all, args.rounds),
            migration: timed(template, migrate, args.rounds),
        }
    print(f"store of layout 1: {args.messages} messages from {args.senders} companions, {size / 1e6:.1f} MB")
    for name, seconds in results.items():
        print(f"  {name:28} {seconds * 1000:8.0f} ms (median of {args.rounds})")
    ratio = results[migration] / results["backup only (reference)"]
    print(json.dumps({"messages": args.messages, "bytes": size, "ratio_to_backup": round(ratio, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
