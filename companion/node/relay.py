"""Reaching companions behind NAT: circuit relay v2, DCUtR hole punching and AutoNAT.

Everything here is py-libp2p 0.8.1's own (``libp2p.relay.circuit_v2``, ``libp2p.host.autonat``);
this module wires it into a node and works around what does not work as shipped:

- **AutoNAT's dial-back never dials.** The server answers a dial request with
  ``host.connect``, which returns at once when a connection to the peer exists, and the request
  itself arrived on one: every peer is told it is reachable. :class:`DialBackAutoNAT` dials the
  address on a fresh connection (and closes it again).
- **The swarm never dials ``/p2p-circuit`` addresses** (``Swarm.dial_peer`` drops them), so a
  relayed connection is opened with :meth:`CircuitV2Transport.dial` directly
  (:meth:`NatTraversal.dial_relayed`).
- **A reservation is not advertised**, and an ``addrs_factory`` cannot add it (see
  ``addresses.py``): :class:`~companion.node.addresses.AdvertisedAddrs` appends
  ``<relay>/p2p-circuit`` for every relay holding one, and the peers hear it by identify push
  and in the signed peer record the DHT carries.

A node with ``NodeConfig.relays`` keeps a connection to each relay, asks it (AutoNAT) whether it
is reachable from outside, and unless it is, holds a reservation there. Peers it cannot dial
directly it dials through a relay; DCUtR then tries to replace that relayed connection with a
direct one (TCP simultaneous open from the listen port), which works through NATs that keep the
port (most home routers) and fails through NATs that pick a new port per destination
("symmetric": carrier-grade NAT, some mobile networks); those connections stay relayed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import multiaddr
import trio
from libp2p.host.autonat import AutoNATService, AutoNATStatus
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID
from libp2p.identity.identify_push.identify_push import push_identify_to_peers
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from companion.log import log_event
from companion.node.addresses import AdvertisedAddrs
from companion.node.discovery import dial_error

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = [
    "DialBackAutoNAT",
    "LoggedDCUtR",
    "NatTraversal",
    "Reachability",
    "circuit_addr",
    "connection_kinds",
    "is_circuit",
    "is_direct_connection",
    "reachability_name",
]

logger = logging.getLogger("companion.node.relay")

Reachability = Literal["unknown", "public", "private"]

RESERVATION_RETRY: Final = 5.0
"""Seconds between reservation attempts on a connected relay that refused or failed one."""
AUTONAT_RECHECK: Final = 300.0
"""Seconds between reachability checks (addresses change: a new Wi-Fi, a new lease)."""
AUTONAT_TIMEOUT: Final = 10.0
"""Deadline of one AutoNAT request (the server dials us back within it)."""


def is_circuit(addr: object) -> bool:
    return "/p2p-circuit" in str(addr)


def circuit_addr(relay: str) -> multiaddr.Multiaddr:
    """``<relay addr>/p2p/<relay id>/p2p-circuit``: where a reservation on ``relay`` is reached."""
    return multiaddr.Multiaddr(f"{relay}/p2p-circuit")


def reachability_name(status: int) -> Reachability:
    if status == AutoNATStatus.PUBLIC:
        return "public"
    if status == AutoNATStatus.PRIVATE:
        return "private"
    return "unknown"


def is_direct_connection(conn: Any) -> bool:
    """A connection whose transport addresses do not go through a relay."""
    try:
        addrs = conn.get_transport_addresses()
    except Exception:
        return False
    return bool(addrs) and not any(is_circuit(a) for a in addrs)


class DialBackAutoNAT(AutoNATService):
    """py-libp2p's AutoNAT v1 with a dial-back that really dials.

    The shipped server calls ``host.connect``, which returns immediately because the requester is
    connected (its request came over that connection), so every requester hears "reachable".
    Here the dial-back opens a new connection to the address (the swarm's ``dial_addr`` does not
    reuse connections), which only succeeds if the address is reachable from here, and closes it
    afterwards. The address filter (only addresses on the requester's observed IP) is the
    shipped one."""

    dial_timeout: float = 5.0

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        network = self.host.get_network()
        for raw in addrs:
            try:
                addr = multiaddr.Multiaddr(raw)
            except Exception:
                continue
            if is_circuit(addr):
                continue
            conn = None
            try:
                with trio.fail_after(self.dial_timeout):
                    conn = await network.dial_addr(addr, peer_id)
                return bytes(raw)
            except Exception:
                continue
            finally:
                if conn is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(self.dial_timeout):
                        await _close_quietly(conn)
        return None


async def _close_quietly(conn: Any) -> None:
    try:
        await conn.close()
    except Exception as exc:
        log_event(logger, "dialback_close_failed", logging.DEBUG, error=repr(exc))


class LoggedDCUtR(DCUtRProtocol):
    """py-libp2p's DCUtR, with each hole punch (either side) logged as a ``hole_punch`` event,
    driving hole punches only while the node holds a relayed connection."""

    node_name: str = ""
    punched: int = 0
    failed: int = 0
    wait_for_change: Callable[[], Awaitable[None]] | None = None
    """The node's "a connection opened or closed" pulse (``None``: drive all the time)."""

    async def _auto_drive_loop(self) -> None:
        """py-libp2p's loop wakes every 2 s to look through every connection for a relayed one
        to upgrade: on an idle node that is most of DCUtR's cost, and almost no node holds a
        relayed connection. It runs here only while one is open (a relayed connection is a
        connection change, so it starts within the 2 s it would have taken anyway)."""
        wait = self.wait_for_change
        if wait is None:
            await super()._auto_drive_loop()
            return
        while True:
            while not self._holds_relayed():
                await wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(super()._auto_drive_loop)
                while self._holds_relayed():
                    await wait()
                nursery.cancel_scope.cancel()

    def _holds_relayed(self) -> bool:
        return "relayed" in {kind for kinds in connection_kinds(self.host).values() for kind in kinds}

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Any], as_responder: bool = False) -> bool:
        started = trio.current_time()
        ok = False
        try:
            ok = bool(await super()._perform_hole_punch(peer_id, addrs, as_responder))
            return ok
        finally:
            if ok:
                self.punched += 1
            else:
                self.failed += 1
            log_event(
                logger,
                "hole_punch",
                logging.INFO,
                node=self.node_name,
                peer=peer_id.to_base58(),
                ok=ok,
                seconds=round(trio.current_time() - started, 3),
                addrs=[str(a) for a in addrs][:8],
            )


