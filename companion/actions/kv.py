"""A tool's own memory: small JSON values per companion and per namespace, durable in SQLite.

A handler reaches it as :attr:`ActionContext.store <companion.actions.ActionContext.store>`,
whose namespace is the tool's id, so two tools never see each other's keys (one tool shares
what it knows by being called, see :meth:`ActionContext.call
<companion.actions.ActionContext.call>`). The values live in their own table of the companion's
SQLite file, beside (and independent of) :class:`companion.store.Store`; a runtime without a
file gets the in-memory variant, with the same limits and the same copy-on-read behaviour.

Limits keep one tool from filling the companion's disk: a key's length, a value's encoded size,
and a namespace's key count and total size. Going past one raises :class:`StoreLimitExceeded`,
whose stable code (:attr:`ErrorCode.STORE_LIMIT <companion.actions.ErrorCode.STORE_LIMIT>`)
ends the call as ``store_limit`` when the handler does not catch it.

Calls are synchronous and short (one indexed statement, or one small transaction for a write),
like :class:`companion.store.Store`'s, so plain and ``async`` handlers use them alike.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

from ..log import log_event
from .results import ErrorCode

__all__ = [
    "KV_TABLE",
    "KeyValueStore",
    "Namespace",
    "NamespaceUsage",
    "StoreLimitExceeded",
    "StoreLimits",
]

logger = logging.getLogger("companion.actions.kv")

KV_TABLE: Final = "action_store"

_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS {KV_TABLE} (
    companion TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    size INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (companion, namespace, key)
) WITHOUT ROWID
"""


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Bounds on what one namespace may hold. Sizes count UTF-8 bytes of the key and the JSON text."""

    max_key_chars: int = 200
    max_value_bytes: int = 16 * 1024
    max_namespace_keys: int = 1_000
    max_namespace_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        for name in ("max_key_chars", "max_value_bytes", "max_namespace_keys", "max_namespace_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"StoreLimits.{name} must be at least 1")


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    keys: int
    bytes: int


class StoreLimitExceeded(Exception):
    """A write would go past one of :class:`StoreLimits`; nothing was written.

    Uncaught in a handler, the call ends with status ``store_limit`` and this message, written
    for the model: which limit, how far past it, and what to do instead.
    """

    code: Final = ErrorCode.STORE_LIMIT

    def __init__(self, namespace: str, key: str, what: str, size: int, limit: int, fix: str) -> None:
        super().__init__(
            f"store {namespace!r}: {what} for key {key[:60]!r} would be {size} (limit {limit}); "
            f"nothing was written; {fix}"
        )
        self.namespace = namespace
        self.key = key
        self.size = size
        self.limit = limit


class _SqliteBackend:
    def __init__(self, target: str | Path | sqlite3.Connection) -> None:
        if isinstance(target, sqlite3.Connection):
            self._db: sqlite3.Connection | None = target
            self._owned = False
        else:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._owned = True
            # The same durability as the companion's Store: a returned write survives a crash.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
        self._conn.execute(_SCHEMA)
        if self._conn.in_transaction:
            self._conn.commit()

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the key-value store is closed")
        return self._db

    def read(self, companion: str, namespace: str, key: str) -> str | None:
        row = self._conn.execute(
            f"SELECT value FROM {KV_TABLE} WHERE companion = ? AND namespace = ? AND key = ?",
            (companion, namespace, key),
        ).fetchone()
        return None if row is None else str(row[0])

    def _usage_without(self, companion: str, namespace: str, key: str) -> NamespaceUsage:
        count, total = self._conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {KV_TABLE} "
            "WHERE companion = ? AND namespace = ? AND key != ?",
            (companion, namespace, key),
        ).fetchone()
        return NamespaceUsage(int(count), int(total))

    def write(
        self,
        companion: str,
        namespace: str,
        key: str,
        text: str,
        size: int,
        check: Callable[[NamespaceUsage], None],
    ) -> None:
        """Store ``text`` after ``check(usage of the namespace without this key)`` passes, atomically."""
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            check(self._usage_without(companion, namespace, key))
            db.execute(
                f"INSERT INTO {KV_TABLE} (companion, namespace, key, value, size, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (companion, namespace, key) "
                "DO UPDATE SET value = excluded.value, size = excluded.size, "
                "updated_at = excluded.updated_at",
                (companion, namespace, key, text, size, time.time()),
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def delete(self, companion: str, namespace: str, key: str) -> bool:
        cursor = self._conn.execute(
            f"DELETE FROM {KV_TABLE} WHERE companion = ? AND namespace = ? AND key = ?",
            (companion, namespace, key),
        )
        if self._conn.in_transaction:
            self._conn.commit()
        return cursor.rowcount == 1

    def keys(self, companion: str, namespace: str) -> list[str]:
        rows = self._conn.execute(
            f"SELECT key FROM {KV_TABLE} WHERE companion = ? AND namespace = ? ORDER BY key",
            (companion, namespace),
        ).fetchall()
        return [str(row[0]) for row in rows]

    def usage(self, companion: str, namespace: str) -> NamespaceUsage:
        count, total = self._conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {KV_TABLE} WHERE companion = ? AND namespace = ?",
            (companion, namespace),
        ).fetchone()
        return NamespaceUsage(int(count), int(total))

    def close(self) -> None:
        if self._db is not None and self._owned:
            self._db.close()
        self._db = None


class _MemoryBackend:
    def __init__(self) -> None:
        self._spaces: dict[tuple[str, str], dict[str, tuple[str, int]]] = {}

    def _space(self, companion: str, namespace: str) -> dict[str, tuple[str, int]]:
        return self._spaces.get((companion, namespace), {})

    def read(self, companion: str, namespace: str, key: str) -> str | None:
        entry = self._space(companion, namespace).get(key)
        return None if entry is None else entry[0]

    def write(
        self,
        companion: str,
        namespace: str,
        key: str,
        text: str,
        size: int,
        check: Callable[[NamespaceUsage], None],
    ) -> None:
        space = self._space(companion, namespace)
        others = [s for k, (_, s) in space.items() if k != key]
        check(NamespaceUsage(len(others), sum(others)))
        self._spaces.setdefault((companion, namespace), {})[key] = (text, size)

    def delete(self, companion: str, namespace: str, key: str) -> bool:
        return self._spaces.get((companion, namespace), {}).pop(key, None) is not None

    def keys(self, companion: str, namespace: str) -> list[str]:
        return sorted(self._space(companion, namespace))

    def usage(self, companion: str, namespace: str) -> NamespaceUsage:
        space = self._space(companion, namespace)
        return NamespaceUsage(len(space), sum(size for _, size in space.values()))

    def close(self) -> None:
        self._spaces.clear()


_Backend: TypeAlias = _SqliteBackend | _MemoryBackend


class KeyValueStore:
    """The key-value memory of the companions of one runtime (usually one companion, one file)."""

    def __init__(self, backend: _Backend, limits: StoreLimits) -> None:
        self._backend = backend
        self.limits = limits

    @classmethod
    def open(
        cls, target: str | Path | sqlite3.Connection, *, limits: StoreLimits | None = None
    ) -> KeyValueStore:
        """A durable store in the SQLite file ``target`` (created if needed), or on a connection.

        The companion's own ``companion.sqlite3`` is the usual file; the table is separate from
        the conversation store's. A connection passed in stays the caller's to close.
        """
        return cls(_SqliteBackend(target), limits or StoreLimits())

    @classmethod
    def in_memory(cls, *, limits: StoreLimits | None = None) -> KeyValueStore:
        """A store that lives as long as the process: for runtimes without a file, and tests."""
        return cls(_MemoryBackend(), limits or StoreLimits())

    def namespace(self, companion_id: str, name: str) -> Namespace:
        """The view of ``companion_id``'s keys under ``name`` (a tool's id, for a handler)."""
        return Namespace(self, companion_id, name)

    def close(self) -> None:
        """Close the file (a connection passed to :meth:`open` stays open)."""
        self._backend.close()

    def __enter__(self) -> KeyValueStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Namespace:
    """One companion's keys under one name. Values are JSON; reads return fresh copies."""

    __slots__ = ("_backend", "_limits", "companion_id", "name")

    def __init__(self, store: KeyValueStore, companion_id: str, name: str) -> None:
        self._backend = store._backend
        self._limits = store.limits
        self.companion_id = companion_id
        self.name = name

    def __repr__(self) -> str:
        return f"Namespace({self.companion_id!r}, {self.name!r})"

    def _key(self, key: object) -> str:
        if not isinstance(key, str) or not key:
            raise TypeError(f"store {self.name!r}: a key must be a non-empty string, got {key!r}")
        return key

    def get(self, key: str, default: Any = None) -> Any:
        """The value under ``key`` (a new copy each time), or ``default``."""
        text = self._backend.read(self.companion_id, self.name, self._key(key))
        if text is None:
            return default
        try:
            return json.loads(text)
        except ValueError:
            log_event(
                logger, "kv_row_unreadable", logging.ERROR, namespace=self.name, key=key[:60], chars=len(text)
            )
            return default

    def set(self, key: str, value: Any) -> None:
        """Keep the JSON ``value`` under ``key``, replacing what was there.

        Raises :class:`StoreLimitExceeded` past a limit (nothing is written) and ``ValueError``
        for a value JSON cannot hold (NaN, a set, an object): that is a bug in the handler.
        """
        key = self._key(key)
        limits = self._limits
        if len(key) > limits.max_key_chars:
            raise StoreLimitExceeded(
                self.name, key, "the key's length", len(key), limits.max_key_chars, "use a shorter key"
            )
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"store {self.name!r}: the value for {key[:60]!r} is not JSON: {exc}") from exc
        value_bytes = len(text.encode("utf-8"))
        if value_bytes > limits.max_value_bytes:
            raise StoreLimitExceeded(
                self.name,
                key,
                "the value's size in bytes",
                value_bytes,
                limits.max_value_bytes,
                "keep less under one key (a summary, or split it over several keys)",
            )
        size = len(key.encode("utf-8")) + value_bytes

        def check(others: NamespaceUsage) -> None:
            if others.keys + 1 > limits.max_namespace_keys:
                raise StoreLimitExceeded(
                    self.name,
                    key,
                    "the number of keys",
                    others.keys + 1,
                    limits.max_namespace_keys,
                    "delete keys that are no longer needed before adding new ones",
                )
            if others.bytes + size > limits.max_namespace_bytes:
                raise StoreLimitExceeded(
                    self.name,
                    key,
                    "the namespace's size in bytes",
                    others.bytes + size,
                    limits.max_namespace_bytes,
                    "delete or shorten values that are no longer needed",
                )

        self._backend.write(self.companion_id, self.name, key, text, size, check)

    def delete(self, key: str) -> bool:
        """Forget ``key``; False if it was not there."""
        return self._backend.delete(self.companion_id, self.name, self._key(key))

    def keys(self) -> list[str]:
        """Every key, sorted."""
        return self._backend.keys(self.companion_id, self.name)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not key:
            return False
        return self._backend.read(self.companion_id, self.name, key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return self.usage.keys

    @property
    def usage(self) -> NamespaceUsage:
        """How many keys and bytes the namespace holds now."""
        return self._backend.usage(self.companion_id, self.name)
