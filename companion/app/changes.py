"""Waiting until something holds, where it can only start holding after a change.

The demo's watcher, the demo's companion processes and the in-memory group each note their
changes (a transcript line, a line a process printed) and let callers wait for a condition
within a deadline: the event of the moment is set and replaced at each change, so a waiter
wakes once per change and looks again.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Changes"]


class Changes:
    """Changes noted one by one, and waits on them."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def note(self) -> None:
        """Something changed: wake every waiter."""
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Return at the next change."""
        await self._event.wait()

    async def wait_until(self, holds: Callable[[], bool], timeout: float) -> bool:
        """Return once ``holds()`` is true (looked at now and after each change); ``False`` if
        ``timeout`` seconds passed first."""
        with trio.move_on_after(timeout):
            while not holds():
                await self._event.wait()
            return True
        return False
