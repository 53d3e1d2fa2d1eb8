"""Cancellation turned into an orderly stop, for every kind of node that runs a libp2p host.

py-libp2p tears connections down half-way when its own tasks are cancelled (peers then notice
only at the next health check), so a node serves in a shielded scope: when the node is
cancelled (or asked to stop), ``serve`` is told through an event, closes its host while the
host's services still run, and sets ``finished``; past ``close_timeout`` the shield comes down
and the rest is cancelled outright.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from companion.log import log_event

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["Serve", "run_orderly"]

Serve = Callable[..., Awaitable[None]]
"""``serve(stop, shielded, *, task_status)``: run inside ``shielded``, report ``started`` once
listening, close the host once ``stop`` is set, and set the ``finished`` event it was given."""


async def run_orderly(
    serve: Serve,
    finished: trio.Event,
    *,
    close_timeout: float,
    name: str,
    logger: logging.Logger,
    stop_requested: trio.Event | None = None,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``serve`` until cancelled, or until ``stop_requested`` is set; either way the stop
    is orderly (see the module docstring), within ``close_timeout`` seconds; a stop past it is
    logged as ``host_close_timeout`` on the node's ``logger``."""
    stop = trio.Event()
    shielded = trio.CancelScope(shield=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, stop, shielded)
        task_status.started()
        try:
            if stop_requested is None:
                await trio.sleep_forever()
            else:
                await stop_requested.wait()
        finally:
            stop.set()
            with trio.CancelScope(shield=True), trio.move_on_after(close_timeout) as waited:
                await finished.wait()
            if waited.cancelled_caught:
                log_event(logger, "host_close_timeout", logging.WARNING, node=name)
            shielded.cancel()
