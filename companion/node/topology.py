"""Which connections a node keeps: at most ``max_connections`` (plus protected ones), inbound too,
and a ring that keeps the network in one piece.

py-libp2p's connection manager dials known peers up to a target (``config.connection_config``:
half the bound, so a node has room for peers that dial it) and has a pruner with a grace
period, but the pruner never closes a connection with an open stream, and every gossipsub peer
has one: inbound connections were never trimmed. This module trims them itself, as a policy:

1. **Protected** peers are never trimmed and not counted: bootstrap peers and relays (protected
   in py-libp2p's tag store) and the bridges the operator allowed to answer (the in-process
   clients node of ``companion run --ws`` among them).
2. **Ring neighbours** are never trimmed: among the peers announcing presence (and this node),
   sorted by peer id, each node keeps a connection to the one before and the one after it, and
   dials them when they are not connected. Since every node sees the same announcements, the
   ring edges form one cycle through every companion: trimming anything else cannot cut the
   network in two.
3. Beyond the bound, the peers kept first are those only a direct connection keeps in the
   directory (companions that do not announce presence: aikyo's), then peers in more gossipsub
   meshes, then the oldest connections; the rest is trimmed, each connection only after a
   ``grace`` period (time to exchange metadata and a first announcement).

Before it trims a connection, a node hands the peer its latest presence announcement (or
announces anew, :meth:`~.presence.PresenceService.announce_now`; nothing to a peer that is not on
the presence topic) and tells the peer on
:data:`TRIM_PROTOCOL` (a notice, :mod:`.notice`, the peer acknowledges): the trimmed peer keeps it
in its directory, reachable through gossip, while a peer whose connection closed without that
notice (killed, or unreachable) leaves its neighbours' directories at once (see
:mod:`companion.node.announcements`). So a trim whose notice went unanswered is put off to a later pass
rather than done untold (:data:`NOTICE_ATTEMPTS`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from companion.log import log_event
from companion.node.discovery import Backoff
from companion.node.logfilters import reports_stream_failures
from companion.node.notice import acknowledge, tell

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = [
    "TRIM_PROTOCOL",
    "Link",
    "Topology",
    "TrimPlan",
    "close_peer",
    "dial_target",
    "disable_libp2p_pruner",
    "plan_trims",
    "ring_neighbours",
]

logger = logging.getLogger("companion.node.topology")

MIN_PASS_INTERVAL: Final = 1.0
"""Seconds between two passes over the connections (each pass is cheap; changes come in bursts)."""
RECHECK_INTERVAL: Final = 5.0
"""The longest a node goes without a pass over its connections, changes or not."""
RING_DIAL_TIMEOUT: Final = 5.0
TRIM_PROTOCOL: Final = TProtocol("/companion/trim/1.0.0")
"""Opened by a node about to close a connection on purpose; the peer answers one byte."""
reports_stream_failures(TRIM_PROTOCOL)  # a peer without it is no error: see where it is opened
NOTICE_TIMEOUT: Final = 10.0
"""How long telling a peer it is being trimmed may take (then it is closed regardless). A new
stream's negotiation and the byte back are two round trips through a busy peer's loop: with 30
companions on 2 cores every notice of a 2 s deadline ran out (the close came 2.5 s after the
trim), each trimmed peer took the close for a failure, announced the trimmer ``lost``, and the
trimmer dropped out of directories (``companion_left`` ``expired``). Notices of one pass go out
together, so a pass waits for the slowest one, not their sum."""
NOTICE_VALID: Final = 30.0
"""Seconds a peer's trim notice covers the disconnect that should follow it."""
NOTICE_ATTEMPTS: Final = 3
"""Passes that may try to tell a peer it is trimmed before it is closed untold. A notice left
unanswered puts the trim off to a later pass and the connection stays (the bound is exceeded a
while): with 30 companions on 2 cores a hub that trimmed 16 peers at once had every notice run
out (its own send queues were full), closed them all untold, and each peer took the close for a
failure, reported the hub ``lost`` to everyone, and the hub, too busy to refute in time, left
every directory (``companion_left`` ``expired``). A peer that refuses the protocol (aikyo's) is
closed at once; one that never answers (frozen) is closed after the last attempt."""


