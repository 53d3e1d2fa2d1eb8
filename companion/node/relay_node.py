"""A public relay and bootstrap node: no companion, no gossipsub, only what others need to meet.

It runs py-libp2p's circuit relay v2 in the hop role (companions behind NAT reserve a slot and are
reached through it), an AutoNAT server (peers learn whether they are reachable from outside;
:class:`~companion.node.relay.DialBackAutoNAT` really dials back), and a Kademlia DHT server
(:class:`~companion.node.routing.DhtDiscovery` in serve-only mode), so any companion given its
address finds the others. Run it on a machine with a public address: ``companion relay``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from companion.log import log_event
from companion.node.addresses import AdvertisedAddrs
from companion.node.config import NodeConfig, make_host
from companion.node.discovery import Backoff, parse_peer_addr, redial_forever
from companion.node.identity import load_or_create_key_pair
from companion.node.listening import require_alone, require_listening
from companion.node.orderly import run_orderly
from companion.node.relay import DialBackAutoNAT
from companion.node.routing import DhtDiscovery

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["RelayNode", "RelayOptions"]

logger = logging.getLogger("companion.node.relay_node")

TABLE_REFRESH: Final = 1.0
"""Seconds between putting newly connected peers in the DHT routing table."""


@dataclass(frozen=True)
class RelayOptions:
    """What the relay gives each peer. Circuits carry whole conversations when hole punching
    fails, so they are not the short, small circuits of a hole-punching-only relay."""

    max_reservations: int = 128
    """Peers that may hold a reservation at once (a reservation outlives its peer's connection
    until it expires: py-libp2p counts it for ``reservation_ttl``)."""
    reservation_ttl: int = 3600
    max_circuits_per_peer: int = 16
    """Relayed connections to one reserved peer at once."""
    circuit_bytes: int = 1 << 30
    """Bytes one relayed connection may carry (both directions); then it is reset and redialled."""
    circuit_seconds: int = 0
    """How long one relayed connection may last; 0 for as long as it is used."""

    def limits(self) -> RelayLimits:
        return RelayLimits(
            duration=self.circuit_seconds,
            data=self.circuit_bytes,
            max_circuit_conns=self.max_circuits_per_peer,
            max_reservations=self.max_reservations,
            reservation_ttl=self.reservation_ttl,
        )


class RelayNode:
    """``await nursery.start(relay.run)`` returns once it listens (:attr:`listen_addrs`)."""

    def __init__(self, config: NodeConfig, options: RelayOptions | None = None) -> None:
        self.config = config
        self.options = options or RelayOptions()
        key_pair = load_or_create_key_pair(config.key_path) if config.key_path else create_new_key_pair()
        self._key_pair = key_pair
        self.host: Any = make_host(config, key_pair)
        AdvertisedAddrs().install(self.host)  # wildcard listen addresses spelled out
        self.peer_id: str = self.host.get_id().to_base58()
        self.name = config.name or "relay"
        self.listen_addrs: list[str] = []
        self.hop = CircuitV2Protocol(self.host, limits=self.options.limits(), allow_hop=True)
        self.autonat = DialBackAutoNAT(self.host, serve=True)
        self.autonat.dial_timeout = config.dial_timeout
        self.routing = DhtDiscovery(
            self.host,
            name=self.name,
            max_connections=config.max_connections,
            wait_for_change=lambda: trio.sleep(TABLE_REFRESH),
            serve_only=True,
        )

    def stats(self) -> dict[str, Any]:
        network = self.host.get_network()
        reservations = getattr(self.hop.resource_manager, "_reservations", {})
        return {
            "node": self.name,
            "peer_id": self.peer_id,
            "connected_peers": len(network.connections),
            "reservations": len(reservations),
            "circuits": len(getattr(self.hop, "_active_relays", {})),
            **self.routing.stats(),
        }

    def log_stats(self) -> None:
        log_event(logger, "stats", **self.stats())

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled. Cancellation becomes an orderly stop, as for a companion's node
        (:mod:`companion.node.orderly`): the host runs shielded and is closed first (peers see
        the disconnect at once), within ``close_timeout``."""
        finished = trio.Event()
        await run_orderly(
            partial(self._serve, finished),
            finished,
            close_timeout=self.config.close_timeout,
            name=self.name,
            logger=logger,
            task_status=task_status,
        )

    async def _serve(
        self,
        finished: trio.Event,
        stop: trio.Event,
        shielded: trio.CancelScope,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        host = self.host
        try:
            with shielded:
                async with (
                    host.run(listen_addrs=[Multiaddr(a) for a in self.config.listen]),
                    background_trio_service(self.hop),
                    trio.open_nursery() as nursery,
                ):
                    require_listening(host, self.config.listen)
                    require_alone(host, self.config.listen)
                    await nursery.start(self.routing.run)
                    for addr in self.config.peers:
                        nursery.start_soon(self._keep_peer, addr)
                    self.listen_addrs = [str(a) for a in host.get_addrs()]
                    addrs = self.listen_addrs
                    log_event(logger, "started", node=self.name, peer_id=self.peer_id, addrs=addrs)
                    task_status.started()
                    await stop.wait()
                    await self._close_host()
                    nursery.cancel_scope.cancel()
        finally:
            log_event(logger, "stopped", **self.stats())
            finished.set()

    async def _close_host(self) -> None:
        try:
            await self.host.close()
        except Exception as exc:
            log_event(logger, "host_close_failed", logging.WARNING, node=self.name, error=repr(exc))

    async def _keep_peer(self, addr: str) -> None:
        """Other relays or bootstrap nodes: kept connected, so the DHTs of both sides meet."""
        info = parse_peer_addr(addr)
        network = self.host.get_network()

        async def connect(peer: Any) -> None:
            await self.host.connect(peer)

        await redial_forever(
            info,
            connect,
            lambda peer: bool(network.connections.get(peer)),
            lambda: trio.sleep(TABLE_REFRESH),
            Backoff(self.config.redial_initial, self.config.redial_max),
            dial_timeout=self.config.dial_timeout,
        )
