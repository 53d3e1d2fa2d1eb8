"""Finding peers beyond one LAN: py-libp2p's Kademlia DHT asks connected peers who else exists.

Any one bootstrap address is enough. Every node runs the DHT (``libp2p.kad_dht``, server mode)
and regularly asks each peer it is connected to (a bootstrap node, a relay, any neighbour) for the
peers closest to its own id and to a random key; the answers (peer ids, addresses and signed
peer records) land in the peerstore. Dialling is bounded: py-libp2p's connection manager
(``ConnectionConfig`` watermarks, see ``config.connection_config``) dials known peers until the
node has its dial target (half of ``NodeConfig.max_connections``, :func:`topology.dial_target`)
connections, and peers that only a relay reaches are dialled through one
(``NatTraversal.dial_relayed``) within the same target. Connections beyond the bound, inbound
ones included, are trimmed by :mod:`companion.node.topology`.

Lookups only ask peers we are already connected to (one FIND_NODE each): an iterative Kademlia
lookup would connect to every peer it asks, which is the full mesh this module exists to avoid.
The search still spreads, since each new connection is asked in the next round.

Rounds run on a timer that starts at :data:`LOOKUP_INTERVAL_MIN` and doubles after every round
that learns no peer it did not know, up to :data:`LOOKUP_INTERVAL_MAX` (the ten minutes between
go-libp2p's routing-table refreshes); a round that learns someone new starts the doubling over.
A connection opening or closing brings a smaller round forward (a second later): it asks only
the neighbours not asked before and dials a replacement for a lost one. A node in a network
smaller than its dial target never reaches the target, and neighbours coming and going (clients,
trims) must not keep it asking the same peers: each FIND_NODE costs both ends ~15-20 ms of CPU
(a stream negotiated, signed peer records checked), and at one round a minute that was half of
an idle companion's CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio
from libp2p.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL_ID
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from companion.log import log_event
from companion.node.discovery import Backoff
from companion.node.relay import is_circuit

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["LOOKUP_INTERVAL_MAX", "LOOKUP_INTERVAL_MIN", "DhtDiscovery"]

logger = logging.getLogger("companion.node.routing")

LOOKUP_INTERVAL_MIN: Final = 1.0
LOOKUP_INTERVAL_MAX: Final = 600.0
RELAYED_BACKOFF_MAX: Final = 60.0
"""Longest wait before a peer whose relayed dial failed is tried again (in a later round)."""
QUERY_TIMEOUT: Final = 5.0
"""Deadline of one FIND_NODE to one connected peer."""
MAX_QUERIED: Final = 8
"""Connected peers asked per round (a node has at most ``max_connections`` of them anyway)."""
DIRECT_HEAD_START: Final = 1.0
"""Seconds the direct dials get before a peer that is still not connected is dialled through a
relay (a LAN dial takes milliseconds; a private address on another network never answers)."""

MAX_BACKOFF_ENTRIES: Final = 1024
MAX_LEARNED: Final = 4096
"""Peers remembered as named by the DHT (to tell a round that learns someone new); past this,
the memory starts over (one round then counts as learning)."""
"""Peers whose relayed dial failed, remembered for their backoff (oldest forgotten first)."""

RelayedDial = Callable[[ID], Awaitable[bool]]


class _AskConnectedOnly(KadDHT):
    """py-libp2p's DHT without its own routing-table refresh: at start and every 10 minutes it
    runs an iterative lookup for its own id, which opens a connection to every peer it queries
    (measured: 12 nodes given one hub each opened 4-5 connections within a second of starting,
    so every node had 10 or 11 and then trimmed most of them). :meth:`DhtDiscovery.round` asks
    connected peers instead."""

    async def refresh_routing_table(self) -> None:
        return None


class DhtDiscovery:
    """The DHT service of one host, its lookup rounds and the bounded dialling that follows."""

    def __init__(
        self,
        host: Any,
        *,
        name: str,
        max_connections: int,
        wait_for_change: Callable[[], Awaitable[None]],
        dial_relayed: RelayedDial | None = None,
        serve_only: bool = False,
    ) -> None:
        self.host = host
        self.name = name
        self.max_connections = max_connections
        """How many connections this node dials up to (its dial target)."""
        self.serve_only = serve_only
        self.dht = _AskConnectedOnly(host, DHTMode.SERVER, enable_providers=False, enable_values=False)
        self.lookups = 0
        self.learned: set[ID] = set()
        self._self_id: ID = host.get_id()
        self._wait_for_change = wait_for_change
        self._dial_relayed = dial_relayed
        self._relay_backoff: dict[ID, tuple[Backoff, float]] = {}
        self._asked: set[ID] = set()
        """Connected peers asked at least once (a change's round asks only the others)."""

    def stats(self) -> dict[str, Any]:
        return {
            "dht_lookups": self.lookups,
            "dht_peers_learned": len(self.learned),
            "dht_table": self.dht.get_routing_table_size(),
        }

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with background_trio_service(self.dht):
            task_status.started()
            interval = LOOKUP_INTERVAL_MIN
            everyone = True
            while True:
                learned = await self.round(everyone=everyone)
                if learned:
                    interval = LOOKUP_INTERVAL_MIN
                elif everyone:
                    interval = min(interval * 2, LOOKUP_INTERVAL_MAX)
                await trio.sleep(LOOKUP_INTERVAL_MIN)  # at most one round a second
                with trio.move_on_after(max(0.0, interval - LOOKUP_INTERVAL_MIN)) as timer:
                    await self._wait_for_change()
                everyone = timer.cancelled_caught

    # --- one round ------------------------------------------------------------------------------

    async def round(self, *, everyone: bool = True) -> bool:
        """Put connected DHT servers in the routing table; below the bound, ask them (all, or
        only those never asked) who else exists and dial what they name. ``True`` if a peer not
        known before was named."""
        servers = await self._fill_table()
        self._asked &= set(servers)  # bounded by the connections
        if self.serve_only or self._connection_count() >= self.max_connections:
            return False
        asking = servers if everyone else [peer for peer in servers if peer not in self._asked]
        found: set[ID] = set()
        if asking:
            self.lookups += 1
            keys = [self._self_id.to_bytes(), os.urandom(32)]
            async with trio.open_nursery() as nursery:
                for peer in asking[:MAX_QUERIED]:
                    self._asked.add(peer)
                    for key in keys:
                        nursery.start_soon(self._ask, peer, key, found)
        found.discard(self._self_id)
        new = found - self.learned
        if len(self.learned) + len(new) > MAX_LEARNED:  # bounded: forget, and learn it again
            self.learned = set()
        self.learned |= found
        if new:
            log_event(logger, "dht_peers_found", node=self.name, new=len(new), known=len(self.learned))
        await self._dial_found(found if asking else self.learned)  # a lost one replaced
        return bool(new)

    def _connection_count(self) -> int:
        return len(self.host.get_network().connections)

    async def _fill_table(self) -> list[ID]:
        """Connected peers that serve the DHT (by identify), added to the routing table (py-libp2p
        adds a peer only when it queries us, and drops it if identify had not run yet)."""
        store = self.host.get_peerstore()
        servers: list[ID] = []
        for peer in list(self.host.get_network().connections):
            try:
                if KAD_PROTOCOL_ID not in store.get_protocols(peer):
                    continue
            except Exception:
                continue
            servers.append(peer)
            try:
                await self.dht.add_peer(peer)
            except Exception as exc:
                log_event(logger, "dht_add_failed", logging.DEBUG, node=self.name, error=repr(exc))
        return servers

    async def locate(self, target: ID) -> bool:
        """Ask the connected DHT servers for ``target`` (one FIND_NODE each, for its id), so its
        addresses land in the peerstore; ``True`` if the peerstore has some afterwards."""
        found: set[ID] = set()
        async with trio.open_nursery() as nursery:
            for peer in (await self._fill_table())[:MAX_QUERIED]:
                if peer != target:
                    nursery.start_soon(self._ask, peer, target.to_bytes(), found)
        try:
            return bool(self.host.get_peerstore().addrs(target))
        except Exception:
            return False

    async def _ask(self, peer: ID, key: bytes, found: set[ID]) -> None:
        """One FIND_NODE to one connected peer (py-libp2p stores the addresses it returns)."""
        try:
            with trio.fail_after(QUERY_TIMEOUT):
                found.update(await self.dht.peer_routing._query_peer_for_closest(peer, key))
        except Exception as exc:
            log_event(
                logger,
                "dht_query_failed",
                logging.DEBUG,
                node=self.name,
                peer=peer.to_base58(),
                error=f"{type(exc).__name__}: {exc}"[:200],
            )

    async def _dial_found(self, found: set[ID]) -> None:
        """py-libp2p's connection manager dials up to the bound; after a head start, peers it could
        not reach directly but that advertise a relay are dialled through the relay."""
        connector = getattr(self.host.get_network(), "auto_connector", None)
        async with trio.open_nursery() as nursery:
            if connector is not None:
                nursery.start_soon(connector.maybe_connect)
            if self._dial_relayed is not None:
                await trio.sleep(DIRECT_HEAD_START)
                await self._dial_through_relays(found)

    async def _dial_through_relays(self, found: set[ID]) -> None:
        assert self._dial_relayed is not None
        connections = self.host.get_network().connections
        store = self.host.get_peerstore()
        now = trio.current_time()
        for peer in sorted(found, key=lambda p: p.to_base58()):
            if len(connections) >= self.max_connections:
                return
            if peer in connections:
                continue
            try:
                addrs = store.addrs(peer)
            except Exception:
                addrs = []
            if not any(is_circuit(a) for a in addrs):
                continue
            backoff, not_before = self._relay_backoff.get(peer, (Backoff(2.0, RELAYED_BACKOFF_MAX), 0.0))
            if now < not_before:
                continue
            if await self._dial_relayed(peer):
                self._relay_backoff.pop(peer, None)
            else:
                self._relay_backoff[peer] = (backoff, now + backoff.next())
                while len(self._relay_backoff) > MAX_BACKOFF_ENTRIES:  # oldest first
                    self._relay_backoff.pop(next(iter(self._relay_backoff)))
