"""A companion's libp2p node: the trio shell around membership, the edge guard and gossipsub.

One :class:`CompanionNode` per companion (or per bridge, with ``metadata=None``). It publishes
envelopes (it is a :class:`~companion.memory.Publisher`), hands every payload that passed the
edge to an :class:`InboundHandler`, and keeps :attr:`CompanionNode.directory` current.

Life cycle: ``await nursery.start(node.run, handler)`` returns once the node listens (its
addresses are in :attr:`listen_addrs`); cancelling the scope closes the host, so peers see the
disconnect at once.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio
from libp2p.abc import INetConn, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.discovery.events.peerDiscovery import peerDiscovery
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from companion.log import log_event, log_exception
from companion.memory import Inbound, encode_for_topic
from companion.node.addresses import AdvertisedAddrs
from companion.node.announcements import PRESENCE_TOPIC
from companion.node.config import NodeConfig, make_gossipsub, make_host
from companion.node.discovery import Backoff, MdnsBridge, dial_error, parse_peer_addr, redial_forever
from companion.node.drops import Drop, DropCounters
from companion.node.guard import EdgeGuard
from companion.node.health import ConnectionHealth, HealthSettings
from companion.node.identity import load_or_create_key_pair
from companion.node.listening import require_alone, require_listening
from companion.node.membership import Membership, MembershipEvent
from companion.node.metadata import METADATA_PROTOCOL, RequestGate, fetch_metadata, serve_metadata
from companion.node.msgid import js_message_id
from companion.node.notifee import ConnectionNotifee
from companion.node.orderly import run_orderly
from companion.node.presence import LEAVE_PROTOCOL, PresenceService, PresenceSettings
from companion.node.pubsub import CountingGossipSub, GuardedPubsub
from companion.node.relay import NatTraversal
from companion.node.replay import ReplayGuard
from companion.node.routing import DhtDiscovery
from companion.node.topology import TRIM_PROTOCOL, Topology, dial_target, disable_libp2p_pruner
from companion.node.trust import TrustStore
from companion.node.yamux import batch_window_updates
from companion.protocol import MESSAGES, NODE_TOPICS, TOPICS, Envelope, Message, Metadata, Query, State

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["CompanionNode", "InboundHandler", "MembershipListener", "NodeNotRunning"]

logger = logging.getLogger("companion.node")

LEFT_RECENTLY: Final = 30.0
"""Seconds a companion that announced its stop counts as stopping: a failed metadata request to
it in that time is routine (24 warnings when 30 companions stopped together on two cores, the
stops taking longer than ``GONE_WAIT``)."""
LEFT_MEMORY: Final = 1024
"""Companions that announced their stop, remembered at most (the oldest forgotten first)."""
GONE_WAIT: Final = 1.0
"""How long a failed metadata request waits for the peer's connection to close: a peer that
stops or is trimmed while we ask makes the request fail moments before its close arrives, and
that is routine (INFO); a peer still connected after it has a problem (WARNING)."""
SENT_IDS_KEPT: Final = 64
"""Own message ids a node remembers (:attr:`CompanionNode.messages_sent`): a stop publishes a
reply or two per companion."""

MembershipListener = Callable[[MembershipEvent], None]


class InboundHandler(Protocol):
    """Receives every payload that passed the edge, one at a time, in arrival order.

    ``handle`` should return promptly (start long work in its own nursery): while it runs, the
    node buffers up to ``NodeConfig.inbound_buffer`` payloads and then drops (counted)."""

    async def handle(self, inbound: Inbound) -> None: ...


class NodeNotRunning(RuntimeError):
    """``publish`` was called before ``run`` started the node or after it stopped."""


class _ConnectionEvents(ConnectionNotifee):
    """py-libp2p awaits notifees inline while connecting: only hand the event over."""

    def __init__(self, send: trio.MemorySendChannel[tuple[str, INetConn]], *, batch_yamux: bool) -> None:
        self._send = send
        self._batch_yamux = batch_yamux

    def _offer(self, kind: str, conn: INetConn) -> None:
        try:
            self._send.send_nowait((kind, conn))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log_event(logger, "connection_event_dropped", logging.WARNING, kind=kind)

    async def connected(self, network: Any, conn: INetConn) -> None:
        if self._batch_yamux:  # before anything else can run: no stream escapes (yamux.py)
            batch_window_updates(conn.muxed_conn)
        self._offer("connected", conn)

    async def disconnected(self, network: Any, conn: INetConn) -> None:
        self._offer("disconnected", conn)


async def _stop_auto_connector(host: Any) -> None:
    """py-libp2p's connection manager dials known peers when a node has fewer connections than
    its target, on its own timer and when the routing asks (routing.py): a node that stops wants
    fewer, and dials nobody (:meth:`CompanionNode._dial`)."""
    connector = getattr(host.get_network(), "auto_connector", None)
    if connector is not None:
        await connector.stop()


def _known_addrs(host: Any, peer: ID) -> list[Multiaddr]:
    """The peerstore's addresses of ``peer`` (it raises for a peer it never heard of)."""
    try:
        return list(host.get_peerstore().addrs(peer))
    except Exception:
        return []


