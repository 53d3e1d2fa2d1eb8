"""The layout of a data directory: its version, and the forward migrations that bring an old one up.

Why: a companion is left running for months and upgraded in place; a directory written by an
older release must open with every message, memory, pin and key it held, and one written by a
newer release must be refused before anything in it is changed (an older release cannot know
what a newer one meant). One number, :data:`DATA_LAYOUT`, names the layout of everything a
node writes under its data directory; ``companion -V`` prints it.

Where the version is recorded:

- each companion's SQLite file (``<id>/companion.sqlite3``: history, working memory, seen ids,
  known companions, the tools' values) in ``PRAGMA user_version``, and in its ``layout`` table,
  one row per layout it reached (the release that wrote it and when);
- the directory as a whole in :data:`MANIFEST` (``layout.json``: the layout and the release),
  which covers the files that carry no version of their own: the node keys (``keys/*.key``,
  libp2p's own encoding) and the replay ids (``replay/*.ids``); ``trust.json`` also has its own
  ``version`` field (:mod:`companion.node.trust`).

Every layout this project has written, and what reads it now (``tests/layouts/`` holds a data
directory written by each, with the commit and the command that wrote it):

- **0** (or an empty file): nothing yet;
- **1** (2026-11-30 to 2026-12-05, the ``0.1.0`` line): ``messages``, ``memory`` and ``seen``
  with ``user_version`` 1; from 2026-12-01 also ``companions`` and the tools' ``action_store``,
  still under ``user_version`` 1 (the code before this module created missing tables at each
  open and then stopped doing so, which is how a directory of 2026-12-01 came to fail with
  ``no such table: companions``);
- **2** (``0.2.0``): every table of layout 1, present, the known companions filled in from the
  history for a file that had none, and the ``layout`` table;
- **3** (``0.3.0``): the ``decisions`` table (``companion explain``). The code after 0.2.0 created
  it under layout 2, so a directory 0.2.0 wrote opened as up to date and every reply failed to
  be recorded (``no such table: decisions``), i.e. its companions never spoke again.

A migration runs when a file is opened: a copy of the old file is made beside it
(``companion.sqlite3.v1.bak``, with SQLite's backup API, so the copy is consistent even with a
write-ahead log), then every step runs in one transaction (all of it, or nothing), ending with
the new ``user_version`` and a ``layout`` row. A future layout change is one more function in
:data:`MIGRATIONS` (from the version before it), one more entry in :data:`RELEASES`, and one
more fixture directory in ``tests/layouts/`` written by the release before it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from companion.log import log_event
from companion.store.writer import transaction

__all__ = [
    "DATA_LAYOUT",
    "MANIFEST",
    "MIGRATIONS",
    "RELEASES",
    "LayoutError",
    "connect_read_only",
    "migrate_sqlite",
    "prepare_data_dir",
    "refuse_newer",
]

logger = logging.getLogger("companion.store.layout")

RELEASES: Final[dict[int, str]] = {1: "0.1.0", 2: "0.2.0", 3: "0.3.0"}
"""The first release of companion that writes each layout (and reads it)."""
DATA_LAYOUT: Final = max(RELEASES)
"""The layout this code writes; it reads this one and every older one (migrating them)."""
MANIFEST: Final = "layout.json"
"""The data directory's own record of its layout, for the files that have no version inside."""
MAX_BACKUPS: Final = 100
"""Copies of one file's old layout kept side by side at most (a name is never reused)."""


class LayoutError(ValueError):
    """A file of a layout this code cannot read (newer, or unreadable); nothing was changed.
    The message names the file, its layout, the release that reads it, and what to do."""


# --- the migrations: step ``n`` takes a file from layout ``n`` to ``n + 1`` -------------------


