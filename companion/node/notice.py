"""One-byte notices: "I am about to close our connection on purpose", said on a stream of its own.

A close alone does not say why it happened: a peer that sees a connection end cannot tell a
stop or a trim from a crash, and must treat it as a failure (suspect the peer, report it
lost). Gossip cannot carry the reason either: a receiver that is behind on its pubsub stream
loses what it had not read yet when the connection closes (py-libp2p's Yamux drops a stream's
unread buffer on GO_AWAY). So the closing side opens a stream on the notice's protocol and
waits for one byte back; the peer writes it once it has taken the notice, and the close comes
only after that. A peer without the protocol (aikyo's) refuses the stream at once; what a peer
that leaves the notice unanswered past the deadline means is the caller's to decide (a trim is
put off and tried again, a stop closes regardless).

Two notices use this: the trim (:mod:`.topology`) and the leave (:mod:`.presence`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal, TypeAlias

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from companion.log import log_event

__all__ = ["NoticeOutcome", "acknowledge", "tell"]

logger = logging.getLogger("companion.node.notice")

NoticeOutcome: TypeAlias = Literal["taken", "refused", "unanswered"]
"""``taken``: the byte came back; ``refused``: the stream could not be opened or failed (no such
protocol, or the connection is gone); ``unanswered``: nothing came back within the deadline (a
busy or frozen peer)."""


async def tell(
    host: Any, peer: ID, protocol: TProtocol, timeout: float, *, node: str, payload: bytes = b""
) -> NoticeOutcome:
    """Open ``protocol`` to ``peer``, write ``payload`` (what the notice says beyond its
    protocol), and wait for the byte back within ``timeout`` (:data:`NoticeOutcome`). Never
    raises (a refused or unanswered notice is logged at DEBUG: it is normal)."""
    with trio.move_on_after(timeout):
        try:
            stream = await host.new_stream(peer, [protocol])
            try:
                if payload:
                    await stream.write(payload)
                return "taken" if await stream.read(1) else "refused"
            finally:
                await stream.close()
        except Exception as exc:
            log_event(
                logger,
                "notice_unsent",
                logging.DEBUG,
                node=node,
                peer=str(peer),
                protocol=protocol,
                error=repr(exc)[:200],
            )
            return "refused"
    log_event(logger, "notice_unanswered", logging.DEBUG, node=node, peer=str(peer), protocol=protocol)
    return "unanswered"


async def acknowledge(stream: Any, timeout: float, *, node: str) -> None:
    """Write the one byte that tells the closing side its notice was taken, and close the
    stream; bounded by ``timeout`` each. Never raises."""
    try:
        with trio.move_on_after(timeout):
            await stream.write(b"\x01")
    except Exception as exc:
        log_event(logger, "notice_ack_failed", logging.DEBUG, node=node, error=repr(exc)[:200])
    finally:
        with trio.move_on_after(timeout), contextlib.suppress(Exception):
            await stream.close()
