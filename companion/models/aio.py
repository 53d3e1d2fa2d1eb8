"""The one bridge from trio to asyncio libraries (pydantic-ai, the provider SDKs): trio-asyncio.

Provider SDKs are asyncio code. They run on a trio-asyncio loop, which is itself a trio task,
so trio's cancellation reaches them: cancelling the trio caller cancels the asyncio future, which
aborts the HTTP request.

There is at most one loop: :func:`asyncio_loop` reuses the loop the caller opened (a long-running
node should open one around its whole run with ``async with asyncio_loop():``) and opens a
temporary one only when none is open, for the duration of the block.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

import trio_asyncio

from companion.tasks import innermost

__all__ = ["asyncio_loop", "has_asyncio_loop", "run_asyncio"]

P = ParamSpec("P")
T = TypeVar("T")


def _rebind_anyio_asyncio_backend() -> None:
    """Let anyio see trio-asyncio's loop even if anyio was imported first.

    trio-asyncio makes ``asyncio.get_running_loop``/``current_task`` find its loop by replacing
    those module attributes when it is imported. anyio's asyncio backend (which the provider
    SDKs and httpx2 use) binds them by value at its own import, so if it was imported earlier (the
    anyio pytest plugin does that, for one) it keeps the originals and fails with "no running
    event loop". Rebinding them to the current attributes fixes that; outside a trio-asyncio loop
    the replacements behave exactly like the originals.
    """
    backend = sys.modules.get("anyio._backends._asyncio")
    if backend is not None:
        backend.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]
        backend.current_task = asyncio.current_task  # type: ignore[attr-defined]


_rebind_anyio_asyncio_backend()


def has_asyncio_loop() -> bool:
    """Whether this trio task already runs inside a trio-asyncio loop."""
    return trio_asyncio.current_loop.get() is not None


@asynccontextmanager
async def asyncio_loop() -> AsyncIterator[None]:
    """Make asyncio code callable inside the block, reusing the caller's loop if there is one.

    Exceptions from the block come out as themselves, not wrapped in the exception groups of
    trio-asyncio's internal nurseries, so callers see the same error whichever loop ran the code.
    """
    if has_asyncio_loop():
        yield
        return
    try:
        async with trio_asyncio.open_loop():
            yield
    except BaseExceptionGroup as group:
        leaf = innermost(group)
        if isinstance(leaf, BaseExceptionGroup):  # several failures: the group says it all
            raise
        raise leaf from leaf.__cause__


async def run_asyncio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await the asyncio coroutine function ``fn`` from trio (inside :func:`asyncio_loop`)."""
    if not has_asyncio_loop():
        raise RuntimeError(
            "run_asyncio needs a trio-asyncio loop: wrap the caller in `async with asyncio_loop()`"
        )
    result: T = await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
    return result
