"""Data layouts: every layout this project has written migrates forward keeping every row; a newer
one is refused with nothing changed; a failed migration leaves the old file as it was.

The fixture directories (``tests/layouts/*.tar.gz``) were written by old commits of this
repository (``tests/layouts/README.md``); ``tests/integration/test_run_layouts.py`` runs a real
companion on each.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from companion.actions import KeyValueStore
from companion.node.trust import TRUST_FILENAME, TrustError, TrustStore
from companion.store import layout
from companion.store.dirlock import DirectoryInUse, DirectoryLock
from companion.store.layout import (
    DATA_LAYOUT,
    MANIFEST,
    RELEASES,
    LayoutError,
    migrate_sqlite,
    prepare_data_dir,
)
from companion.store.sqlite import DB_FILENAME, Store
from support.layouts import COMPANIONS, FIXTURES, TABLES, digest, rows, unpack, version
from support.processes import killed_after


def test_every_layout_ever_written_has_a_fixture() -> None:
    """One fixture per distinct layout: the history of layout 1 (before and after the known
    companions, and the last one before layout 2), and layout 2 as release 0.2.0 wrote it (no
    ``decisions`` table: the code after it created one under layout 2 and took 0.2.0's files for
    up to date, so their companions could record no reply)."""
    assert FIXTURES == ["2026-11-30", "2026-12-01", "2026-12-05", "2026-12-05-0.2.0"]
    assert set(RELEASES) == set(range(1, DATA_LAYOUT + 1)) and len(layout.MIGRATIONS) == DATA_LAYOUT


def _shape(db: sqlite3.Connection) -> set[tuple[str, str, tuple[str, ...]]]:
    """Every table and index of a file, with a table's columns."""
    names = db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return {
        (kind, name, tuple(c[1] for c in db.execute(f"PRAGMA table_info({name})")) if kind == "table" else ())
        for kind, name in names
    }


def test_a_released_layout_is_what_its_steps_make_today(tmp_path: Path) -> None:
    """The steps up to a released layout are never changed after its release: a file that
    release wrote has exactly the tables, indexes and columns they make. (The code after 0.2.0
    added ``decisions`` to the step to layout 2, and took 0.2.0's files, which lack it, for up
    to date.) Layout 1 had no fixed shape (see ``companion.store.layout``): its fixtures are
    not compared."""
    compared = []
    for name in FIXTURES:
        data = unpack(name, tmp_path / name)
        for cid in COMPANIONS:
            path = data / cid / DB_FILENAME
            found = version(path)
            if found < 2:
                continue
            made = sqlite3.connect(tmp_path / f"{name}-{cid}-made.sqlite3", isolation_level=None)
            written = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
            try:
                for step in layout.MIGRATIONS[:found]:
                    step(made)
                assert _shape(written) == _shape(made), f"{name} {cid}: layout {found} as released"
            finally:
                made.close()
                written.close()
            compared.append((name, found))
    assert ("2026-12-05-0.2.0", 2) in compared


@pytest.mark.parametrize("name", FIXTURES)
def test_an_old_store_migrates_in_place_keeping_every_row_and_a_copy(tmp_path: Path, name: str) -> None:
    data = unpack(name, tmp_path)
    for cid in COMPANIONS:
        path = data / cid / DB_FILENAME
        before = rows(path)
        assert before["messages"], "the fixture holds a conversation"
        old_bytes, old = path.read_bytes(), version(path)
        assert old < DATA_LAYOUT

        assert migrate_sqlite(path) == old
        assert version(path) == DATA_LAYOUT
        after = rows(path)
        for table, kept in before.items():
            assert kept <= after[table], f"{cid}: rows of {table} lost"
        assert set(TABLES) <= set(after)
        # the companions its history heard from are known (filled in when the file had none)
        senders = {
            sender for (_, _, sender, _, _) in before["messages"] if str(sender).startswith("companion_")
        }
        assert senders <= {cid_ for (cid_, _) in after["companions"]}
        # the copy beside it is the old file, rows and layout
        copy = path.with_name(f"{DB_FILENAME}.v{old}.bak")
        assert rows(copy) == before and version(copy) == old
        assert len(copy.read_bytes()) <= len(old_bytes) + 4096
        # a second open changes nothing and copies nothing
        assert migrate_sqlite(path) == DATA_LAYOUT
        assert sorted(p.name for p in path.parent.glob("*.bak")) == [copy.name]
        with Store(path) as store, KeyValueStore.open(path):
            assert len(store) == len(before["messages"])
            assert senders <= set(store.known_companions())


def test_the_store_migrates_what_it_opens(tmp_path: Path) -> None:
    """Opened by the store alone (no ``companion run`` first), an old file is migrated too."""
    data = unpack("2026-12-01", tmp_path)
    path = data / "companion_pim" / DB_FILENAME
    count = len(rows(path)["messages"])
    with Store(path) as store:
        assert len(store) == count and "companion_ostra" in store.known_companions()
    assert version(path) == DATA_LAYOUT


