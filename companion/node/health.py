"""Connection health: notice a peer that stopped answering, without cutting off slow or ping-less ones.

py-libp2p's own health monitor pings every connection on a fresh ``/ipfs/ping/1.0.0`` stream
every few seconds and aborts the connection on one failed ping. Measured: that was ~95 % of an
idle node's CPU, a busy node closed healthy connections, and aikyo's companions (which mount
no ping protocol) were cut off every few seconds. This monitor replaces it:

- Any bytes received on a connection prove the peer alive: a connection with traffic within
  ``interval`` seconds is never probed.
- A silent connection is probed with a Yamux ping frame (part of Yamux itself, answered by
  every Yamux implementation, aikyo's included; no stream, no protocol negotiation).
- One probe unanswered within ``timeout`` is tolerated (the next probe follows at once); only
  ``failures_allowed + 1`` unanswered probes in a row close the connection, counted as the
  disconnect reason ``unresponsive``.

A frozen peer is therefore noticed within about ``interval + (failures_allowed + 1) * timeout``.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import trio
from libp2p.abc import INetConn
from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_PING, YAMUX_HEADER_FORMAT

from companion.log import log_event

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["ConnectionHealth", "HealthSettings"]

logger = logging.getLogger("companion.node.health")

_PING_NONCE = 0x636F6D70  # "comp": our probes' opaque value (peers echo it back)


class HealthSettings:
    """How often silent connections are probed, how long an answer may take, how many
    unanswered probes in a row are tolerated."""

    def __init__(self, interval: float, timeout: float, failures_allowed: int) -> None:
        if interval <= 0 or timeout <= 0 or failures_allowed < 0:
            raise ValueError("health interval and timeout must be positive, failures_allowed >= 0")
        self.interval = interval
        self.timeout = timeout
        self.failures_allowed = failures_allowed


class _Traffic:
    """When a connection last received bytes: stamped by a wrapper around its secured reader."""

    def __init__(self) -> None:
        self.last = trio.current_time()
        self.arrived = trio.Event()

    def stamp(self) -> None:
        self.last = trio.current_time()
        self.arrived.set()
        self.arrived = trio.Event()


class ConnectionHealth:
    """Watches each connection in its own task (spawned by :meth:`watch`, ending with it), in
    the nursery of :meth:`run`."""

    def __init__(
        self,
        settings: HealthSettings,
        close: Callable[[INetConn, str], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self._close = close
        self._traffic: WeakKeyDictionary[INetConn, _Traffic] = WeakKeyDictionary()
        self.probes = 0
        self.probe_failures = 0
        self.closed: Counter[str] = Counter()
        self._nursery: trio.Nursery | None = None

    def stats(self) -> dict[str, int]:
        return {"probes": self.probes, "probe_failures": self.probe_failures, **self.closed}

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the watches of :meth:`watch` until cancelled; started once it takes them."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def watch(self, conn: INetConn) -> None:
        """Start watching ``conn`` (once); the watch ends when the connection closes. Only
        while :meth:`run` runs: a connection that comes after it ended is not watched."""
        nursery = self._nursery
        if nursery is None or conn in self._traffic:
            return
        muxed = conn.muxed_conn
        secured = getattr(muxed, "secured_conn", None)
        if secured is None or not hasattr(muxed, "_write_frame"):
            log_event(
                logger, "health_unwatched", logging.INFO, peer=str(muxed.peer_id), muxer=type(muxed).__name__
            )
            return
        traffic = self._traffic[conn] = _Traffic()
        read = secured.read

        async def stamped_read(n: int | None = None) -> bytes:
            data: bytes = await read(n)
            if data:
                traffic.stamp()
            return data

        secured.read = stamped_read
        nursery.start_soon(self._watch, conn, traffic)

    async def _watch(self, conn: INetConn, traffic: _Traffic) -> None:
        settings = self.settings
        failures = 0
        while not _closed(conn):
            quiet_for = trio.current_time() - traffic.last
            if failures == 0 and quiet_for < settings.interval:
                await trio.sleep(settings.interval - quiet_for)
                continue
            if await self._probe(conn, traffic):
                failures = 0
                continue
            if _closed(conn):
                return
            failures += 1
            self.probe_failures += 1
            peer = str(conn.muxed_conn.peer_id)
            log_event(
                logger,
                "health_probe_unanswered",
                logging.INFO if failures <= settings.failures_allowed else logging.WARNING,
                peer=peer,
                failures=failures,
                allowed=settings.failures_allowed,
                silent_for=round(trio.current_time() - traffic.last, 1),
            )
            if failures > settings.failures_allowed:
                self.closed["unresponsive"] += 1
                await self._close(conn, "unresponsive")
                return

    async def _probe(self, conn: INetConn, traffic: _Traffic) -> bool:
        """Send a Yamux ping; ``True`` if any bytes arrive within the timeout."""
        muxed: Any = conn.muxed_conn
        self.probes += 1
        arrived = traffic.arrived
        with trio.move_on_after(self.settings.timeout):
            try:
                muxed._ping_sent_time = trio.current_time()  # keeps py-libp2p's RTT estimate true
                await muxed._write_frame(
                    struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_PING, FLAG_SYN, 0, _PING_NONCE)
                )
            except Exception as exc:  # the connection is going away: its close event follows
                log_event(
                    logger, "health_probe_failed", logging.DEBUG, peer=str(muxed.peer_id), error=repr(exc)
                )
                return False
            await arrived.wait()
            return True
        return False


def _closed(conn: INetConn) -> bool:
    return bool(getattr(conn, "is_closed", False) or getattr(conn.muxed_conn, "is_closed", False))