def _to_1(db: sqlite3.Connection) -> None:
    """The first layout (2026-11-30): the history, working memory and seen ids."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL"
        " UNIQUE, sender TEXT NOT NULL, body TEXT NOT NULL, stored_at REAL NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS memory (key TEXT PRIMARY KEY, value TEXT NOT NULL,"
        " updated_at REAL NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS seen (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,"
        " id TEXT NOT NULL, UNIQUE (kind, id))"
    )


def _to_2(db: sqlite3.Connection) -> None:
    """Known companions and the tools' values (both written under layout 1 from 2026-12-01 on,
    missing from the files of before) and the ``layout`` table. The known companions of a file
    that had none are the companions its history heard from (a restarted node then counts them
    as leaders at once, as it does for the ones it remembered itself)."""
    db.execute("CREATE TABLE IF NOT EXISTS companions (id TEXT PRIMARY KEY, first_seen REAL NOT NULL)")
    db.execute(
        "INSERT OR IGNORE INTO companions (id, first_seen) SELECT sender, MIN(stored_at) FROM messages"
        " WHERE sender LIKE 'companion\\_%' ESCAPE '\\' GROUP BY sender"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS action_store (companion TEXT NOT NULL, namespace TEXT NOT NULL,"
        " key TEXT NOT NULL, value TEXT NOT NULL, size INTEGER NOT NULL, updated_at REAL NOT NULL,"
        " PRIMARY KEY (companion, namespace, key)) WITHOUT ROWID"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS layout (version INTEGER PRIMARY KEY, release TEXT NOT NULL,"
        " reached_at REAL NOT NULL)"
    )


def _to_3(db: sqlite3.Connection) -> None:
    """The decisions kept for ``companion explain`` (new after 0.2.0; a file of layout 2 that
    the code between 0.2.0 and this layout wrote has them already)."""
    # The turn-taking decisions a companion made or saw, per message, for `companion explain`:
    # one row per engine event that names a message (`kind` is the event's name, `fields` its
    # fields as JSON, `reply_id` the reply it produced, if any); the store keeps the newest
    # `DECISIONS_KEPT` rows.
    db.execute(
        "CREATE TABLE IF NOT EXISTS decisions (seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT"
        " NOT NULL, reply_id TEXT, at REAL NOT NULL, kind TEXT NOT NULL, level TEXT NOT NULL,"
        " fields TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS decisions_by_message ON decisions (message_id)")
    db.execute("CREATE INDEX IF NOT EXISTS decisions_by_reply ON decisions (reply_id)")


MIGRATIONS: Final[tuple[Callable[[sqlite3.Connection], None], ...]] = (_to_1, _to_2, _to_3)
"""``MIGRATIONS[n]`` brings a file of layout ``n`` to ``n + 1``, inside the caller's transaction
(no ``executescript``: it would commit). Each step tolerates what a file of its layout may
already hold (``IF NOT EXISTS``, ``OR IGNORE``)."""

assert len(MIGRATIONS) == DATA_LAYOUT, "one migration per layout, and one release per layout"


# --- SQLite files ---------------------------------------------------------------------------


def _newer(path: Path, found: int, release: str | None) -> LayoutError:
    reader = f"companion {release} or newer" if release else "a newer release of companion"
    return LayoutError(
        f"{path} has data layout {found}, newer than this companion reads "
        f"(layout {DATA_LAYOUT}, companion {RELEASES[DATA_LAYOUT]}); nothing was changed\n"
        f"    fix: run {reader} on this data directory, or point --data-dir elsewhere"
    )


def _release_of(db: sqlite3.Connection, version: int) -> str | None:
    """The release a file says wrote ``version`` (its ``layout`` table), if it says."""
    try:
        row = db.execute("SELECT release FROM layout WHERE version = ?", (version,)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0])[:40] if row else None


def _backup_path(path: Path, version: int) -> Path:
    for n in range(MAX_BACKUPS):
        candidate = path.with_name(f"{path.name}.v{version}{f'.{n}' if n else ''}.bak")
        if not candidate.exists():
            return candidate
    raise LayoutError(
        f"{path}: {MAX_BACKUPS} copies of its layout {version} are kept beside it already; "
        "nothing was changed\n    fix: move the old *.bak copies away"
    )


def _backup(db: sqlite3.Connection, path: Path, version: int) -> Path:
    """A consistent copy of the file as it is now, durable before the migration starts."""
    target = _backup_path(path, version)
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    copy = sqlite3.connect(tmp)
    try:
        db.backup(copy)
    finally:
        copy.close()
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def _has_tables(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone() is not None


def migrate_sqlite(path: Path, *, timeout: float = 5.0) -> int:
    """Bring the SQLite file at ``path`` to :data:`DATA_LAYOUT` (creating it if it does not
    exist): the layout it had. Raises :class:`LayoutError` for a newer layout (nothing changed),
    ``sqlite3.Error`` / ``OSError`` for a file SQLite cannot use. A file with data is copied
    beside itself first; the steps run in one transaction."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, timeout=timeout)
    try:
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
        if found > DATA_LAYOUT:
            raise _newer(path, found, _release_of(db, found))
        if found == DATA_LAYOUT:
            return found
        db.execute("PRAGMA journal_mode=WAL")
        backup = _backup(db, path, found) if _has_tables(db) else None
        with transaction(db):
            found = int(db.execute("PRAGMA user_version").fetchone()[0])  # another opener was first
            for step in MIGRATIONS[found:]:
                step(db)
            now = time.time()
            for version in range(max(found, 2), DATA_LAYOUT + 1):  # the table exists from 2 on
                db.execute(
                    "INSERT OR IGNORE INTO layout (version, release, reached_at) VALUES (?, ?, ?)",
                    (version, RELEASES[version], now),
                )
            db.execute(f"PRAGMA user_version={DATA_LAYOUT}")
        if backup is not None:
            log_event(logger, "layout_migrated", path=str(path), old=found, new=DATA_LAYOUT, copy=str(backup))
        return found
    finally:
        db.close()