class CompanionNode:
    """One libp2p host for one companion (or a bridge when ``metadata`` is ``None``)."""

    def __init__(
        self,
        metadata: Metadata | None,
        config: NodeConfig | None = None,
        *,
        key_pair: KeyPair | None = None,
        trust: TrustStore | None = None,
        present: bool = True,
    ) -> None:
        """``trust``: the pins and allowed answerers (shared by the nodes of one process and
        kept in the data directory); in memory for this node alone when not given.

        ``present=False``: the node runs, dials and relays, but does not make its companion
        present to others (no announcement; metadata requests wait, up to
        :data:`~.metadata.HELD_METADATA_WAIT`) until
        :meth:`become_present`: what ``companion run`` does while the engine is prepared, so
        nobody waits for a leader that cannot lead yet."""
        self.config = config or NodeConfig()
        self.metadata = metadata
        if key_pair is None:
            key_pair = (
                load_or_create_key_pair(self.config.key_path)
                if self.config.key_path is not None
                else create_new_key_pair()
            )
        self._key_pair = key_pair
        self._id = ID.from_pubkey(key_pair.public_key)
        self.peer_id = self._id.to_base58()
        self.name = self.config.name or (metadata.id if metadata else "bridge")
        self.membership = Membership(self.peer_id, metadata, trust)
        self.drops = DropCounters(trio.current_time, node=self.name)
        self._replay = ReplayGuard(
            self.config.replay_capacity, window=self.config.replay_window, path=self.config.replay_path
        )
        self.guard = EdgeGuard(
            self.membership,
            self.drops,
            replay=self._replay,
            max_bytes=self.config.max_payload_bytes,
            name=self.name,
        )
        self.presence = PresenceService(
            self.membership,
            metadata,
            PresenceSettings(
                self.config.presence_interval,
                self.config.presence_ttl,
                self.config.presence_min_gap,
                self.config.max_payload_bytes,
            ),
            self.drops,
            self._membership_changed,
            name=self.name,
        )
        self.topology: Topology | None = None
        self.health = ConnectionHealth(
            HealthSettings(
                self.config.health_check_interval,
                self.config.health_timeout,
                self.config.health_failures_allowed,
            ),
            self._close_connection,
        )
        self.disconnects: Counter[str] = Counter()
        """Closed connections by reason: ``unresponsive`` (health probes unanswered), ``stopping``
        (this node stopped), ``trimmed`` (the connection bound, this node's or the peer's, who
        said so first), ``closed`` (the peer or the network closed it otherwise)."""
        self.listen_addrs: list[str] = []
        self.published = 0
        self.delivered = 0
        self.published_by_topic: Counter[str] = Counter()
        """This node's own publishes by topic (``published`` is their sum)."""
        self.messages_sent: deque[str] = deque(maxlen=SENT_IDS_KEPT)
        """The ids of this node's latest own messages (``message.send``), oldest first: what a
        stop waits to see reach this process's clients (:mod:`companion.app.stopping`)."""
        self.delivered_by_topic: Counter[str] = Counter()
        """Payloads handed to the handler by topic (``delivered`` is their sum): the metrics'
        messages in."""
        self._listeners: list[MembershipListener] = []
        self._stash: OrderedDict[tuple[int, str], tuple[rpc_pb2.Message, Inbound]] = OrderedDict()
        """What the edge admitted, until gossipsub delivers it. py-libp2p hands the validator and
        the delivery the same message object, so the entry is keyed by that object's identity
        (it holds the message: the identity is not reused meanwhile) and the message id is
        computed once, for the guard's replay check."""
        self._closing: dict[INetConn, str] = {}
        self._left: OrderedDict[str, float] = OrderedDict()
        """Peers whose companion announced its stop, and when (:data:`LEFT_RECENTLY`)."""
        self._inbound_send: trio.MemorySendChannel[Inbound] | None = None
        self._pubsub: GuardedPubsub | None = None
        self._router: CountingGossipSub | None = None
        self._host: Any = None
        self.nat: NatTraversal | None = None
        self.routing: DhtDiscovery | None = None
        self._gate = RequestGate()
        self._changed = trio.Event()
        self._stopped = False
        self._stop_requested = trio.Event()
        self._finished = trio.Event()
        if not present:
            self.presence.hold()

    def become_present(self) -> None:
        """The companion is ready: announce it, and answer the metadata requests waiting."""
        self.presence.release()

    # --- what others read -------------------------------------------------------------------

    @property
    def directory(self) -> Mapping[str, Metadata]:
        """Companion id -> metadata of the companions present now (this one included): directly
        connected, or announced through any path (presence)."""
        return self.membership.directory

    @property
    def connected_peers(self) -> list[str]:
        if self._host is None:
            return []
        return [p.to_base58() for p in self._host.get_network().connections]

    def add_membership_listener(self, listener: MembershipListener) -> None:
        """Call ``listener`` (synchronously, in the node's task) on every join, leave and update."""
        self._listeners.append(listener)

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring and tests: drops by reason, payloads accepted and delivered."""
        return {
            "node": self.name,
            "peer_id": self.peer_id,
            "accepted": self.guard.accepted,
            "delivered": self.delivered,
            "published": self.published,
            "dropped": self.drops.total,
            "drops": self.drops.snapshot(),
            "connected_peers": len(self.connected_peers),
            "companions": sorted(self.directory),
            "mesh": self._mesh_sizes(),
            "control": dict(self._router.control) if self._router is not None else {},
            "sent": dict(self._pubsub.sent) if self._pubsub is not None else {},
            "disconnects": dict(self.disconnects),
            "health": self.health.stats(),
            **(self.nat.stats() if self.nat is not None else {}),
            **(self.routing.stats() if self.routing is not None else {}),
            **self.presence.stats(),
            **(self.topology.stats() if self.topology is not None else {}),
        }

    @property
    def queue_depths(self) -> dict[str, int]:
        """What waits now: ``inbound`` payloads for the handler (past
        ``NodeConfig.inbound_buffer`` they are dropped) and ``outbound`` RPCs in the fullest
        per-peer send queue (our publishes wait while it is half full)."""
        inbound = self._inbound_send.statistics().current_buffer_used if self._inbound_send else 0
        outbound = self._pubsub.fullest_queue() if self._pubsub is not None else 0
        return {"inbound": inbound, "outbound": outbound}

    def _mesh_sizes(self) -> dict[str, int]:
        """Gossipsub mesh peers per topic (a topic with 0 while peers are connected forwards
        to nobody)."""
        if self._router is None:
            return {}
        mesh = self._router.mesh
        return {topic: len(mesh.get(topic, ())) for topic in (*TOPICS, PRESENCE_TOPIC)}

    def log_stats(self) -> None:
        log_event(logger, "stats", **self.stats())

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds after a connection or membership change; ``False``
        if ``timeout`` passed first."""
        with trio.move_on_after(timeout):
            while not predicate():
                await self._changed.wait()
            return True
        return False

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        """Sign and publish one envelope (or the ``states`` array). Fire and forget."""
        if isinstance(envelope, Query):
            self.guard.asking(envelope)  # before anyone can answer: only allowed peers may
        await self.publish_raw(topic, encode_for_topic(topic, envelope))
        if topic == MESSAGES and isinstance(envelope, Message):
            # not a preview of it (PREVIEWS, same id, before it is voiced): a stop waits for the
            # ids recorded after it began, and a preview's id recorded before would hide the reply
            self.messages_sent.append(envelope.params.id)

    async def publish_raw(self, topic: str, data: bytes) -> None:
        """Publish bytes as they are (the bridge forwards client payloads unchanged). They pass
        this node's own edge first, like any payload; refused bytes are counted, not sent."""
        if self._pubsub is None or self._stopped:
            raise NodeNotRunning(f"node {self.name} is not running")
        if topic not in NODE_TOPICS:
            raise ValueError(f"unknown topic {topic!r}")
        if len(data) > self.config.max_payload_bytes:
            raise ValueError(f"payload of {len(data)} bytes exceeds {self.config.max_payload_bytes}")
        # py-libp2p never waits: a burst beyond a peer's send queue would be dropped, so our own
        # publishes wait (bounded) while any queue is half full
        await self._pubsub.wait_for_room(self.config.outbound_queue_size // 2, self.config.publish_wait)
        await self._pubsub.publish(topic, data)
        self.published += 1
        self.published_by_topic[topic] += 1

    # --- running ----------------------------------------------------------------------------

    async def run(
        self, handler: InboundHandler, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled or :meth:`stop`; ``task_status.started()`` once listening.

        Either way the stop is orderly (:mod:`companion.node.orderly`): the host runs in a
        shielded scope and is closed first, within ``close_timeout``.
        """
        await run_orderly(
            partial(self._serve, handler),
            self._finished,
            close_timeout=self.config.close_timeout,
            name=self.name,
            logger=logger,
            stop_requested=self._stop_requested,
            task_status=task_status,
        )

    async def stop(self) -> None:
        """Stop as cancelling :meth:`run` does (peers told, host closed, what passed the edge
        before handed to the handler), without cancelling anything else; returns once the node
        stopped, or after its ``close_timeout``. A node that never ran returns at once."""
        self._stop_requested.set()
        if self._host is None:
            return
        with trio.move_on_after(self.config.close_timeout):
            await self._finished.wait()

    async def _serve(
        self,
        handler: InboundHandler,
        stop: trio.Event,
        shielded: trio.CancelScope,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        host = make_host(self.config, self._key_pair)
        advertised = AdvertisedAddrs()
        advertised.install(host)  # wildcards spelled out, circuit addresses (addresses.py)
        router = self._router = make_gossipsub(self.config)
        inbound_send, inbound_recv = trio.open_memory_channel[Inbound](self.config.inbound_buffer)
        self._inbound_send = inbound_send
        dispatched = trio.Event()
        pubsub = GuardedPubsub(
            host,
            router,
            drops=self.drops,
            deliver=self._deliver,
            outbound_queue_size=self.config.outbound_queue_size,
            unsent=self.presence.unsent,
            strict_signing=True,
            msg_id_constructor=js_message_id,
            validation_cache_ttl=0,
            max_inbound_rpc_size=self.config.max_payload_bytes * 4 + 65536,
        )
        conn_send, conn_recv = trio.open_memory_channel[tuple[str, INetConn]](1024)
        mdns_send, mdns_recv = trio.open_memory_channel[PeerInfo](64)
        host.get_network().register_notifee(
            _ConnectionEvents(conn_send, batch_yamux=self.config.yamux_batched_window)
        )
        if self.metadata is not None:
            host.set_stream_handler(METADATA_PROTOCOL, self._serve_metadata)
        if self.config.presence:
            host.set_stream_handler(LEAVE_PROTOCOL, self.presence.serve_leave)
        mdns_bridge = MdnsBridge(self._id, mdns_send, trio.lowlevel.current_trio_token())
        if self.config.mdns:
            peerDiscovery.register_peer_discovered_handler(mdns_bridge)
        self._host = host
        try:
            with shielded:
                async with (
                    host.run(listen_addrs=[Multiaddr(a) for a in self.config.listen]),
                    background_trio_service(pubsub),
                    background_trio_service(router),
                ):
                    require_listening(host, self.config.listen)
                    require_alone(host, self.config.listen)
                    await pubsub.wait_until_ready()
                    for topic in NODE_TOPICS:
                        pubsub.set_topic_validator(topic, self._validator(topic), False)
                    for topic in NODE_TOPICS:  # announces the topics; messages come through _deliver
                        await pubsub.subscribe(topic)
                    self._pubsub = pubsub
                    async with trio.open_nursery() as nursery:
                        if self.config.presence:

                            def addrs() -> list[str]:
                                return [str(a) for a in host.get_addrs()]

                            await nursery.start(self.presence.run, pubsub, addrs)
                        await nursery.start(self.health.run)
                        nursery.start_soon(self._connection_events, conn_recv, nursery)
                        nursery.start_soon(self._dispatch, handler, inbound_recv, dispatched)
                        nursery.start_soon(self._dial_discovered, mdns_recv)
                        for addr in dict.fromkeys((*self.config.peers, *self.config.relays)):
                            nursery.start_soon(self._keep_bootstrap, addr)
                        await self._start_beyond_lan(host, advertised, nursery)
                        await self._start_topology(host, router, nursery)
                        if self.config.stats_interval:
                            nursery.start_soon(self._stats_every, self.config.stats_interval)
                        self.listen_addrs = [str(a) for a in host.get_addrs()]
                        log_event(
                            logger,
                            "started",
                            node=self.name,
                            peer_id=self.peer_id,
                            companion_id=self.metadata.id if self.metadata else None,
                            addrs=self.listen_addrs,
                        )
                        task_status.started()
                        await stop.wait()
                        self._stopped = True  # from here on this node dials nobody (_dial)
                        await _stop_auto_connector(host)
                        await self.presence.leave()
                        await self._close_host(host)
                        # what passed the edge before the host closed reaches the handler still
                        # (a companion records every message that arrived), within a deadline
                        inbound_send.close()
                        with trio.move_on_after(self.config.close_timeout):
                            await dispatched.wait()
                        nursery.cancel_scope.cancel()
        finally:
            self._stopped = True
            self._replay.close()
            if self.config.mdns:
                peerDiscovery.unregister_peer_discovered_handler(mdns_bridge)
            log_event(logger, "stopped", **self.stats())
            self._finished.set()

    async def _close_host(self, host: Any) -> None:
        """Close connections while the host's services still run, so peers see the disconnect."""
        for conns in list(host.get_network().connections.values()):
            for conn in conns:
                self._closing.setdefault(conn, "stopping")
        try:
            await host.close()
        except Exception as exc:
            log_event(logger, "host_close_failed", logging.WARNING, node=self.name, error=repr(exc))

    # --- the edge -----------------------------------------------------------------------------

    def _validator(self, topic: str) -> Callable[[ID, Any], bool]:
        def validate(forwarder: ID, msg: Any) -> bool:
            try:
                if len(msg.topicIDs) != 1:
                    self.drops.record(
                        Drop("multi_topic", f"{len(msg.topicIDs)} topics in one message"),
                        peer=str(forwarder),
                        topic=topic,
                    )
                    return False
                msg_id = js_message_id(msg)
                signer = ID(msg.from_id).to_base58()
                inbound = self.guard.admit(topic, msg.data, signer, msg_id)
                if inbound is None:
                    return False
                self._stash[(id(msg), topic)] = (msg, inbound)
                while len(self._stash) > 4096:
                    self._stash.popitem(last=False)
                return True
            except Exception as exc:  # a raising validator stops py-libp2p's pubsub
                self.drops.record(Drop("internal_error", repr(exc)), peer=str(forwarder), topic=topic)
                return False

        return validate

    def _deliver(self, topic: str, msg: rpc_pb2.Message) -> None:
        """A message gossipsub validated and delivers to us (synchronously, from py-libp2p)."""
        admitted = self._stash.pop((id(msg), topic), None)
        if admitted is None or self._inbound_send is None:
            return  # delivered without passing our validator: nothing we vouch for
        inbound = admitted[1]
        try:
            self._inbound_send.send_nowait(inbound)
        except trio.WouldBlock:
            self.drops.record(
                Drop("inbound_overflow", "handler too slow"), peer=inbound.sender_peer, topic=topic
            )
        except (trio.ClosedResourceError, trio.BrokenResourceError):  # the node is stopping
            drop = Drop("stopping", "arrived after the host closed")
            self.drops.record(drop, peer=inbound.sender_peer, topic=topic)

    async def _dispatch(
        self, handler: InboundHandler, inbound: trio.MemoryReceiveChannel[Inbound], done: trio.Event
    ) -> None:
        """Hand each payload to ``handler`` in order; set ``done`` once the channel is closed and
        empty (the node stopping waits for it)."""
        async for item in inbound:
            self.delivered += 1
            self.delivered_by_topic[item.topic] += 1
            try:
                await handler.handle(item)
            except Exception as exc:
                log_exception(
                    logger, "handler_failed", exc, node=self.name, topic=item.topic, peer=item.sender_peer
                )
        done.set()

    # --- membership ---------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _membership_changed(self, events: list[MembershipEvent]) -> None:
        """Presence changed the directory (announcements, expiry)."""
        if events:
            self._emit(events)
            self._notify()

    def _emit(self, events: list[MembershipEvent]) -> None:
        for event in events:
            if event.kind == "left" and event.reason == "leaving":
                self._left[event.peer_id] = trio.current_time()
                while len(self._left) > LEFT_MEMORY:
                    self._left.popitem(last=False)
            log_event(
                logger,
                f"companion_{event.kind}",
                node=self.name,
                companion_id=event.companion_id,
                peer=event.peer_id,
                reason=event.reason,
            )
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception as exc:
                    log_exception(logger, "listener_failed", exc, node=self.name, kind=event.kind)

    def _is_connected(self, peer: ID) -> bool:
        return bool(self._host is not None and self._host.get_network().connections.get(peer))

    async def _connection_events(
        self, events: trio.MemoryReceiveChannel[tuple[str, INetConn]], nursery: trio.Nursery
    ) -> None:
        async for kind, conn in events:
            peer: ID = conn.muxed_conn.peer_id
            name = peer.to_base58()
            if kind == "connected":
                self.health.watch(conn)
            else:
                reason = self._closing.pop(conn, "closed")
                if reason == "closed" and self.topology is not None and self.topology.trimming(name):
                    reason = "trimmed"  # the connection bound at work, ours or the peer's
                self.disconnects[reason] += 1
            if kind == "connected" and not self.membership.is_connected(name):
                self.membership.peer_connected(name)
                log_event(logger, "peer_connected", node=self.name, peer=name)
                nursery.start_soon(self._learn_metadata, peer)
                self._peer_up(peer, nursery)
            elif kind == "disconnected" and not self._is_connected(peer):
                if self.membership.is_connected(name):
                    log_event(logger, "peer_disconnected", node=self.name, peer=name, reason=reason)
                self._gate.forget(peer)
                self._emit(self._peer_down(name))
            self._notify()

    def _peer_up(self, peer: ID, nursery: trio.Nursery) -> None:
        """Presence and the connection bound hear of a new peer."""
        if self.topology is not None:
            self.topology.connected(peer.to_base58(), trio.current_time())
        if self.config.presence:
            self.presence.connection_back(peer.to_base58())
            nursery.start_soon(self.presence.peer_connected, peer)

    def _peer_down(self, name: str) -> list[MembershipEvent]:
        """The last connection to a peer closed: its binding ends, and unless it was closed on
        purpose (a trim by either side, topology.py, or the peer's orderly stop, presence.py)
        its announcement must be renewed soon, and this node announces itself (presence.py)."""
        on_purpose = self.presence.closed_leaving(name)
        if self.topology is not None:
            on_purpose = self.topology.closed_on_purpose(name) or on_purpose
            self.topology.disconnected(name)
        events = self.membership.peer_disconnected(name, now=trio.current_time(), on_purpose=on_purpose)
        if not on_purpose:
            self.presence.connection_lost(name)
        return events

    async def _close_connection(self, conn: INetConn, reason: str) -> None:
        """Close one connection on our own initiative, remembering why for its disconnect event."""
        self._closing[conn] = reason
        log_event(
            logger,
            "connection_closing",
            logging.WARNING,
            node=self.name,
            peer=str(conn.muxed_conn.peer_id),
            reason=reason,
        )
        with trio.move_on_after(self.config.close_timeout):
            try:
                await conn.close()
            except Exception as exc:
                log_event(logger, "connection_close_failed", logging.WARNING, node=self.name, error=repr(exc))

    async def _learn_metadata(self, peer: ID) -> None:
        outcome = await fetch_metadata(self._host, peer, self._gate, timeout=self.config.metadata_timeout)
        name = peer.to_base58()
        if self.presence.told_leaving(name):
            # It is stopping: it answers nothing now, and an answer it gave before its notice
            # came would put a companion that left back into the directory until its close.
            log_event(logger, "peer_metadata_unavailable", node=self.name, peer=name, status="leaving")
            return
        if outcome.metadata is None:
            routine = outcome.status == "unsupported"  # a bridge, a relay: no metadata to give
            # A companion whose signed announcement we hold is known all the same: on a loaded
            # machine its answer can take longer than the deadline (17 warnings when 30
            # companions started together, every one of them already in the directory).
            announced = self.membership.presence.of_peer(name) is not None
            left = trio.current_time() - self._left.get(name, float("-inf")) < LEFT_RECENTLY
            if not routine and outcome.status in ("error", "timeout", "empty"):
                # a peer that stops (or is trimmed) while we ask: the request fails, and the
                # connection closes within moments (on a loaded machine a stopping companion
                # can take seconds; it announced its stop); only a peer that stays has a problem
                routine = (
                    announced or left or await self.wait_for(lambda: not self._is_connected(peer), GONE_WAIT)
                )
            log_event(
                logger,
                "peer_metadata_unavailable",
                logging.INFO if routine else logging.WARNING,
                node=self.name,
                peer=name,
                status=outcome.status,
                detail=outcome.detail,
                peer_gone=not self._is_connected(peer),
                announced=announced,
                left=left,
            )
            return
        result = self.membership.bind(name, outcome.metadata)
        if isinstance(result, list):
            self._emit(result)
        else:
            log_event(
                logger,
                "metadata_refused",
                logging.WARNING,
                node=self.name,
                peer=name,
                companion_id=result.companion_id,
                reason=result.reason,
                owner=result.owner,
            )
        self._notify()

    async def _serve_metadata(self, stream: INetStream) -> None:
        assert self.metadata is not None
        await serve_metadata(
            stream,
            self.metadata,
            self._gate,
            wait=self.config.metadata_timeout,
            present=self.presence.wait_present,
        )

    # --- discovery ----------------------------------------------------------------------------

    async def _start_beyond_lan(self, host: Any, advertised: AdvertisedAddrs, nursery: trio.Nursery) -> None:
        """Relays, hole punching and DHT discovery (relay.py, routing.py)."""
        self.nat = NatTraversal(
            host,
            self.config.relays,
            advertised,
            name=self.name,
            hole_punch=self.config.hole_punch,
            dial_timeout=self.config.dial_timeout,
            is_connected=self._is_connected,
            wait_for_change=self._changed_wait,
        )
        await nursery.start(self.nat.run)
        if self.config.dht:
            self.routing = DhtDiscovery(
                host,
                name=self.name,
                max_connections=dial_target(self.config.max_connections),
                wait_for_change=self._changed_wait,
                dial_relayed=self._dial_relayed,
            )
            await nursery.start(self.routing.run)

    async def _keep_bootstrap(self, addr: str) -> None:
        """Relays are kept connected; a bootstrap peer is dialled at start and redialled when
        lost while this node has fewer connections than it dials itself (the way libp2p nodes
        use bootstrap peers): a hub that trims its excess connections is not redialled by every
        node it trimmed."""
        info = parse_peer_addr(addr)
        tags = getattr(self._host.get_network(), "tag_store", None)
        if tags is not None:  # never pruned by py-libp2p's connection manager nor trimmed by us
            tags.protect(info.peer_id, "bootstrap")
        backoff = Backoff(self.config.redial_initial, self.config.redial_max)
        relay = addr in self.config.relays
        target = dial_target(self.config.max_connections)

        def needed_elsewhere(peer: ID) -> bool:  # (or not at all: a node that stops dials nobody)
            enough = not relay and len(self.connected_peers) >= target
            return self._stopped or self._is_connected(peer) or enough

        await redial_forever(
            info,
            self._dial,
            needed_elsewhere,
            self._changed_wait,
            backoff,
            dial_timeout=self.config.dial_timeout,
        )

    async def connect(self, addr: str) -> None:
        """Dial one peer once (``.../p2p/PEER_ID``) within ``dial_timeout``; raises on failure.
        Use ``NodeConfig.peers`` for peers that should be redialled when lost."""
        if self._host is None or self._stopped:
            raise NodeNotRunning(f"node {self.name} is not running")
        with trio.fail_after(self.config.dial_timeout):
            await self._dial(parse_peer_addr(addr))

    async def _dial(self, info: PeerInfo) -> None:
        """Dial, forgetting py-libp2p's memory of earlier failures (it refuses to redial a peer
        that failed recently, which would defeat our own backoff). Never once the node stops:
        its host closes, and it may wait for its handler after that; a bootstrap peer lost then
        was dialled again, py-libp2p's closed swarm dropped the connection on its side without
        closing it, and the peer kept it, and this companion in its directory."""
        if self._stopped:
            raise NodeNotRunning(f"node {self.name} is stopping: it dials nobody")
        network = self._host.get_network()
        unblock = getattr(network, "unblock_peer", None)
        if unblock is not None:
            unblock(info.peer_id)
        await self._host.connect(info)

    async def _dial_relayed(self, peer: ID) -> bool:
        """A peer only a relay reaches, dialled through one (never once the node stops, as
        :meth:`_dial`)."""
        return not self._stopped and self.nat is not None and await self.nat.dial_relayed(peer)

    async def _changed_wait(self) -> None:
        await self._changed.wait()

    async def _dial_discovered(self, found: trio.MemoryReceiveChannel[PeerInfo]) -> None:
        async for info in found:
            if self._is_connected(info.peer_id):
                continue
            if len(self.connected_peers) >= dial_target(self.config.max_connections):
                continue  # known now; py-libp2p's connection manager dials it if one drops
            try:
                with trio.fail_after(self.config.dial_timeout):
                    await self._dial(info)
                log_event(logger, "mdns_peer_dialled", node=self.name, peer=str(info.peer_id))
            except Exception as exc:
                log_event(
                    logger,
                    "mdns_dial_failed",
                    logging.INFO,
                    node=self.name,
                    peer=str(info.peer_id),
                    error=dial_error(exc),
                )

    # --- the connection bound -------------------------------------------------------------------

    async def _start_topology(self, host: Any, router: Any, nursery: trio.Nursery) -> None:
        """Trim connections beyond ``max_connections`` and keep the ring (topology.py)."""
        tags = getattr(host.get_network(), "tag_store", None)
        trust = self.membership.trust

        def is_protected(peer: ID) -> bool:
            name = peer.to_base58()
            allowed = name in trust.peers("approver") or name in trust.peers("answerer")
            return allowed or bool(tags is not None and tags.is_protected(peer))

        def meshes() -> list[set[ID]]:
            mesh = getattr(router, "mesh", {})
            return [mesh.get(topic, set()) for topic in (*TOPICS, PRESENCE_TOPIC)]

        def direct_only() -> frozenset[str]:
            return self.membership.bound_peers() - self.membership.announcing_peers()

        announcing = self.metadata is not None and self.config.presence
        self.topology = Topology(
            host,
            name=self.name,
            bound=self.config.max_connections,
            grace=self.config.trim_grace,
            self_peer=self.peer_id,
            is_protected=is_protected,
            ring_members=self.membership.announcing_peers if announcing else None,
            direct_only=direct_only,
            meshes=meshes,
            announce=self.presence.announce_now,
            dial=self._dial_known,
            wait_for_change=self._changed_wait,
        )
        host.set_stream_handler(TRIM_PROTOCOL, self.topology.serve_notice)
        disable_libp2p_pruner(host)
        await nursery.start(self.topology.run)

    async def _dial_known(self, peer: ID) -> bool:
        """Dial a peer we know by id only (a ring neighbour): its addresses from the peerstore,
        else from the DHT; through a relay when it cannot be dialled directly."""
        if not _known_addrs(self._host, peer) and self.routing is not None:
            await self.routing.locate(peer)
        try:
            with trio.fail_after(self.config.dial_timeout):
                await self._dial(PeerInfo(peer, []))
            return True
        except Exception as exc:
            log_event(
                logger, "dial_failed", logging.DEBUG, node=self.name, peer=str(peer), error=repr(exc)[:200]
            )
        if self.nat is not None:
            return await self.nat.dial_relayed(peer)
        return False

    async def _stats_every(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            self.log_stats()
