"""A companion's durable memory in one SQLite file: conversation history, working memory, seen ids.

A restarted node reopens the same file and continues the conversation with what it knew.
Every write commits on its own with ``synchronous=FULL`` in WAL mode, so once a call returns
the data survives a crash of the process (or the machine). The file lives under the
companion's data directory (:data:`DB_FILENAME`).

:class:`Store` and :class:`MemoryStore` implement :class:`companion.ports.ConversationStore`
(what the engine keeps: the conversation's messages once each, replied ids, known companions,
working memory) and :class:`companion.history.ConversationHistory`. Calls are synchronous and
short (one indexed statement each); the engine calls them from its trio task. A call that fails
raises and changed nothing. Strings from the network may hold lone surrogates (JSON allows
``"\\ud800"``); they are stored escaped, never refused with an encoding error.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from pydantic import ValidationError

from .log import log_event
from .protocol import Message, encode

__all__ = ["DB_FILENAME", "MemoryStore", "Store", "StoreError"]

logger = logging.getLogger("companion.store")

DB_FILENAME: Final = "companion.sqlite3"
SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    sender TEXT NOT NULL,
    body TEXT NOT NULL,
    stored_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS memory (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS seen (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    UNIQUE (kind, id)
);
CREATE TABLE IF NOT EXISTS companions (
    id TEXT PRIMARY KEY,
    first_seen REAL NOT NULL
);
"""
_REPLIED: Final = "replied"