# --- the directory --------------------------------------------------------------------------


def _recorded(data_dir: Path) -> tuple[int, str | None]:
    """The layout and release :data:`MANIFEST` records (``(0, None)`` when there is none)."""
    path = data_dir / MANIFEST
    try:
        raw = path.read_bytes()[:4096]
    except FileNotFoundError:
        return 0, None
    except OSError as exc:
        raise LayoutError(f"{path}: cannot read the data directory's layout: {exc}") from None
    try:
        body = json.loads(raw)
        release = body.get("release")
        return int(body["layout"]), str(release)[:40] if release else None
    except (ValueError, TypeError, KeyError, AttributeError):
        raise LayoutError(
            f'{path}: not a layout record (expected {{"layout": N, ...}})\n'
            f"    fix: delete it if this directory was written by companion {RELEASES[1]} to "
            f"{RELEASES[DATA_LAYOUT]}; it is written again at the next start"
        ) from None


def connect_read_only(path: str | Path) -> sqlite3.Connection:
    """A connection that changes nothing on disk, to a store that may be in use: a file closed
    cleanly (no write-ahead log beside it: the last connection removes it) is opened as
    immutable, since even a read-only open of a WAL file leaves its ``-shm`` and ``-wal`` behind
    (``companion explain`` left both beside a stopped node's store); with a log, whether a node
    writes it now or a killed one left it, the log is read. A missing file is not created."""
    path = Path(path).resolve()
    wal = path.with_name(path.name + "-wal")
    return sqlite3.connect(f"{path.as_uri()}?mode=ro{'' if wal.exists() else '&immutable=1'}", uri=True)


def refuse_newer(data_dir: Path, stores: Iterable[Path] = ()) -> None:
    """Raise :class:`LayoutError` if the directory or one of the SQLite files ``stores`` has a
    layout newer than this code's; reads only (check everything before changing anything)."""
    found, release = _recorded(data_dir)
    if found > DATA_LAYOUT:
        raise _newer(data_dir / MANIFEST, found, release)
    for path in stores:
        if not path.exists():
            continue
        try:
            db = connect_read_only(path)
            try:
                found = int(db.execute("PRAGMA user_version").fetchone()[0])
                release = _release_of(db, found) if found > DATA_LAYOUT else None
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise LayoutError(
                f"{path}: cannot read its layout: {exc}; nothing was changed\n"
                "    fix: restore it from a copy (a companion.sqlite3.v*.bak beside it, if any), "
                "or move it away to start this companion's history anew"
            ) from None
        if found > DATA_LAYOUT:
            raise _newer(path, found, release)


def prepare_data_dir(data_dir: Path) -> int:
    """Check the layout :data:`MANIFEST` of ``data_dir`` records and bring it to
    :data:`DATA_LAYOUT`: the layout it had (0 for a directory without one). Raises
    :class:`LayoutError` for a newer or unreadable manifest; nothing is changed then."""
    found, release = _recorded(data_dir)
    if found > DATA_LAYOUT:
        raise _newer(data_dir / MANIFEST, found, release)
    if found < DATA_LAYOUT:
        # keys, replay ids and trust.json have kept their formats since layout 1: the record
        # is all that changes here (a future format change of theirs migrates here first)
        data_dir.mkdir(parents=True, exist_ok=True)
        body = {"layout": DATA_LAYOUT, "release": RELEASES[DATA_LAYOUT]}
        path = data_dir / MANIFEST
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body) + "\n", encoding="ascii")
        os.replace(tmp, path)
    return found