def connection_kinds(host: Any) -> dict[str, list[str]]:
    """Peer id -> ``direct`` / ``relayed`` for each open connection (what the network holds now)."""
    out: dict[str, list[str]] = {}
    for peer, conns in list(host.get_network().connections.items()):
        listed = conns if isinstance(conns, list) else [conns]
        out[peer.to_base58()] = sorted("direct" if is_direct_connection(c) else "relayed" for c in listed)
    return out


class NatTraversal:
    """Relay reservations, relayed dials, DCUtR and AutoNAT for one node's host.

    ``run`` (started in the node's nursery) keeps a reservation on every relay in ``relays``
    while the node is not publicly reachable; ``dial_relayed`` opens a relayed connection."""

    def __init__(
        self,
        host: Any,
        relays: Sequence[str],
        advertised: AdvertisedAddrs,
        *,
        name: str,
        hole_punch: bool = True,
        dial_timeout: float = 5.0,
        is_connected: Callable[[ID], bool],
        wait_for_change: Callable[[], Awaitable[None]],
    ) -> None:
        from companion.node.discovery import parse_peer_addr

        self.host = host
        self.name = name
        self.relays: dict[ID, str] = {}
        for addr in relays:
            self.relays[parse_peer_addr(addr).peer_id] = addr
        self.advertised = advertised
        self.dial_timeout = dial_timeout
        self.reachability: Reachability = "unknown"
        self.relayed_dials = 0
        self._is_connected = is_connected
        self._wait_for_change = wait_for_change
        self.protocol = CircuitV2Protocol(host, allow_hop=False)
        self.transport = CircuitV2Transport(host, self.protocol, RelayConfig(roles=RelayRole.STOP))
        self.dcutr = LoggedDCUtR(host, dial_timeout=max(1, int(dial_timeout))) if hole_punch else None
        if self.dcutr is not None:
            self.dcutr.node_name = name
            self.dcutr.wait_for_change = wait_for_change
        self.autonat = DialBackAutoNAT(host, serve=True, confirmations=1)
        self.autonat.dial_timeout = dial_timeout

    # --- what others read ---------------------------------------------------------------------

    def reserved_relays(self) -> list[str]:
        return sorted(self.advertised.circuits)

    def stats(self) -> dict[str, Any]:
        return {
            "reachability": self.reachability,
            "reservations": self.reserved_relays(),
            "relayed_dials": self.relayed_dials,
            "hole_punches": self.dcutr.punched if self.dcutr is not None else 0,
            "hole_punches_failed": self.dcutr.failed if self.dcutr is not None else 0,
            "connections": connection_kinds(self.host),
        }

    # --- running ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with background_trio_service(self.protocol):
            if self.dcutr is None:
                await self._serve(task_status)
                return
            async with background_trio_service(self.dcutr):
                await self._serve(task_status)

    async def _serve(self, task_status: TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            for relay_id in self.relays:
                nursery.start_soon(self._keep_reservation, relay_id, nursery)
            task_status.started()
            await trio.sleep_forever()

    async def _keep_reservation(self, relay_id: ID, nursery: trio.Nursery) -> None:
        """Whenever connected to the relay: check reachability, then reserve unless public.

        A relay forgets a reservation when the connection drops, so every new connection gets a
        new one; py-libp2p's transport refreshes it before it expires."""
        key = relay_id.to_base58()
        checked_at: float | None = None
        while True:
            if not self._is_connected(relay_id):
                if self.advertised.circuits.pop(key, None) is not None:
                    log_event(logger, "relay_reservation_lost", node=self.name, relay=key)
                    await self._announce_addrs()
                checked_at = None
                await self._wait_for_change()
                continue
            now = trio.current_time()
            if checked_at is None or now - checked_at > AUTONAT_RECHECK:
                checked_at = now
                await self._check_reachability(relay_id)
            if self.reachability != "public" and key not in self.advertised.circuits:
                if await self._reserve(relay_id, nursery):
                    self.advertised.circuits[key] = circuit_addr(self.relays[relay_id])
                    log_event(logger, "relay_reserved", node=self.name, relay=key)
                    await self._announce_addrs()
                else:
                    with trio.move_on_after(RESERVATION_RETRY):
                        await self._wait_for_change()
                    continue
            with trio.move_on_after(AUTONAT_RECHECK):
                await self._wait_for_change()

    async def _reserve(self, relay_id: ID, nursery: trio.Nursery) -> bool:
        try:
            with trio.fail_after(self.dial_timeout * 2):
                stream = await self.host.new_stream(relay_id, [HOP_PROTOCOL_ID])
                try:
                    ok: bool = await self.transport.reserve(stream, relay_id, nursery)
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                        await stream.close()
            return ok
        except Exception as exc:
            log_event(
                logger,
                "relay_reservation_failed",
                logging.WARNING,
                node=self.name,
                relay=relay_id.to_base58(),
                error=f"{type(exc).__name__}: {exc}"[:200],
            )
            return False

    async def _check_reachability(self, relay_id: ID) -> None:
        """Ask the relay (and every other connected AutoNAT server) to dial us back."""
        servers = [relay_id]
        store = self.host.get_peerstore()
        for peer in list(self.host.get_network().connections):
            if peer == relay_id:
                continue
            try:
                if AUTONAT_PROTOCOL_ID in store.get_protocols(peer):
                    servers.append(peer)
            except Exception:
                continue
        before = self.reachability
        try:
            with trio.fail_after(AUTONAT_TIMEOUT):
                status = await self.autonat.check_reachability(servers[:4])
        except trio.TooSlowError:
            status = self.autonat.get_status()
        self.reachability = reachability_name(status)
        if self.reachability != before:
            log_event(
                logger,
                "reachability_changed",
                node=self.name,
                reachability=self.reachability,
                servers=len(servers[:4]),
            )

    async def _announce_addrs(self) -> None:
        """Tell connected peers our addresses changed (identify push); best effort."""
        try:
            with trio.move_on_after(self.dial_timeout):
                await push_identify_to_peers(self.host)
        except Exception as exc:
            log_event(logger, "identify_push_failed", logging.DEBUG, node=self.name, error=repr(exc))

    # --- dialling -----------------------------------------------------------------------------

    def circuit_addrs_of(self, peer: ID) -> list[multiaddr.Multiaddr]:
        """The peer's advertised circuit addresses, else one through each relay of ours."""
        try:
            known = [a for a in self.host.get_peerstore().addrs(peer) if is_circuit(a)]
        except Exception:
            known = []
        own = [multiaddr.Multiaddr(f"{addr}/p2p-circuit") for addr in self.relays.values()]
        out: list[multiaddr.Multiaddr] = []
        seen: set[str] = set()
        for addr in [*known, *own]:
            text = str(addr)
            if not text.endswith(f"/p2p/{peer.to_base58()}"):
                addr = multiaddr.Multiaddr(f"{text}/p2p/{peer.to_base58()}")
                text = str(addr)
            if text not in seen:
                seen.add(text)
                out.append(addr)
        return out

    async def dial_relayed(self, peer: ID) -> bool:
        """Open a relayed connection to ``peer`` through the first relay that gets us there."""
        for addr in self.circuit_addrs_of(peer):
            try:
                with trio.fail_after(self.dial_timeout * 2):
                    await self.transport.dial(addr)
                self.relayed_dials += 1
                log_event(logger, "relayed_dial", node=self.name, peer=peer.to_base58(), via=str(addr))
                return True
            except Exception as exc:
                log_event(
                    logger,
                    "relayed_dial_failed",
                    logging.INFO,
                    node=self.name,
                    peer=peer.to_base58(),
                    via=str(addr),
                    error=dial_error(exc),
                )
        return False