def dial_target(max_connections: int) -> int:
    """How many connections a node dials itself: half its bound (rounded up), so that on average
    as many peers dial it and most nodes stay within the bound without trimming."""
    return max(1, math.ceil(max_connections / 2))


CLOSE_ROUNDS: Final = 8
"""Rounds :func:`close_peer` goes through before it gives up on a peer that keeps dialling."""


async def close_peer(network: Any, peer: ID) -> None:
    """Close every connection to ``peer``, those it opens while they close included.

    py-libp2p 0.8.1's ``Swarm.close_peer`` (and ``BasicHost.disconnect``) closes the connections
    it has when called, ~0.2 s each, then drops the peer's entry from its table: a connection the
    peer opened meanwhile (a neighbour's keeper redials a lost link at once) stayed open but
    unlisted, so it was never trimmed, never reported closed, and the peer held it as live for
    good. Here each connection is closed by itself (it leaves the table as it closes, and its
    close is reported), and the table is read again until it holds none (at most
    :data:`CLOSE_ROUNDS` rounds)."""
    for _ in range(CLOSE_ROUNDS):
        connections = list(network.connections.get(peer, ()))
        if not connections:
            return
        async with trio.open_nursery() as nursery:
            for conn in connections:
                nursery.start_soon(_close_quietly, conn)


async def _close_quietly(conn: Any) -> None:
    try:
        await conn.close()
    except Exception as exc:  # the connection is going away anyway
        log_event(logger, "connection_close_failed", logging.DEBUG, error=repr(exc)[:200])


def disable_libp2p_pruner(host: Any) -> None:
    """Leave trimming to :class:`Topology`. Above its high watermark py-libp2p's pruner closes
    connections without open streams down to the *low* watermark, whatever they carry, with no
    notice to the peer; the policy here decides instead. A pruner that was never started does
    nothing, so the running one is replaced by a fresh one."""
    network = host.get_network()
    current = getattr(network, "connection_pruner", None)
    if current is not None:
        network.connection_pruner = type(current)(network)


def ring_neighbours(self_peer: str, members: Iterable[str]) -> frozenset[str]:
    """The peers just before and just after ``self_peer`` among ``members`` sorted by peer id
    (wrapping around); none when alone."""
    ring = sorted({*members, self_peer})
    if len(ring) < 2:
        return frozenset()
    at = ring.index(self_peer)
    return frozenset({ring[at - 1], ring[(at + 1) % len(ring)]})


@dataclass(frozen=True, slots=True)
class Link:
    """What the policy knows about one connected peer."""

    peer: str
    since: float
    """When the first of its current connections opened (monotonic clock)."""
    protected: bool = False
    ring: bool = False
    direct_only: bool = False
    """A companion present in the directory only through this connection (it does not announce)."""
    meshes: int = 0
    """Gossipsub topics whose mesh holds it."""


@dataclass(frozen=True, slots=True)
class TrimPlan:
    close: tuple[str, ...]
    """Peers to disconnect now."""
    later: float | None
    """When a peer due for trimming leaves its grace period (look again then)."""


def plan_trims(links: Sequence[Link], *, bound: int, grace: float, now: float) -> TrimPlan:
    """Which peers to disconnect so that at most ``bound`` unprotected peers stay connected
    (ring neighbours are kept even beyond it). The ones trimmed are the least worth keeping
    (see the module docstring); one still in its grace period is trimmed when it ends."""
    counted = [link for link in links if not link.protected]
    excess = len(counted) - bound
    if excess <= 0:
        return TrimPlan((), None)
    candidates = sorted(
        (link for link in counted if not link.ring),
        key=lambda link: (link.direct_only, link.meshes, -link.since),
    )[:excess]
    close = tuple(link.peer for link in candidates if now - link.since >= grace)
    young = [link.since + grace for link in candidates if now - link.since < grace]
    return TrimPlan(close, min(young) if young else None)


