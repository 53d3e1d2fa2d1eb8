"""Finding peers: bootstrap addresses redialled with backoff, and mDNS brought into trio.

py-libp2p's mDNS only records what it finds, on zeroconf's thread; :class:`MdnsBridge` hands
each discovery to the trio loop, where the node dials it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from ..log import log_event

__all__ = ["Backoff", "MdnsBridge", "parse_peer_addr", "redial_forever"]

logger = logging.getLogger("companion.node.discovery")


def parse_peer_addr(addr: str) -> PeerInfo:
    """A bootstrap multiaddr must name the peer (``.../p2p/PEER_ID``) so Noise can authenticate it."""
    try:
        maddr = multiaddr.Multiaddr(addr)
    except Exception as exc:
        raise ValueError(f"not a multiaddr: {addr!r} ({exc})") from exc
    try:
        return info_from_p2p_addr(maddr)
    except Exception as exc:
        raise ValueError(f"{addr!r} needs a /p2p/PEER_ID suffix ({exc})") from exc


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial``, doubling up to ``maximum``; ``reset`` on success."""

    initial: float = 0.5
    maximum: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _current: float = 0.0

    def next(self) -> float:
        self._current = self.initial if self._current == 0 else min(self._current * 2, self.maximum)
        spread = self._current * self.jitter
        return max(0.0, self._current + self.rng.uniform(-spread, spread))

    def reset(self) -> None:
        self._current = 0.0


async def redial_forever(
    info: PeerInfo,
    connect: Callable[[PeerInfo], Awaitable[None]],
    is_connected: Callable[[ID], bool],
    wait_for_change: Callable[[], Awaitable[None]],
    backoff: Backoff,
    *,
    dial_timeout: float,
) -> None:
    """Keep a connection to a bootstrap peer for as long as the caller's scope lives.

    The first dial is immediate; every later one waits the next backoff delay, which restarts
    from ``initial`` once a connection was seen up.
    """
    first = True
    while True:
        if is_connected(info.peer_id):
            backoff.reset()
            await wait_for_change()
            continue
        if not first:
            await trio.sleep(backoff.next())
        first = False
        try:
            with trio.fail_after(dial_timeout):
                await connect(info)
            log_event(logger, "bootstrap_connected", peer=str(info.peer_id))
        except Exception as exc:  # unreachable peers are normal; keep trying
            log_event(
                logger,
                "bootstrap_dial_failed",
                logging.INFO,
                peer=str(info.peer_id),
                error=f"{type(exc).__name__}: {exc}"[:200],
            )


class MdnsBridge:
    """Receives py-libp2p's mDNS discoveries (on zeroconf's thread) and sends them into trio."""

    def __init__(self, own_id: ID, send: trio.MemorySendChannel[PeerInfo], token: trio.lowlevel.TrioToken):
        self._own_id = own_id
        self._send = send
        self._token = token

    def __call__(self, info: PeerInfo) -> None:
        if info.peer_id == self._own_id:
            return
        try:
            trio.from_thread.run_sync(self._offer, info, trio_token=self._token)
        except (trio.RunFinishedError, trio.Cancelled, RuntimeError):
            return

    def _offer(self, info: PeerInfo) -> None:
        try:
            self._send.send_nowait(info)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log_event(logger, "mdns_discovery_dropped", logging.DEBUG, peer=str(info.peer_id))
