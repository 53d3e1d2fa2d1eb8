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

from companion.log import log_event

__all__ = ["Backoff", "MdnsBridge", "dial_error", "parse_peer_addr", "redial_forever"]

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


def dial_error(exc: BaseException, max_chars: int = 300) -> str:
    """Why a dial failed, for a log line: the root causes of ``exc``. py-libp2p 0.8.1's swarm
    raises "unable to connect to PEER, no addresses established a successful connection (with
    exceptions)", the reason of each address (refused, unreachable, a handshake that failed)
    only in its chained causes, where a log line does not show them."""
    causes: list[str] = []
    pending: list[BaseException] = [exc]
    while pending and len(causes) < 8:
        error = pending.pop(0)
        inner = getattr(error, "errors", None)  # py-libp2p's MultiError: one error per address
        if isinstance(error, BaseExceptionGroup):  # trio's: one per address a name resolved to
            pending.extend(error.exceptions)
        elif isinstance(inner, list | tuple) and inner:
            pending.extend(e for e in inner if isinstance(e, BaseException))
        elif error.__cause__ is not None:
            pending.append(error.__cause__)
        else:
            text = f"{type(error).__name__}: {error}"
            if text not in causes:
                causes.append(text)
    return "; ".join(causes)[:max_chars] or f"{type(exc).__name__}: {exc}"[:max_chars]


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
    from ``initial`` once a connection was seen up. The first failure of an outage is a WARNING
    with its reason (a mistyped ``--peer`` shows at once, in the default log level); the retries
    are INFO, until a connection is up again.
    """
    first = True
    reported = False
    while True:
        if is_connected(info.peer_id):
            backoff.reset()
            reported = False
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
                logging.INFO if reported else logging.WARNING,
                peer=str(info.peer_id),
                addrs=[str(addr) for addr in info.addrs],
                error=dial_error(exc),
                retrying=True,
            )
            reported = True


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