Dial = Callable[[ID], Awaitable[bool]]


class Topology:
    """The trio shell: trims excess connections and keeps the ring neighbours connected.

    The node reports connections as they open and close (:meth:`connected`,
    :meth:`disconnected`), asks on each disconnect whether it was on purpose
    (:meth:`closed_on_purpose`: our trim, or the peer's, announced on :data:`TRIM_PROTOCOL`),
    and serves that protocol with :meth:`serve_notice`."""

    def __init__(
        self,
        host: Any,
        *,
        name: str,
        bound: int,
        grace: float,
        self_peer: str,
        is_protected: Callable[[ID], bool],
        ring_members: Callable[[], Iterable[str]] | None,
        direct_only: Callable[[], frozenset[str]],
        meshes: Callable[[], Iterable[Iterable[ID]]],
        announce: Callable[[Sequence[str]], Awaitable[None]],
        dial: Dial,
        wait_for_change: Callable[[], Awaitable[None]],
    ) -> None:
        self.host = host
        self.name = name
        self.bound = bound
        self.grace = grace
        self.self_peer = self_peer
        self._is_protected = is_protected
        self._ring_members = ring_members
        self._direct_only = direct_only
        self._meshes = meshes
        self._announce = announce
        self._dial = dial
        self._wait_for_change = wait_for_change
        self._since: dict[str, float] = {}
        self._trimming: set[str] = set()
        self._notices: dict[str, float] = {}
        """Connected peers that told us they are trimming us, and when."""
        self._unanswered: dict[str, int] = {}
        """Connected peers whose trim notice went unanswered, and how many times."""
        self._dialling: set[str] = set()
        self._backoff: dict[str, tuple[Backoff, float]] = {}
        self.trimmed = 0
        self.trims_put_off = 0
        self.ring_dials = 0

    def stats(self) -> dict[str, Any]:
        return {
            "trimmed": self.trimmed,
            "trims_put_off": self.trims_put_off,
            "ring_dials": self.ring_dials,
            "ring": sorted(self._ring()),
        }

    # --- what the node reports --------------------------------------------------------------

    def connected(self, peer: str, now: float) -> None:
        self._since.setdefault(peer, now)

    def disconnected(self, peer: str) -> None:
        self._since.pop(peer, None)
        self._unanswered.pop(peer, None)

    def trimming(self, peer: str) -> bool:
        """Whether a connection to ``peer`` closing now is a trim, by us or by the peer (which
        said so first); unlike :meth:`closed_on_purpose` it forgets nothing."""
        told = self._notices.get(peer)
        return peer in self._trimming or (told is not None and trio.current_time() - told <= NOTICE_VALID)

    def closed_on_purpose(self, peer: str) -> bool:
        """Whether the connection to ``peer`` that just closed was trimmed, by us or by the peer
        (which said so first); forgets both marks."""
        on_purpose = self.trimming(peer)
        self._trimming.discard(peer)
        self._notices.pop(peer, None)
        return on_purpose

    async def serve_notice(self, stream: Any) -> None:
        """A peer is about to trim its connection to us: remember it (one mark per connected
        peer, so it stays bounded) and acknowledge, so it closes only after we know."""
        peer = stream.muxed_conn.peer_id
        if self.host.get_network().connections.get(peer):
            self._notices[peer.to_base58()] = trio.current_time()
        await acknowledge(stream, NOTICE_TIMEOUT, node=self.name)

    # --- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                plan = plan_trims(self._links(), bound=self.bound, grace=self.grace, now=trio.current_time())
                if plan.close:
                    await self._trim(plan.close)
                self._keep_ring(nursery)
                # A change that happens between two waits sets an event nobody waits on any more
                # (the node replaces it): a hub whose eleven connections came during the pause
                # after a pass with two never looked again until the next change, 45 s later.
                # So the pause comes after the wait, and a pass runs at least every few seconds.
                later = plan.later if plan.later is not None else math.inf
                with trio.move_on_at(min(later, trio.current_time() + RECHECK_INTERVAL)):
                    await self._wait_for_change()
                await trio.sleep(MIN_PASS_INTERVAL)

    def _ring(self) -> frozenset[str]:
        """Our ring neighbours (none for a node that does not announce itself: a bridge)."""
        if self._ring_members is None:
            return frozenset()
        return ring_neighbours(self.self_peer, self._ring_members())

    def _links(self) -> list[Link]:
        ring = self._ring()
        direct_only = self._direct_only()
        in_mesh: dict[str, int] = {}
        for mesh in self._meshes():
            for peer in mesh:
                name = peer.to_base58()
                in_mesh[name] = in_mesh.get(name, 0) + 1
        now = trio.current_time()
        links = []
        for peer in list(self.host.get_network().connections):
            name = peer.to_base58()
            if name in self._trimming:
                continue
            links.append(
                Link(
                    name,
                    self._since.get(name, now),
                    protected=self._is_protected(peer),
                    ring=name in ring,
                    direct_only=name in direct_only,
                    meshes=in_mesh.get(name, 0),
                )
            )
        return links

    async def _trim(self, peers: tuple[str, ...]) -> None:
        """Make sure each peer holds our latest announcement (handed over, or announced anew)
        and tell it (so it keeps us: see the module docstring), then close."""
        self._trimming.update(peers)
        await self._announce(peers)
        async with trio.open_nursery() as nursery:
            for name in peers:
                nursery.start_soon(self._trim_one, name)

    async def _trim_one(self, name: str) -> None:
        """Tell the peer, then close; a notice left unanswered puts the trim off
        (:data:`NOTICE_ATTEMPTS`)."""
        network = self.host.get_network()
        peer = ID.from_base58(name)
        outcome = await tell(self.host, peer, TRIM_PROTOCOL, NOTICE_TIMEOUT, node=self.name)
        if outcome == "unanswered" and network.connections.get(peer):
            attempt = self._unanswered.get(name, 0) + 1
            if attempt < NOTICE_ATTEMPTS:
                self._unanswered[name] = attempt
                self._trimming.discard(name)
                self.trims_put_off += 1
                log_event(logger, "trim_put_off", node=self.name, peer=name, attempt=attempt)
                return
        self._unanswered.pop(name, None)
        log_event(logger, "connection_trimmed", node=self.name, peer=name, bound=self.bound, notice=outcome)
        self.trimmed += 1
        try:
            with trio.move_on_after(RING_DIAL_TIMEOUT):
                await close_peer(network, peer)
        except Exception as exc:
            error = repr(exc)[:200]
            log_event(logger, "trim_failed", logging.WARNING, node=self.name, peer=name, error=error)
        if name not in self._since or network.connections.get(peer):
            self._trimming.discard(name)  # its disconnect was seen already, or it failed

    def _keep_ring(self, nursery: trio.Nursery) -> None:
        connections = self.host.get_network().connections
        now = trio.current_time()
        for name in sorted(self._ring()):
            if name in self._dialling or name in self._trimming:
                continue
            peer = ID.from_base58(name)
            if connections.get(peer):
                self._backoff.pop(name, None)
                continue
            backoff, not_before = self._backoff.get(name, (Backoff(1.0, 30.0), 0.0))
            if now < not_before:
                continue
            self._backoff[name] = (backoff, now + backoff.next())
            self._dialling.add(name)
            nursery.start_soon(self._dial_ring, name, peer)
        for name in [n for n in self._backoff if n not in self._ring()]:
            del self._backoff[name]

    async def _dial_ring(self, name: str, peer: ID) -> None:
        self.ring_dials += 1
        try:
            with trio.move_on_after(RING_DIAL_TIMEOUT):
                ok = await self._dial(peer)
                log_event(logger, "ring_dialled", logging.DEBUG, node=self.name, peer=name, ok=ok)
        except Exception as exc:  # a failed dial is normal; it must never end the node
            log_event(
                logger, "ring_dial_failed", logging.DEBUG, node=self.name, peer=name, error=repr(exc)[:200]
            )
        finally:
            self._dialling.discard(name)
