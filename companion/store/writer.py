"""One SQLite connection written from its own thread, so a trio loop never waits for a commit.

A commit with ``synchronous=FULL`` waits for the disk (1.3-13 ms measured on the loop thread,
per message, per companion); even with ``synchronous=NORMAL`` a checkpoint now and then does.
So the loop only :meth:`SqlWriter.submit`\\ s a statement (appending to a queue, microseconds)
and this writer's thread runs what is queued in one transaction (up to a thousand statements):
group commit, where the next batch gathers while a commit runs, after waiting ``batch_window``
seconds for company.
:meth:`SqlWriter.flush` waits (in the calling thread; from trio use ``trio.to_thread``) until
everything submitted before it is committed.

A failing disk (read-only, full, an I/O error) never raises into the caller: the writer logs one
``sql_write_failed`` event when the failures start and one ``sql_write_recovered`` when they
end, counts them (:meth:`SqlWriter.stats`), and retries the batch with a growing pause. While
it fails, at most ``max_backlog`` statements wait; older ones are dropped and counted as lost.
A statement SQLite refuses on its own (not an operational error) is dropped alone and counted,
so it cannot hold back the ones after it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from companion.log import log_event

__all__ = ["SqlWriter", "Statement", "transaction"]

logger = logging.getLogger("companion.store.writer")

Statement: TypeAlias = tuple[str, tuple[Any, ...]]
"""One SQL statement and its parameters."""

_MAX_BATCH: Final = 1000
"""Statements per transaction at most (a long queue commits in steps, each one short)."""
_RETRY_FIRST: Final = 0.05
_RETRY_MAX: Final = 2.0


class SqlWriter:
    """A writer thread with its own connection to ``path`` (WAL mode).

    ``synchronous`` is SQLite's setting for this connection: ``"NORMAL"`` (a commit survives the
    process being killed; a power cut may roll back the last commits, the file stays consistent)
    or ``"FULL"`` (a commit survives a power cut too). Open it on any thread; call
    :meth:`close` (it flushes) before the process ends, or what is queued is lost.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["NORMAL", "FULL"],
        batch_window: float = 0.0,
        max_backlog: int = 50_000,
        name: str = "",
    ) -> None:
        if batch_window < 0 or max_backlog < 1:
            raise ValueError("batch_window must be >= 0 and max_backlog >= 1")
        self.path = path
        self._batch_window = batch_window
        self._max_backlog = max_backlog
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error:
            db.close()
            raise
        self._db = db
        self._cond = threading.Condition()
        self._queue: deque[Statement] = deque()
        self._submitted = 0  # statements submitted so far
        self._settled = 0  # of those, committed or given up (always a prefix: the queue is FIFO)
        self._lost_upto = 0  # the last statement number that was given up
        self._closing = False
        self._hurry = False  # a flush is waiting: commit without waiting for the batch window
        self._counts = {"committed": 0, "batches": 0, "failures": 0, "lost": 0}
        self._failing = False
        self.on_commit: Callable[[float], None] | None = None
        """Called from the writer's thread with the seconds each committed batch took (the
        metrics' store write latency); it must be quick and thread-safe."""
        self._thread = threading.Thread(target=self._run, name=f"sqlwriter {name or path.name}", daemon=True)
        self._thread.start()

    # --- the caller's side ---------------------------------------------------------------------

    @property
    def submitted(self) -> int:
        """How many statements were submitted so far (a mark for :meth:`flush`'s ``since``)."""
        with self._cond:
            return self._submitted

    def submit(self, sql: str, params: tuple[Any, ...] = (), *, urgent: bool = False) -> None:
        """Queue one statement; it runs after every statement submitted before it. ``urgent``:
        commit it without waiting for the batch window."""
        with self._cond:
            if self._closing or not self._thread.is_alive():
                raise RuntimeError(f"the writer of {self.path} is closed")
            idle = not self._queue
            self._queue.append((sql, params))
            self._submitted += 1
            self._hurry = self._hurry or urgent
            # The writer waits for a first statement, then for the batch window to end (or a
            # hurry); a statement joining a batch already waiting wakes nobody. (Each wake-up
            # is the writer thread taking the GIL from the loop: 3 % of a busy node's CPU.)
            if idle or urgent:
                self._cond.notify_all()

    def flush(self, timeout: float, *, since: int = 0) -> bool:
        """Wait until everything submitted so far is committed or given up. ``True`` if it all
        settled within ``timeout`` seconds and none of the statements after the first ``since``
        (a :attr:`submitted` mark) was lost to a failing disk."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            self._hurry = True  # skip the batch window
            self._cond.notify_all()
            while self._settled < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
            return self._lost_upto <= since

    def stats(self) -> dict[str, int]:
        """``committed`` statements, ``batches`` committed, ``failures`` (failed commits),
        ``lost`` (statements given up) and ``backlog`` (statements waiting)."""
        with self._cond:
            return {**self._counts, "backlog": len(self._queue)}

    def close(self, timeout: float = 10.0) -> bool:
        """Commit what is queued (one last try if the disk is failing), stop the thread and close
        the connection. ``True`` if nothing submitted was ever lost."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log_event(logger, "sql_writer_stuck", logging.ERROR, path=str(self.path), timeout=timeout)
            return False
        self._db.close()
        return self._lost_upto == 0

    # --- the writer's thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug here: say so once; flush and close report False
            log_event(
                logger, "sql_writer_crashed", logging.CRITICAL, path=str(self.path), error=repr(exc)[:300]
            )
            raise

    def _loop(self) -> None:
        pause = _RETRY_FIRST
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing, and everything settled
                if self._batch_window and not self._closing and not self._hurry:
                    self._cond.wait_for(lambda: self._closing or self._hurry, self._batch_window)
                self._hurry = False
                batch = list(itertools.islice(self._queue, _MAX_BATCH))
                closing = self._closing
            began = time.perf_counter()
            error = self._commit(batch)
            if error is None:
                if self.on_commit is not None:
                    self.on_commit(time.perf_counter() - began)
                with self._cond:
                    self._settle(len(batch), lost=0)
                    recovered, self._failing = self._failing, False
                if recovered:
                    log_event(logger, "sql_write_recovered", path=str(self.path), **self.stats())
                pause = _RETRY_FIRST
                continue
            with self._cond:
                self._counts["failures"] += 1
                started, self._failing = not self._failing, True
            if started:
                log_event(
                    logger, "sql_write_failed", logging.ERROR, path=str(self.path), error=repr(error)[:300]
                )
            if not isinstance(error, sqlite3.OperationalError):  # SQLite refuses a statement
                good = sum(self._commit([statement]) is None for statement in batch)
                with self._cond:
                    self._settle(len(batch), lost=len(batch) - good)
                continue
            with self._cond:  # the disk: retry everything queued after a pause
                if closing:  # that was the last try
                    self._settle(len(self._queue), lost=len(self._queue))
                    return
                excess = len(self._queue) - self._max_backlog
                if excess > 0:
                    self._settle(excess, lost=excess)
                self._cond.wait_for(lambda: self._closing, pause)
            pause = min(pause * 2, _RETRY_MAX)

    def _settle(self, count: int, *, lost: int) -> None:
        """The oldest ``count`` queued statements are done; the first ``lost`` of them were lost
        (called with the lock held)."""
        for _ in range(count):
            self._queue.popleft()
        self._settled += count
        self._counts["committed"] += count - lost
        self._counts["batches"] += count > lost
        if lost:
            self._counts["lost"] += lost
            self._lost_upto = self._settled
        self._cond.notify_all()

    def _commit(self, batch: list[Statement]) -> Exception | None:
        """Run ``batch`` in one transaction: ``None``, or the error (nothing of it was written)."""
        db = self._db
        try:
            with transaction(db):
                for sql, run in itertools.groupby(batch, key=lambda statement: statement[0]):
                    _execute_run(db, sql, [params for _, params in run])
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            return exc
        return None


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on ``db`` (opened with ``isolation_level=None``): ``BEGIN
    IMMEDIATE``, then ``COMMIT`` when the block ends, or a rollback (whatever SQLite still
    holds) when it raises, the exception going on."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


_ROWS_PER_INSERT: Final = 100


def _execute_run(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """Run one statement for each of ``rows``, in order. A plain ``INSERT ... VALUES (?, ...)``
    becomes one multi-row INSERT per hundred rows (the same rows in the same order, so the same
    outcome, ``OR IGNORE`` included): SQLite then runs while this thread lets go of the GIL once
    per statement, not once per row, so the trio loop's thread is interrupted less often."""
    head, values, tail = sql.rpartition(" VALUES ")
    if not (
        values and head.lstrip().upper().startswith("INSERT") and tail.startswith("(") and tail.endswith(")")
    ):
        db.executemany(sql, rows)
        return
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        if len(chunk) == 1:
            db.execute(sql, chunk[0])
            continue
        db.execute(f"{head} VALUES {', '.join([tail] * len(chunk))}", [p for row in chunk for p in row])