def _safe(text: str) -> str:
    """``text`` as SQLite can bind it: unchanged, or JSON-escaped if it holds a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(text)
    return text


def _safe_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, allow_nan=False)
    return text


class StoreError(RuntimeError):
    """The store cannot be used (unreadable file, newer schema, closed)."""


class Store:
    """History, working memory and seen ids of one companion, in SQLite.

    ``seen_limit`` bounds the seen-id table: the oldest ids are forgotten first (a replay older
    than that is caught by the history's unique message ids anyway).
    """

    def __init__(self, path: str | Path, *, seen_limit: int = 10_000) -> None:
        self.path = Path(path)
        self._seen_limit = seen_limit
        self._seen_inserts = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db: sqlite3.Connection | None = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}; this companion knows {SCHEMA_VERSION}"
                )
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc

    @classmethod
    def in_directory(cls, data_dir: str | Path, **kwargs: Any) -> Store:
        """The store of the companion whose data directory is ``data_dir``."""
        return cls(Path(data_dir) / DB_FILENAME, **kwargs)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"the store at {self.path} is closed")
        return self._db

    # --- history -------------------------------------------------------------------------------

    def record(self, message: Message) -> bool:
        """Record ``message``; ``False`` if a message with its id was already recorded."""
        body = encode(message).decode("utf-8")
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO messages (id, sender, body, stored_at) VALUES (?, ?, ?, ?)",
            (_safe(message.params.id), _safe(message.params.from_), body, time.time()),
        )
        return cursor.rowcount == 1

    def add(self, message: Message) -> bool:
        """:meth:`record` (the older name)."""
        return self.record(message)

    def append(self, message: Message) -> None:
        """:class:`~companion.history.ConversationHistory`: record once, the first copy wins."""
        self.record(message)

    def recent(self, limit: int) -> list[Message]:
        """The last ``limit`` messages, oldest first."""
        if limit <= 0:
            return []
        rows = self._conn.execute(
            "SELECT seq, body FROM messages ORDER BY seq DESC LIMIT ?", (limit,)
        ).fetchall()
        out: list[Message] = []
        for seq, body in reversed(rows):
            # Rows were checked when they arrived; read them back as they were stored (the edge's
            # stricter text rules must not make an accepted message unreadable later).
            try:
                out.append(Message.model_validate(json.loads(body)))
            except (ValueError, ValidationError, RecursionError):
                log_event(logger, "store_row_unreadable", logging.ERROR, path=str(self.path), seq=seq)
        return out

    def has_message(self, message_id: str) -> bool:
        row = self._conn.execute("SELECT 1 FROM messages WHERE id = ?", (_safe(message_id),)).fetchone()
        return row is not None

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])

    # --- working memory -----------------------------------------------------------------------

    def remember(self, key: str, value: Any) -> None:
        """Keep a JSON-able ``value`` under ``key`` (replacing what was there)."""
        text = _safe_json(value)
        self._conn.execute(
            "INSERT INTO memory (key, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (_safe(key), text, time.time()),
        )

    def recall(self, key: str, default: Any = None) -> Any:
        row = self._conn.execute("SELECT value FROM memory WHERE key = ?", (_safe(key),)).fetchone()
        return default if row is None else json.loads(row[0])

    def forget(self, key: str) -> None:
        self._conn.execute("DELETE FROM memory WHERE key = ?", (_safe(key),))

    def memory(self) -> dict[str, Any]:
        """All of the working memory, by key."""
        rows = self._conn.execute("SELECT key, value FROM memory ORDER BY key").fetchall()
        return {key: json.loads(value) for key, value in rows}

    # --- seen ids -----------------------------------------------------------------------------

    def mark_seen(self, kind: str, item_id: str) -> bool:
        """Note that ``item_id`` of ``kind`` was handled; ``False`` if it had been already."""
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO seen (kind, id) VALUES (?, ?)", (_safe(kind), _safe(item_id))
        )
        fresh = cursor.rowcount == 1
        if fresh:
            self._seen_inserts += 1
            if self._seen_inserts >= max(1, self._seen_limit // 10):
                self._seen_inserts = 0
                self._prune_seen()
        return fresh

    def seen(self, kind: str, item_id: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM seen WHERE kind = ? AND id = ?", (_safe(kind), _safe(item_id))
        ).fetchone()
        return row is not None

    def mark_replied(self, message_id: str) -> bool:
        return self.mark_seen(_REPLIED, message_id)

    def replied(self, message_id: str) -> bool:
        return self.seen(_REPLIED, message_id)

    # --- known companions -----------------------------------------------------------------------

    def remember_companion(self, companion_id: str) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO companions (id, first_seen) VALUES (?, ?)",
            (_safe(companion_id), time.time()),
        )

    def known_companions(self) -> list[str]:
        rows = self._conn.execute("SELECT id FROM companions ORDER BY first_seen").fetchall()
        return [json.loads(cid) if cid.startswith('"') else cid for (cid,) in rows]  # see _safe

    def _prune_seen(self) -> None:
        self._conn.execute(
            "DELETE FROM seen WHERE seq <= (SELECT MAX(seq) FROM seen) - ?", (self._seen_limit,)
        )


class MemoryStore:
    """The same, in memory and bounded, for an engine without a data directory (tests, the
    in-memory demo): the last ``capacity`` messages are kept, duplicates caught among the last
    ``seen_limit`` ids."""

    def __init__(self, capacity: int = 1000, *, seen_limit: int = 10_000) -> None:
        self._messages: OrderedDict[str, Message] = OrderedDict()
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._replied: OrderedDict[str, None] = OrderedDict()
        self._companions: dict[str, None] = {}
        self._values: dict[str, Any] = {}
        self._capacity = capacity
        self._seen_limit = seen_limit

    @staticmethod
    def _add(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> bool:
        if key in table:
            return False
        table[key] = value
        while len(table) > limit:
            table.popitem(last=False)
        return True

    def record(self, message: Message) -> bool:
        if not self._add(self._ids, message.params.id, None, self._seen_limit):
            return False
        self._add(self._messages, message.params.id, message, self._capacity)
        return True

    def append(self, message: Message) -> None:
        self.record(message)

    def recent(self, limit: int) -> list[Message]:
        return list(self._messages.values())[-limit:] if limit > 0 else []

    def __len__(self) -> int:
        return len(self._messages)

    def mark_replied(self, message_id: str) -> bool:
        return self._add(self._replied, message_id, None, self._seen_limit)

    def replied(self, message_id: str) -> bool:
        return message_id in self._replied

    def remember_companion(self, companion_id: str) -> None:
        self._companions[companion_id] = None

    def known_companions(self) -> list[str]:
        return list(self._companions)

    def remember(self, key: str, value: Any) -> None:
        self._values[key] = value

    def recall(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def memory(self) -> dict[str, Any]:
        return dict(self._values)
