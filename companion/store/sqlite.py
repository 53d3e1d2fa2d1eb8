"""A companion's durable memory in one SQLite file: conversation history, working memory, seen ids.

A restarted node reopens the same file and continues the conversation with what it knew. The
file lives under the companion's data directory (:data:`DB_FILENAME`), in WAL mode. Its tables
and their versions are :mod:`companion.store.layout`'s: a file of an older release is migrated when it
is opened, one of a newer release refused (:class:`~companion.store.layout.LayoutError`).

:class:`Store` and :class:`MemoryStore` implement :class:`companion.ports.ConversationStore`
(what the engine keeps: the conversation's messages once each, replied ids, known companions,
working memory) and :class:`companion.store.history.ConversationHistory`. The engine calls them from
its trio task, for every message, so no call waits for the disk: :class:`Store` answers from an
in-memory view loaded at open (the known companions, the working memory, the seen ids, the
last ``tail`` messages and the last ``id_window`` message ids) and writes behind, through a
:class:`~companion.store.writer.SqlWriter` thread that commits in batches (``batch_window``
seconds) with ``synchronous=NORMAL``. Only a message id older than the id window, or more
history than the tail, is looked up on disk (one indexed read; reads never wait for a writer).

Durability, exactly: a call returns once the view changed and the write is queued.
:meth:`Store.flush` returns once everything queued before it is committed; :meth:`Store.close`
(and :meth:`Store.serve`, which a node's nursery runs, when it is cancelled) flushes before it
closes, so a node that stops keeps every message. A process that is killed loses at most what
it queued in the last batch window (and the commit in flight); a seen or replied mark skips the
window (committed by the next commit, milliseconds, but still after the call returned, so a
reply published in those milliseconds before a kill may be answered again after the restart);
a power cut may also roll back the commits since the last WAL checkpoint
(``synchronous=NORMAL``), leaving a consistent file.
A disk that fails (read-only, full) is logged and counted (:meth:`Store.stats`), never raised:
the node keeps running on its view, and the writer retries (see :mod:`companion.store.writer`).
Strings from the network may hold lone surrogates (JSON allows ``"\\ud800"``); they are stored
escaped, never refused with an encoding error.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NamedTuple

import trio
from pydantic import ValidationError

from companion.log import log_event
from companion.protocol import Message, encode
from companion.store.layout import connect_read_only, migrate_sqlite
from companion.store.writer import SqlWriter

__all__ = [
    "DB_FILENAME",
    "DECISIONS_KEPT",
    "Decision",
    "MemoryStore",
    "Store",
    "StoreError",
    "read_decisions",
    "read_history",
    "read_message",
]

logger = logging.getLogger("companion.store.sqlite")

DB_FILENAME: Final = "companion.sqlite3"
_REPLIED: Final = "replied"

DECISIONS_KEPT: Final = 20_000
"""Decisions a companion keeps (the newest; 5 per turn it took part in, measured with two
companions, more with yields and failures: the last few thousand turns), each at most
:data:`MAX_DECISION_BYTES` of fields."""
MAX_DECISION_BYTES: Final = 4_000


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
    """The store cannot be used (unreadable file, closed); a newer layout is a
    :class:`~companion.store.layout.LayoutError`."""


def _unsafe(text: str) -> str:
    """The text :func:`_safe` was given: JSON-decoded only if that yields a lone surrogate."""
    if text.startswith('"'):
        try:
            decoded = json.loads(text)
        except ValueError:
            return text
        if isinstance(decoded, str) and _safe(decoded) != decoded:
            return decoded
    return text


class Store:
    """History, working memory and seen ids of one companion, in SQLite, written behind.

    ``seen_limit`` bounds the seen ids (on disk and in the view): the oldest are forgotten
    first (a replay older than that is caught by the history's unique message ids anyway).
    ``tail`` messages and ``id_window`` message ids are kept in the view; ``batch_window`` is
    how long the writer waits to gather a batch (what a killed process may lose).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        seen_limit: int = 10_000,
        tail: int = 512,
        id_window: int = 10_000,
        batch_window: float = 0.02,
    ) -> None:
        self.path = Path(path)
        self._seen_limit = seen_limit
        self._seen_inserts = 0
        self._decision_inserts = 0
        self._id_window = max(1, id_window)
        self._db: sqlite3.Connection | None = None
        try:
            migrate_sqlite(self.path)  # an older layout is brought up (a newer one refused) first
            self._db = db = sqlite3.connect(self.path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=5000")
            self._load(db, max(1, tail))
            self._writer = SqlWriter(
                self.path, synchronous="NORMAL", batch_window=batch_window, name=self.path.parent.name
            )
        except (sqlite3.Error, OSError) as exc:
            if self._db is not None:
                self._db.close()
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc

    def _load(self, db: sqlite3.Connection, tail: int) -> None:
        """The in-memory view, from the file."""
        self._count = int(db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
        rows = db.execute("SELECT id FROM messages ORDER BY seq DESC LIMIT ?", (self._id_window,))
        self._ids: OrderedDict[str, None] = OrderedDict(
            (_unsafe(i), None) for (i,) in reversed(rows.fetchall())
        )
        self._ids_complete = len(self._ids) == self._count  # every stored id is in the view
        self._tail: deque[Message] = deque(self._read_recent(db, tail), maxlen=tail)
        rows = db.execute("SELECT kind, id FROM seen ORDER BY seq DESC LIMIT ?", (self._seen_limit,))
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict(
            ((_unsafe(k), _unsafe(i)), None) for k, i in reversed(rows.fetchall())
        )
        rows = db.execute("SELECT id FROM companions ORDER BY first_seen")
        self._companions: dict[str, None] = {_unsafe(cid): None for (cid,) in rows.fetchall()}
        rows = db.execute("SELECT key, value FROM memory ORDER BY key")
        self._values: dict[str, str] = {_unsafe(key): value for key, value in rows.fetchall()}

    @classmethod
    def in_directory(cls, data_dir: str | Path, **kwargs: Any) -> Store:
        """The store of the companion whose data directory is ``data_dir``."""
        return cls(Path(data_dir) / DB_FILENAME, **kwargs)

    # --- lifetime ----------------------------------------------------------------------------

    @property
    def writes(self) -> int:
        """How many writes were made so far: a mark for :meth:`flush`'s ``since``."""
        return self._writer.submitted

    def sync(self, timeout: float = 10.0, *, since: int = 0) -> bool:
        """Wait, blocking this thread, until every write so far is committed: ``True``, or
        ``False`` if one after the first ``since`` (a :attr:`writes` mark) was lost to a failing
        disk or ``timeout`` seconds passed."""
        self._conn  # noqa: B018 -- raises when closed
        return self._writer.flush(timeout, since=since)

    async def flush(self, timeout: float = 10.0, *, since: int = 0) -> bool:
        """:meth:`sync`, waited for in a worker thread so the loop runs on meanwhile (the engine
        awaits it between marking a message replied and publishing the reply)."""
        self._conn  # noqa: B018 -- raises here, on the loop, when closed
        return await trio.to_thread.run_sync(lambda: self.sync(timeout, since=since))

    def stats(self) -> dict[str, int]:
        """The writer's counters: ``committed``, ``batches``, ``failures``, ``lost``, ``backlog``."""
        return self._writer.stats()

    def observe_commits(self, callback: Callable[[float], None] | None) -> None:
        """Call ``callback`` with the seconds each committed batch took (from the writer's
        thread: :attr:`SqlWriter.on_commit <companion.store.writer.SqlWriter.on_commit>`)."""
        self._writer.on_commit = callback

    def close(self, timeout: float = 10.0) -> None:
        """Flush (within ``timeout``), stop the writer and close the file. Blocks this thread:
        from trio, use :meth:`aclose`."""
        if self._db is not None:
            db, self._db = self._db, None
            self._finish(self._writer.close(timeout))
            db.close()

    async def aclose(self, timeout: float = 10.0) -> None:
        """:meth:`close`, the flush waited for in a worker thread, not on the loop."""
        if self._db is not None:
            db, self._db = self._db, None
            self._finish(await trio.to_thread.run_sync(self._writer.close, timeout))
            db.close()

    async def serve(self) -> None:
        """Keep the store open until cancelled, then flush and close it without blocking the
        loop: run it in the nursery of the node the store serves, so stopping it keeps every
        message."""
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self.aclose()

    def _finish(self, complete: bool) -> None:
        stats = self._writer.stats()
        level = logging.INFO if complete else logging.ERROR
        log_event(logger, "store_closed", level, path=str(self.path), complete=complete, **stats)

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

    def _write(self, sql: str, *params: Any, urgent: bool = False) -> None:
        self._conn  # noqa: B018 -- raises when closed
        self._writer.submit(sql, params, urgent=urgent)

    # --- history -------------------------------------------------------------------------------

    def record(self, message: Message) -> bool:
        """Record ``message``; ``False`` if a message with its id was already recorded."""
        mid = message.params.id
        if self.has_message(mid):
            return False
        body = encode(message).decode("utf-8")
        self._write(
            "INSERT OR IGNORE INTO messages (id, sender, body, stored_at) VALUES (?, ?, ?, ?)",
            _safe(mid),
            _safe(message.params.from_),
            body,
            time.time(),
        )
        self._ids[mid] = None
        if len(self._ids) > self._id_window:
            self._ids.popitem(last=False)
            self._ids_complete = False
        self._tail.append(message)
        self._count += 1
        return True

    def add(self, message: Message) -> bool:
        """:meth:`record` (the older name)."""
        return self.record(message)

    def append(self, message: Message) -> None:
        """:class:`~companion.store.history.ConversationHistory`: record once, the first copy wins."""
        self.record(message)

    def recent(self, limit: int) -> list[Message]:
        """The last ``limit`` messages, oldest first."""
        db = self._conn
        if limit <= 0:
            return []
        if limit <= len(self._tail) or self._count <= len(self._tail):
            return list(self._tail)[-limit:]
        # Older than the tail: from the file, which may not hold the newest (queued) ones yet,
        # all of them in the tail (unless a failing disk let the queue outgrow it).
        tail_ids = {m.params.id for m in self._tail}
        rows = self._read_recent(db, limit + len(self._tail))
        older = [m for m in rows if m.params.id not in tail_ids]
        return [*older, *self._tail][-limit:]

    def _read_recent(self, db: sqlite3.Connection, limit: int) -> list[Message]:
        rows = db.execute("SELECT seq, body FROM messages ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
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
        db = self._conn
        if message_id in self._ids:
            return True
        if self._ids_complete:
            return False
        row = db.execute("SELECT 1 FROM messages WHERE id = ?", (_safe(message_id),)).fetchone()
        return row is not None

    def __len__(self) -> int:
        self._conn  # noqa: B018 -- raises when closed
        return self._count

    # --- working memory -----------------------------------------------------------------------

    def remember(self, key: str, value: Any) -> None:
        """Keep a JSON-able ``value`` under ``key`` (replacing what was there)."""
        text = _safe_json(value)
        self._write(
            "INSERT INTO memory (key, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            _safe(key),
            text,
            time.time(),
        )
        self._values[key] = text

    def recall(self, key: str, default: Any = None) -> Any:
        self._conn  # noqa: B018 -- raises when closed
        text = self._values.get(key)
        return default if text is None else json.loads(text)

    def forget(self, key: str) -> None:
        self._write("DELETE FROM memory WHERE key = ?", _safe(key))
        self._values.pop(key, None)

    def memory(self) -> dict[str, Any]:
        """All of the working memory, by key (fresh copies)."""
        self._conn  # noqa: B018 -- raises when closed
        return {key: json.loads(self._values[key]) for key in sorted(self._values)}

    # --- seen ids -----------------------------------------------------------------------------

    def mark_seen(self, kind: str, item_id: str) -> bool:
        """Note that ``item_id`` of ``kind`` was handled; ``False`` if it had been already.
        Committed at once, without the batch window: the engine marks a message replied just
        before its reply goes out, and a restart must not answer it twice."""
        if self.seen(kind, item_id):
            return False
        sql = "INSERT OR IGNORE INTO seen (kind, id) VALUES (?, ?)"
        self._write(sql, _safe(kind), _safe(item_id), urgent=True)
        self._seen[(kind, item_id)] = None
        if len(self._seen) > self._seen_limit:
            self._seen.popitem(last=False)
        self._seen_inserts += 1
        if self._seen_inserts >= max(1, self._seen_limit // 10):
            self._seen_inserts = 0
            self._write("DELETE FROM seen WHERE seq <= (SELECT MAX(seq) FROM seen) - ?", self._seen_limit)
        return True

    def seen(self, kind: str, item_id: str) -> bool:
        self._conn  # noqa: B018 -- raises when closed
        return (kind, item_id) in self._seen

    def mark_replied(self, message_id: str) -> bool:
        return self.mark_seen(_REPLIED, message_id)

    def replied(self, message_id: str) -> bool:
        return self.seen(_REPLIED, message_id)

    def replied_ids(self) -> list[str]:
        self._conn  # noqa: B018 -- raises when closed
        return [item_id for kind, item_id in self._seen if kind == _REPLIED]

    # --- decisions ----------------------------------------------------------------------------

    def record_decision(
        self, message_id: str, kind: str, fields: dict[str, Any], *, level: str = "INFO"
    ) -> None:
        """Keep one decision about ``message_id`` (the ``decisions`` table of data layout 3),
        written behind; fields beyond :data:`MAX_DECISION_BYTES` of JSON are cut to their first keys."""
        text = _bounded_json(fields, MAX_DECISION_BYTES)
        reply_id = fields.get("reply_id")
        self._write(
            "INSERT INTO decisions (message_id, reply_id, at, kind, level, fields) VALUES (?, ?, ?, ?, ?, ?)",
            _safe(message_id),
            _safe(reply_id) if isinstance(reply_id, str) else None,
            time.time(),
            _safe(kind),
            level,
            text,
        )
        self._decision_inserts += 1
        if self._decision_inserts >= DECISIONS_KEPT // 10:
            self._decision_inserts = 0
            self._write(
                "DELETE FROM decisions WHERE seq <= (SELECT MAX(seq) FROM decisions) - ?", DECISIONS_KEPT
            )

    # --- known companions -----------------------------------------------------------------------

    def remember_companion(self, companion_id: str) -> None:
        if companion_id in self._companions:
            self._conn  # noqa: B018 -- raises when closed
            return
        self._write(
            "INSERT OR IGNORE INTO companions (id, first_seen) VALUES (?, ?)",
            _safe(companion_id),
            time.time(),
        )
        self._companions[companion_id] = None

    def known_companions(self) -> list[str]:
        self._conn  # noqa: B018 -- raises when closed
        return list(self._companions)


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

    def replied_ids(self) -> list[str]:
        return list(self._replied)

    @property
    def writes(self) -> int:
        return 0

    async def flush(self, timeout: float = 10.0, *, since: int = 0) -> bool:
        return True

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


def _bounded_json(fields: dict[str, Any], limit: int) -> str:
    """``fields`` as JSON of at most about ``limit`` bytes: the first keys that fit, whole."""
    text = _safe_json(fields)
    if len(text) <= limit:
        return text
    kept: dict[str, Any] = {}
    for key, value in fields.items():
        kept[key] = value
        if len(_safe_json(kept)) > limit - 40:
            del kept[key]
            break
    kept["truncated"] = True
    return _safe_json(kept)


class Decision(NamedTuple):
    """One row of the ``decisions`` table, read back (:func:`read_decisions`)."""

    seq: int
    message_id: str
    reply_id: str | None
    at: float
    kind: str
    level: str
    fields: dict[str, Any]


def _read_only(path: str | Path, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """The rows of ``sql`` on the store file at ``path``, opened read-only (beside a node that
    runs, in WAL mode: nothing is written, a missing file is not created); ``[]`` when the file
    or the table is not there or cannot be read."""
    try:
        db = connect_read_only(path)
    except sqlite3.Error:
        return []
    try:
        db.execute("PRAGMA busy_timeout=2000")
        return db.execute(sql, params).fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()


def read_decisions(path: str | Path, *, message_id: str | None = None, limit: int = 1_000) -> list[Decision]:
    """The decisions kept in the store file at ``path``, oldest first: about ``message_id``
    (the turn on it, and the one that produced it as a reply), else the newest ``limit``.
    Read-only; a file without the table (an older layout) reads as ``[]``."""
    if message_id is None:
        sql = "SELECT * FROM (SELECT * FROM decisions ORDER BY seq DESC LIMIT ?) ORDER BY seq"
        rows = _read_only(path, sql, (limit,))
    else:
        sql = "SELECT * FROM decisions WHERE message_id = ? OR reply_id = ? ORDER BY seq LIMIT ?"
        rows = _read_only(path, sql, (_safe(message_id), _safe(message_id), limit))
    out = []
    for seq, mid, reply, at, kind, level, text in rows:
        try:
            fields = json.loads(text)
        except ValueError:
            fields = {}
        reply_id = None if reply is None else _unsafe(reply)
        fields = fields if isinstance(fields, dict) else {}
        out.append(Decision(seq, _unsafe(mid), reply_id, at, _unsafe(kind), level, fields))
    return out


def read_message(path: str | Path, message_id: str) -> Message | None:
    """The message ``message_id`` as the store at ``path`` keeps it (read-only), else ``None``."""
    rows = _read_only(path, "SELECT body FROM messages WHERE id = ?", (_safe(message_id),))
    if not rows:
        return None
    try:
        return Message.model_validate(json.loads(rows[0][0]))
    except (ValueError, ValidationError, RecursionError):
        return None


def read_history(path: str | Path, limit: int) -> list[tuple[float, Message]]:
    """The last ``limit`` messages of the store file at ``path`` with the time each was stored
    (seconds since the epoch), oldest first: for clients joining late (the bridge's
    ``/history``). Read-only (:func:`_read_only`), so it blocks neither the node nor the
    writer (WAL); call :meth:`Store.flush` first to include what is queued. Rows that no longer
    parse are left out (and logged), as in :meth:`Store.recent`."""
    if limit <= 0:
        return []
    rows = _read_only(path, "SELECT seq, body, stored_at FROM messages ORDER BY seq DESC LIMIT ?", (limit,))
    out: list[tuple[float, Message]] = []
    for seq, body, stored_at in reversed(rows):
        try:
            out.append((float(stored_at), Message.model_validate(json.loads(body))))
        except (ValueError, ValidationError, RecursionError):
            log_event(logger, "store_row_unreadable", logging.ERROR, path=str(path), seq=seq)
    return out
