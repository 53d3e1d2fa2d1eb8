"""The asyncio island: aiortc runs on a trio-asyncio loop inside the trio program.

aiortc is written for asyncio; the rest of the project is trio. One :class:`AsyncioIsland` per
process part that needs WebRTC holds a trio-asyncio loop; trio code crosses into it only
through :meth:`AsyncioIsland.call` (await an asyncio coroutine function) and
:meth:`AsyncioIsland.enter` (make the loop current for aiortc's synchronous methods, which
look the loop up themselves). aiortc's callbacks run on the same thread inside trio, so they
may hand values to trio with non-blocking calls (``send_nowait``, ``Event.set``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import trio
import trio_asyncio

__all__ = ["AsyncioIsland", "open_island", "single_exceptions"]

P = ParamSpec("P")
T = TypeVar("T")


class AsyncioIsland:
    """A running trio-asyncio loop and the two ways into it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await the asyncio coroutine function ``fn(*args)`` from trio; trio cancellation
        cancels the asyncio task."""
        wrapped = trio_asyncio.aio_as_trio(fn, loop=self.loop)
        return cast(T, await wrapped(*args, **kwargs))

    async def close_within(self, close: Callable[[], Awaitable[Any]], timeout: float) -> bool:
        """Await an asyncio ``close()`` (a peer connection's) for at most ``timeout`` seconds;
        ``False`` when the deadline passed first, so callers log it and move on."""
        with trio.move_on_after(timeout) as scope:
            await self.call(close)
        return not scope.cancelled_caught

    def enter(self) -> None:
        """Make this loop current for the calling trio task (and the tasks it starts), so
        aiortc's synchronous methods find it with ``asyncio.get_event_loop()``."""
        trio_asyncio.current_loop.set(self.loop)

    def asyncio_tasks(self) -> set[asyncio.Task[Any]]:
        """Live asyncio tasks on this loop (leak checks in tests and in the benchmark)."""
        return {t for t in asyncio.all_tasks(self.loop) if not t.done()}


@asynccontextmanager
async def open_island() -> AsyncIterator[AsyncioIsland]:
    """Reuse the trio-asyncio loop already current in this task (one loop per program part,
    never a second by accident), or open one for the duration of the block."""
    current = trio_asyncio.current_loop.get()
    if current is not None:
        yield AsyncioIsland(current)
        return
    with single_exceptions():
        async with trio_asyncio.open_loop() as loop:
            yield AsyncioIsland(loop)


@contextmanager
def single_exceptions() -> Iterator[None]:
    """Let one exception leave a block as itself, not wrapped in the exception groups of the
    nurseries inside (trio-asyncio's loop, our own): callers of a context manager expect what
    their body raised, or one clear error of ours. Groups of several stay groups."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) != 1:
            raise
        raise leaves[0] from None


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
