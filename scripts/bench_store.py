"""How long a companion's trio loop is blocked by its store, per message: the old way against the new.

Every companion records every message of its conversation. Here ``--companions`` stores live in
one trio loop (as ``companion run`` with several cards does), each in its own data directory,
and a task delivers ``--messages`` messages at ``--rate`` per second, each recorded by every
store, with a reply mark and a working-memory write every tenth message (as the speaker does).

- **old**: the store as it was, measured in the same run as the reference: every write commits on
  the loop thread, WAL mode, ``synchronous=FULL``.
- **new**: :class:`companion.store.sqlite.Store`: the in-memory view answers, the writer thread commits
  (``synchronous=NORMAL``, batches).
- **memory**: :class:`companion.store.sqlite.MemoryStore`, no disk at all: the floor that the machine's
  own noise (other processes preempting this one) sets under both.

Blocked time is measured two ways on the loop thread: the duration of each store call (per
message and companion), and a trio instrument timing every step of the delivering task (what the
loop could not do meanwhile, including any wait for the GIL held by a writer thread). Printed:
p50/p99/max in milliseconds and the ratio old/new; then the new store's flush and reopen check.

    python scripts/bench_store.py [--companions 3] [--messages 600] [--rate 150]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import trio
import trio.abc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import percentile

from companion.protocol import Message, encode
from companion.store.layout import migrate_sqlite
from companion.store.sqlite import DB_FILENAME, MemoryStore, Store


class _Recorder(Protocol):
    """What ``deliver`` calls on a store (all three ways have it; ``MemoryStore`` has no ``close``)."""

    def record(self, message: Message) -> bool: ...
    def mark_replied(self, message_id: str) -> bool: ...
    def remember(self, key: str, value: Any) -> None: ...


class FullOnLoop:
    """The reference: the old store's writes, each committed on the calling thread with FULL."""

    def __init__(self, path: Path) -> None:
        migrate_sqlite(path)  # the store's tables
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")

    def record(self, message: Message) -> bool:
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO messages (id, sender, body, stored_at) VALUES (?, ?, ?, ?)",
            (message.params.id, message.params.from_, encode(message).decode(), time.time()),
        )
        return cursor.rowcount == 1

    def mark_replied(self, message_id: str) -> bool:
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO seen (kind, id) VALUES ('replied', ?)", (message_id,)
        )
        return cursor.rowcount == 1

    def remember(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO memory (key, value, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, repr(value), time.time()),
        )

    def close(self) -> None:
        self._db.close()


class StepTimer(trio.abc.Instrument):
    """Times every step of one task: how long it held the loop at a stretch."""

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.steps: list[float] = []
        self._start = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self._start = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self._start:
            self.steps.append(time.perf_counter() - self._start)
        self._start = 0.0


async def deliver(stores: Sequence[_Recorder], messages: int, rate: float, timer: StepTimer) -> list[float]:
    """Each message to every store at ``rate``; the duration of each store call, per companion."""
    timer.task = trio.lowlevel.current_task()
    calls: list[float] = []
    start = trio.current_time()
    for n in range(messages):
        await trio.sleep_until(start + n / rate)
        message = Message.create("user_bench", ["companion_0"], f"message {n} " + "x" * 200, id=f"b{n}")
        for store in stores:
            t0 = time.perf_counter()
            store.record(message)
            if n % 10 == 0:
                store.mark_replied(message.params.id)
                store.remember("turn", {"n": n})
            calls.append(time.perf_counter() - t0)
    timer.task = None
    return calls


def run(way: str, root: Path, companions: int, messages: int, rate: float) -> tuple[list[float], list[float]]:
    paths = [root / way / f"companion_{i}" / DB_FILENAME for i in range(companions)]
    makers: dict[str, Callable[[Path], FullOnLoop | Store | MemoryStore]] = {
        "old": FullOnLoop,
        "new": Store,
        "memory": lambda _: MemoryStore(),
    }
    stores = [makers[way](p) for p in paths]
    timer = StepTimer()
    calls = trio.run(deliver, stores, messages, rate, timer, instruments=[timer])
    t0 = time.perf_counter()
    for store in stores:
        if not isinstance(store, MemoryStore):
            store.close()
    closing = time.perf_counter() - t0
    if way == "new":
        for path in paths:
            with Store(path) as again:
                assert len(again) == messages, (path, len(again))
        print(
            f"  new: close (flush) of {companions} stores: {closing * 1000:.1f} ms; reopened: {messages} each"
        )
    return calls, timer.steps


def row(label: str, values: list[float]) -> tuple[float, float, float]:
    ms = [v * 1000 for v in values]
    p50, p99, worst = percentile(ms, 0.50), percentile(ms, 0.99), max(ms)
    print(f"  {label:<34} p50 {p50:7.3f}  p99 {p99:7.3f}  max {worst:7.3f} ms  (n={len(ms)})")
    return p50, p99, worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--companions", type=int, default=3)
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--rate", type=float, default=150.0)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print(
            f"load average: {f.read().split()[0]}; {args.companions} companions, "
            f"{args.messages} messages at {args.rate:g}/s"
        )
    with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
        results = {}
        for way in ("old", "new", "memory"):
            calls, steps = run(way, Path(tmp), args.companions, args.messages, args.rate)
            print(f"{way}:")
            results[way] = (
                row("store calls, per message+companion", calls),
                row("loop steps of the task", steps),
            )
    (old_calls, old_steps), (new_calls, new_steps) = results["old"], results["new"]
    print("ratio new/memory (p50, p99, max):")
    floor_calls, floor_steps = results["memory"]
    for label, new, floor in (
        ("store calls", new_calls, floor_calls),
        ("loop steps", new_steps, floor_steps),
    ):
        print(
            f"  {label:<13}" + "  ".join(f"{n / max(f, 1e-9):8.1f}x" for n, f in zip(new, floor, strict=True))
        )
    print("ratio old/new (p50, p99, max):")
    for label, old, new in (("store calls", old_calls, new_calls), ("loop steps", old_steps, new_steps)):
        print(
            f"  {label:<13}" + "  ".join(f"{o / max(n, 1e-9):8.1f}x" for o, n in zip(old, new, strict=True))
        )
    p99, worst = new_calls[1], new_calls[2]
    print(f"goal: blocked <= 0.5 ms per message per companion; new: p99 {p99:.3f} ms, max {worst:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
