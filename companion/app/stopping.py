"""How a long-running command learns it should stop, stops in order, and reaches its exit status.

SIGINT (Ctrl-C) and SIGTERM stop ``run``, ``bridge`` and ``relay`` cleanly (hosts closed, peers
told); after SIGINT the command raises :class:`Interrupted` once everything has stopped, so the
command line exits with 130 as a shell expects after Ctrl-C, while SIGTERM (a service manager's
stop) exits 0. Trio delivers a Ctrl-C that no signal receiver catches as ``KeyboardInterrupt``
inside nested exception groups; :func:`is_interrupt` recognizes both.

``companion run`` stops its companions in order (:func:`stop_in_order`), so that nothing that
arrived is lost and nothing is published by a node that is gone: turns first, then clients,
then nodes, then files. A second signal during that stops at once (:class:`Interrupted` with
128 + the signal's number); the files are still flushed and closed on the way out.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

import trio

from companion.log import library_teardown, log_event

_log = logging.getLogger("companion.app.stopping")

if TYPE_CHECKING:
    from companion.node import CompanionNode

__all__ = [
    "CLIENTS_CATCH_UP",
    "STOP_GRACE",
    "Interrupted",
    "Stop",
    "Stoppable",
    "exit_status",
    "is_interrupt",
    "note_stopping",
    "stop_in_order",
]

CLIENTS_CATCH_UP: Final = 2.0
"""Seconds a stop waits for the messages its companions sent while stopping to reach this
process's clients, before it closes them."""
STOP_GRACE: Final = 3.0
"""Seconds a lead or a reply in flight has to finish once a stop begins; then it is withdrawn."""


class Interrupted(Exception):
    """A signal stopped the command: it exits with ``status`` (130 after SIGINT; 128 + the
    signal's number after a second signal that stopped it at once)."""

    def __init__(self, status: int = 130) -> None:
        super().__init__(f"stopped by a signal (exit {status})")
        self.status = status


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C: :class:`Interrupted`, ``KeyboardInterrupt``, or exception
    groups holding nothing else (trio wraps each task's exception)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split((KeyboardInterrupt, Interrupted))
        return rest is None
    return isinstance(exc, KeyboardInterrupt | Interrupted)


def exit_status(exc: BaseException) -> int:
    """The exit status of an interrupt (:func:`is_interrupt`): the first :class:`Interrupted`'s
    own, else 130 (``KeyboardInterrupt``)."""
    if isinstance(exc, Interrupted):
        return exc.status
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            status = exit_status(inner)
            if status != 130:
                return status
    return 130


def note_stopping(logger: logging.Logger, signum: int) -> None:
    """Log ``stopping`` with the signal's name; py-libp2p's records of the teardown that
    follows are left out (:func:`~companion.log.library_teardown`)."""
    log_event(logger, "stopping", signal=signal.Signals(signum).name)
    library_teardown()


class Stop:
    """The first SIGINT or SIGTERM of ``companion run``. Once the command runs (it awaits
    :meth:`wait`), :meth:`request` lets it stop in order; during start-up (no turn taken, no
    client let in yet) it cancels ``everything`` at once, as any stop did before."""

    def __init__(self, everything: trio.CancelScope) -> None:
        self.everything = everything
        self._requested = trio.Event()
        self._running = False

    def request(self) -> None:
        self._requested.set()
        if not self._running:
            self.everything.cancel()

    async def wait(self) -> None:
        """Until :meth:`request`: the command runs, a stop is now one in order."""
        self._running = True
        await self._requested.wait()


class Stoppable(Protocol):
    """A companion as :func:`stop_in_order` stops it (:class:`~.engines.CompanionHandler`)."""

    async def stop(self, grace: float) -> None: ...

    async def close(self) -> None: ...


async def stop_in_order(
    companions: Sequence[Stoppable],
    nodes: Sequence[CompanionNode],
    *,
    clients: trio.CancelScope | None = None,
    written: Callable[[Iterable[str], float], Awaitable[bool]] | None = None,
    grace: float = STOP_GRACE,
) -> None:
    """Stop ``companion run`` without losing a message, each step for every companion at once:

    1. turns: no new one; a lead or a reply in flight finishes or is withdrawn within ``grace``
       seconds, and its last publishes go out (the nodes still run, so they reach the peers);
    2. clients: once the messages the companions sent in step 1 reached them (``written``, the
       bridge's :meth:`~companion.bridge.Bridge.written`, at most :data:`CLIENTS_CATCH_UP`
       seconds), ``clients`` (the scope serving them) is cancelled;
    3. nodes: peers are told, hosts close, and what passed a node's edge before reaches its
       engine, which records it (the files are still open);
    4. files: each companion's history and tools' store is flushed and closed.

    Each step is bounded (``grace``, then the publish and node close deadlines), so a stop ends
    within seconds whatever a model or a peer does."""
    before = {mid for node in nodes for mid in node.messages_sent}
    async with trio.open_nursery() as nursery:
        for companion in companions:
            nursery.start_soon(companion.stop, grace)
    sent = [mid for node in nodes for mid in node.messages_sent if mid not in before]
    if written is not None and sent and not await written(sent, CLIENTS_CATCH_UP):
        log_event(_log, "clients_not_caught_up", logging.WARNING, messages=len(sent))
    if clients is not None:
        clients.cancel()
    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(node.stop)
    async with trio.open_nursery() as nursery:
        for companion in companions:
            nursery.start_soon(companion.close)
