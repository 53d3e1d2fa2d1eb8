"""The recording doubles of the two ports a test stands between: :class:`Sink`, a publisher that
keeps what it is given, and :class:`Recorder`, a payload handler that keeps what a node
delivers. One of each, so a test waits on events the same way wherever it records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from companion.memory import Inbound
from companion.protocol import QUERIES, Query


class _Changes:
    """An event that fires on every change; waits are bounded by a deadline of the caller's."""

    def __init__(self) -> None:
        self._changed = trio.Event()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until ``predicate()`` holds, checked after every change; fails after ``timeout``."""
        with trio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()


class Sink(_Changes):
    """A publisher (``companion.ports.Publisher``) that records ``(topic, envelope)`` in
    ``sent``. ``fail``: every publish raises it instead; ``hang``: every publish waits forever
    (a transport that never answers)."""

    def __init__(self, *, fail: BaseException | None = None, hang: bool = False) -> None:
        super().__init__()
        self.sent: list[tuple[str, Any]] = []
        self.fail = fail
        self.hang = hang

    async def publish(self, topic: str, envelope: Any) -> None:
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await trio.sleep_forever()
        self.sent.append((topic, envelope))
        self._poke()

    def topics(self) -> list[str]:
        return [topic for topic, _ in self.sent]

    def on(self, topic: str) -> list[Any]:
        return [envelope for t, envelope in self.sent if t == topic]

    def queries(self) -> list[Query]:
        return [q for q in self.on(QUERIES) if isinstance(q, Query)]

    async def until_sent(self, topic: str, count: int, timeout: float = 30.0) -> list[Any]:
        """Wait until ``count`` envelopes went out on ``topic`` (``wait_all_tasks_blocked`` does
        not wait for a worker thread, such as a store's commit); they are returned."""
        await self.until(lambda: len(self.on(topic)) >= count, timeout)
        return self.on(topic)

    async def next_query(self, timeout: float = 5.0) -> Query:
        """Wait until a query has been published and return the latest."""
        await self.until(lambda: bool(self.queries()), timeout)
        return self.queries()[-1]


class Recorder(_Changes):
    """A payload handler (what a node delivers to) that records every :class:`Inbound` in
    ``items``."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Inbound] = []

    async def handle(self, inbound: Inbound) -> None:
        self.items.append(inbound)
        self._poke()

    async def wait_for(self, predicate: Callable[[Inbound], bool], timeout: float) -> Inbound | None:
        """The first item (already delivered or coming) that satisfies ``predicate``; ``None``
        after ``timeout``."""
        with trio.move_on_after(timeout):
            while True:
                for item in self.items:
                    if predicate(item):
                        return item
                await self._changed.wait()
        return None
