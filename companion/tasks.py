"""Objects that own their tasks, as trio means it: ``async with thing:`` opens the nursery its
tasks run in, and leaving the block ends them.

An object that starts tasks (the in-memory hub's delayed deliveries, a group's engines, the
WebRTC sessions) inherits :class:`OwnsTasks` and starts them in :attr:`OwnsTasks.tasks`. Nobody
lends it a nursery, so its tasks can neither outlive it nor run in a nursery that belongs to
someone else's block. Leaving the block cancels them, unless the class ends them otherwise
(:meth:`OwnsTasks._end`); a class that holds more than a nursery (an asyncio island, a hub)
wraps :meth:`OwnsTasks._lifetime`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Self, TypeVar

import trio

__all__ = ["OwnsTasks", "innermost"]

_T = TypeVar("_T")


class OwnsTasks:
    """``async with thing:`` runs ``thing._lifetime()`` around the block and gives back ``thing``."""

    _nursery: trio.Nursery | None = None
    _entered: AbstractAsyncContextManager[None] | None = None

    @property
    def tasks(self) -> trio.Nursery:
        """The nursery of this object's tasks, while it is open."""
        return self._while_open(self._nursery)

    def _while_open(self, held: _T | None) -> _T:
        """``held``, something the object holds only while it is open; used closed, it says how
        to open it."""
        if held is None:
            name = type(self).__name__
            raise RuntimeError(f"this {name} is not open: use it as `async with {name}(...) as ...:`")
        return held

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The object's nursery, open for the block; a subclass that holds more wraps this."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    yield
                finally:
                    self._end(nursery)
        finally:
            self._nursery = None  # once its last task is over

    def _end(self, nursery: trio.Nursery) -> None:
        """How the tasks end when the block does: cancelled (a class whose tasks end on their own
        once asked, within their deadlines, asks them instead)."""
        nursery.cancel_scope.cancel()

    async def __aenter__(self) -> Self:
        if self._entered is not None:
            raise RuntimeError(f"this {type(self).__name__} is open already")
        lifetime = self._lifetime()
        await lifetime.__aenter__()
        self._entered = lifetime
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        lifetime, self._entered = self._entered, None
        assert lifetime is not None, "__aexit__ without __aenter__"
        return await lifetime.__aexit__(exc_type, exc, traceback)


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (a nursery wraps its task's
    failure in a group); a group of several is given back as it is."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
