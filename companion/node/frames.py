"""Whole frames: a write on a secured connection is never cut short by a caller's cancellation.

py-libp2p 0.8.1's Noise session encrypts a frame (spending the next nonce) and only then awaits
the socket write. If the writing task's cancel scope has expired by then, trio raises
``Cancelled`` at the socket's first checkpoint: the frame is never sent, but its nonce is
spent, so the peer fails to decrypt the connection's *next* frame and closes the connection.
It happens whenever a deadline passes in the same scheduler tick as the task is handed the
muxer's write lock (a health probe, a DHT query or a metadata request timing out while another
frame is being written): measured, the connection died at once, the peer closing it and our
next writer getting "Broken pipe" (a node answering a DHT query after its peer resumed from a
5 s freeze). A cancellation inside a frame already half on the socket breaks it the same way.

:func:`write_whole_frames` wraps one connection's secured writer: a cancellation that arrives
before the frame is encrypted is raised as before (nothing was spent); once encryption has
begun the write runs shielded to its end, within :data:`FRAME_WRITE_DEADLINE`. A frame that
still has not left by then may be partly on the wire, so the connection is closed and the
write fails as a closed connection does (``RawConnError``); the caller's own cancellation is
delivered at its next checkpoint, after the frame. A frame waits only when the peer stopped
reading and the socket's buffer is full (a laptop gone to sleep, a frozen process). Closing the
socket wakes it at once, but Yamux's close first writes its GO_AWAY frame behind the stuck one:
so once the muxer is closing, frames in flight and frames still to come have
:data:`CLOSE_GRACE` left (a healthy frame leaves in microseconds). Without that, a node stopping
beside a peer that stopped reading waited out the whole deadline in the shielded write, past
its own stop deadline (``NodeConfig.close_timeout``).

:class:`WholeFrames` applies it to every connection of a host as it opens (``config.make_host``
registers it first, so it runs before any other notifee can write).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio
from libp2p.abc import INetConn
from libp2p.network.connection.exceptions import RawConnError

from companion.log import log_event
from companion.node.notifee import ConnectionNotifee

__all__ = ["CLOSE_GRACE", "FRAME_WRITE_DEADLINE", "WholeFrames", "write_whole_frames"]

logger = logging.getLogger("companion.node.frames")

FRAME_WRITE_DEADLINE: Final = 10.0
"""Seconds one frame may take to leave (a full 256 KiB Yamux frame at ~200 kbit/s). A peer that
has not read for this long is not reading: its connection is closed."""
CLOSE_GRACE: Final = 1.0
"""Seconds a frame has left once its connection is closing."""

_GUARDED: Final = "_companion_whole_frames"


def write_whole_frames(
    muxed_conn: Any, deadline: float = FRAME_WRITE_DEADLINE, close_grace: float = CLOSE_GRACE
) -> None:
    """Make the secured connection under ``muxed_conn`` write each frame whole, within
    ``deadline``, or ``close_grace`` once the muxer is closing (once; a muxer without a secured
    connection, as a test double may be, is left as it is)."""
    secured = getattr(muxed_conn, "secured_conn", None)
    if secured is None or getattr(secured, _GUARDED, False):
        return
    write = secured.write
    close = muxed_conn.close
    in_flight: set[trio.CancelScope] = set()
    closing = False

    async def whole_write(data: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()  # nothing spent yet: cancel as before
        allowed = close_grace if closing else deadline
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + allowed
            in_flight.add(scope)
            try:
                await write(data)
            finally:
                in_flight.discard(scope)
        if scope.cancelled_caught:
            log_event(
                logger,
                "frame_write_timeout",
                logging.INFO if closing else logging.WARNING,
                peer=str(getattr(muxed_conn, "peer_id", "?")),
                bytes=len(data),
                closing=closing,
            )
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                try:
                    await secured.close()
                except Exception as exc:  # closing a broken connection: it is gone either way
                    log_event(logger, "frame_close_failed", logging.DEBUG, error=repr(exc))
            raise RawConnError(f"a frame did not leave within {allowed} s: connection closed")

    async def close_soon(*args: Any, **kwargs: Any) -> None:
        nonlocal closing
        if not closing:
            closing = True
            cut = trio.current_time() + close_grace
            for scope in in_flight:
                scope.deadline = min(scope.deadline, cut)
        await close(*args, **kwargs)

    secured.write = whole_write
    muxed_conn.close = close_soon
    setattr(secured, _GUARDED, True)


class WholeFrames(ConnectionNotifee):
    """Applies :func:`write_whole_frames` to each connection as the swarm reports it open."""

    async def connected(self, network: Any, conn: INetConn) -> None:
        write_whole_frames(conn.muxed_conn)
