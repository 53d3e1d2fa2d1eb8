"""A tool's own memory: small JSON values per companion and per namespace, durable in SQLite.

A handler reaches it as :attr:`ActionContext.store <companion.actions.ActionContext.store>`,
whose namespace is the tool's id, so two tools never see each other's keys (one tool shares
what it knows by being called, see :meth:`ActionContext.call
<companion.actions.ActionContext.call>`). The values live in their own table of the companion's
SQLite file, beside (and independent of) :class:`companion.store.sqlite.Store`; a runtime without a
file gets the in-memory variant, with the same limits and the same copy-on-read behaviour.

Limits keep one tool from filling the companion's disk: a key's length, a value's encoded size,
and a namespace's key count and total size. Going past one raises :class:`StoreLimitExceeded`,
whose stable code (:attr:`ErrorCode.STORE_LIMIT <companion.actions.ErrorCode.STORE_LIMIT>`)
ends the call as ``store_limit`` when the handler does not catch it.

Calls are synchronous and never wait for the disk, so plain and ``async`` handlers use them
alike: reads come from a view of the table loaded at open, writes change the view and are
committed by a writer thread (:mod:`companion.store.writer`, ``synchronous=FULL`` in WAL mode).
The runtime awaits :meth:`KeyValueStore.flush` (in a worker thread) when a handler returns, so
what a tool wrote survives a crash of the process or the machine once its call has returned;
outside a runtime, :meth:`KeyValueStore.sync` is that wait. A disk that fails (read-only,
full) is logged and counted, never raised: the values stay in the view for the process's life.
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

import trio

from companion.actions.results import ErrorCode
from companion.log import log_event
from companion.store.layout import migrate_sqlite
from companion.store.writer import SqlWriter

__all__ = [
    "KV_TABLE",
    "KeyValueStore",
    "Namespace",
    "NamespaceUsage",
    "StoreLimitExceeded",
    "StoreLimits",
]

logger = logging.getLogger("companion.store.kv")

KV_TABLE: Final = "action_store"


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


class _SqliteBackend(_MemoryBackend):
    """The values of one SQLite file: read from a view loaded at open, written through a
    :class:`~companion.store.writer.SqlWriter` thread (``synchronous=FULL``), so no call waits for
    the disk; :meth:`KeyValueStore.flush` waits for the commits, off the loop."""

    def __init__(self, target: str | Path | sqlite3.Connection) -> None:
        super().__init__()
        if isinstance(target, sqlite3.Connection):  # the caller's: it names the file
            row = target.execute("PRAGMA database_list").fetchone()
            if row is None or not row[2]:
                raise ValueError("KeyValueStore.open needs a connection to a file, not an in-memory database")
            path = Path(row[2])
        else:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
        migrate_sqlite(path)  # the table is part of the companion's layout (companion.store.layout)
        # A returned call's writes survive a crash of the machine, as before: FULL, not NORMAL.
        self.writer = SqlWriter(path, synchronous="FULL", name=f"kv {path.name}")
        try:
            db = sqlite3.connect(path, isolation_level=None)
            try:
                db.execute("PRAGMA busy_timeout=5000")
                rows = db.execute(f"SELECT companion, namespace, key, value, size FROM {KV_TABLE}")
                for companion, namespace, key, value, size in rows.fetchall():
                    self._spaces.setdefault((companion, namespace), {})[key] = (value, int(size))
            finally:
                db.close()
        except BaseException:
            self.writer.close()
            raise

    def write(
        self,
        companion: str,
        namespace: str,
        key: str,
        text: str,
        size: int,
        check: Callable[[NamespaceUsage], None],
    ) -> None:
        super().write(companion, namespace, key, text, size, check)  # raises, writing nothing
        self.writer.submit(
            f"INSERT INTO {KV_TABLE} (companion, namespace, key, value, size, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (companion, namespace, key) "
            "DO UPDATE SET value = excluded.value, size = excluded.size, "
            "updated_at = excluded.updated_at",
            (companion, namespace, key, text, size, time.time()),
        )

    def delete(self, companion: str, namespace: str, key: str) -> bool:
        if not super().delete(companion, namespace, key):
            return False
        self.writer.submit(
            f"DELETE FROM {KV_TABLE} WHERE companion = ? AND namespace = ? AND key = ?",
            (companion, namespace, key),
        )
        return True

    def close(self) -> None:
        if not self.writer.close():
            log_event(
                logger, "kv_writes_lost", logging.ERROR, path=str(self.writer.path), **self.writer.stats()
            )
        super().close()


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

    @property
    def writes(self) -> int:
        """How many writes were made so far: a mark for :meth:`flush`'s ``since``."""
        backend = self._backend
        return backend.writer.submitted if isinstance(backend, _SqliteBackend) else 0

    def sync(self, timeout: float = 10.0, *, since: int = 0) -> bool:
        """Wait, blocking this thread, until every write so far is committed: ``True``, or
        ``False`` if one after the first ``since`` (a :attr:`writes` mark) was lost to a
        failing disk or ``timeout`` seconds passed. In memory: ``True`` at once."""
        backend = self._backend
        return backend.writer.flush(timeout, since=since) if isinstance(backend, _SqliteBackend) else True

    async def flush(self, timeout: float = 10.0, *, since: int = 0) -> bool:
        """:meth:`sync`, waited for in a worker thread so the trio loop runs on meanwhile (the
        runtime awaits it when a handler returns: what a tool wrote is durable when its call
        returns)."""
        if not isinstance(self._backend, _SqliteBackend):
            return True
        return await trio.to_thread.run_sync(lambda: self.sync(timeout, since=since))

    def close(self) -> None:
        """Commit what is queued and close the file (a connection passed to :meth:`open` stays
        open: the store writes through its own connection to the same file)."""
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