def test_a_failed_migration_leaves_the_old_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps run in one transaction: a step that fails half-way leaves layout 1, every row,
    and no half-made table."""
    data = unpack("2026-11-30", tmp_path)
    path = data / "companion_pim" / DB_FILENAME
    before = rows(path)

    def half_then_fail(db: sqlite3.Connection) -> None:
        layout._to_2(db)
        raise sqlite3.OperationalError("disk I/O error (injected after the step ran)")

    monkeypatch.setattr(layout, "MIGRATIONS", (layout._to_1, half_then_fail))
    with pytest.raises(sqlite3.OperationalError, match="injected"):
        migrate_sqlite(path)
    assert version(path) == 1 and rows(path) == before
    monkeypatch.undo()
    assert migrate_sqlite(path) == 1 and version(path) == DATA_LAYOUT
    # the first copy is kept; the second try made its own
    assert sorted(p.name for p in path.parent.glob("*.bak")) == [
        f"{DB_FILENAME}.v1.1.bak",
        f"{DB_FILENAME}.v1.bak",
    ]


def test_a_newer_layout_is_refused_naming_file_version_and_release(tmp_path: Path) -> None:
    path = tmp_path / "companion_pim" / DB_FILENAME
    with Store(path):
        pass
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("INSERT INTO layout (version, release, reached_at) VALUES (7, '0.9.1', 0)")
    db.execute("PRAGMA user_version=7")
    db.close()
    before = digest(tmp_path)
    for opener in (migrate_sqlite, Store, KeyValueStore.open):
        with pytest.raises(LayoutError) as refused:
            opener(path)
        text = str(refused.value)
        assert str(path) in text and "data layout 7" in text and "companion 0.9.1 or newer" in text
        assert "nothing was changed" in text
    assert digest(tmp_path) == before


def test_the_directory_records_its_layout_and_refuses_a_newer_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert prepare_data_dir(data) == 0
    assert json.loads((data / MANIFEST).read_text()) == {
        "layout": DATA_LAYOUT,
        "release": RELEASES[DATA_LAYOUT],
    }
    assert prepare_data_dir(data) == DATA_LAYOUT
    (data / MANIFEST).write_text(json.dumps({"layout": DATA_LAYOUT + 1, "release": "9.0.0"}))
    before = digest(data)
    with pytest.raises(
        LayoutError, match=rf"(?s){MANIFEST} has data layout {DATA_LAYOUT + 1}.*9\.0\.0 or newer"
    ):
        prepare_data_dir(data)
    assert digest(data) == before
    (data / MANIFEST).write_text("garbage")
    with pytest.raises(LayoutError, match="not a layout record"):
        prepare_data_dir(data)
    assert (data / MANIFEST).read_text() == "garbage"


def test_the_trust_file_of_a_newer_directory_is_not_opened(tmp_path: Path) -> None:
    """``companion bridge`` and ``companion trust`` open a data directory through its trust file."""
    (tmp_path / MANIFEST).write_text(json.dumps({"layout": DATA_LAYOUT + 1, "release": "9.0.0"}))
    with pytest.raises(TrustError, match=rf"(?s)data layout {DATA_LAYOUT + 1}.*companion 9\.0\.0 or newer"):
        TrustStore.in_directory(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST]


def test_a_trust_file_of_a_later_format_is_refused_as_such(tmp_path: Path) -> None:
    path = tmp_path / TRUST_FILENAME
    path.write_text(json.dumps({"version": 2, "companions": {}, "keys": "new"}))
    before = path.read_bytes()
    with pytest.raises(TrustError, match="format version 2, written by a later release"):
        TrustStore(path)
    assert path.read_bytes() == before


def test_a_directory_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    """Within one process too: ``flock`` belongs to an open file, not to the process."""
    with DirectoryLock(tmp_path / "companion_pim"):
        with pytest.raises(DirectoryInUse) as refused:
            DirectoryLock(tmp_path / "companion_pim", what="companion_pim").acquire()
        assert f"in use by process {os.getpid()}" in str(refused.value)
        assert str(tmp_path / "companion_pim") in str(refused.value)
    with DirectoryLock(tmp_path / "companion_pim"):  # released: taken again
        pass


_KILLED_OLD_WRITER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")  # the row stays in the log, as a busy node's last ones do
db.execute("INSERT INTO messages (id, sender, body, stored_at) VALUES ('late', 'companion_late', '{}', 1)")
print("written", flush=True)
sys.stdin.read()
"""


def test_a_store_left_by_a_killed_process_migrates_with_its_log(tmp_path: Path) -> None:
    """An old release killed (SIGKILL) with rows still in its write-ahead log: the copy and the
    migrated store both hold them."""
    data = unpack("2026-11-30", tmp_path)
    path = data / "companion_pim" / DB_FILENAME
    with killed_after(_KILLED_OLD_WRITER, str(path), says="written"):
        pass
    assert path.with_name(f"{DB_FILENAME}-wal").stat().st_size > 0  # left unmerged
    assert migrate_sqlite(path) == 1
    for store in (path, path.with_name(f"{DB_FILENAME}.v1.bak")):
        db = sqlite3.connect(store)
        assert db.execute("SELECT sender FROM messages WHERE id = 'late'").fetchone() == ("companion_late",)
        db.close()
    db = sqlite3.connect(path)
    assert ("companion_late",) in db.execute("SELECT id FROM companions").fetchall()
    db.close()
