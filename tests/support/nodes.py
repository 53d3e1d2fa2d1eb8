"""Test peers built from py-libp2p directly, bypassing our edge: a raw publisher (no validators,
so it sends any bytes) that may claim a companion id, and an aikyo-like metadata peer; our own
node run in a test's nursery; a companion's presence service alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from companion.node import CompanionNode
from companion.node.config import NodeConfig, make_gossipsub, make_host
from companion.node.discovery import parse_peer_addr
from companion.node.drops import DropCounters
from companion.node.membership import Membership, MembershipEvent
from companion.node.metadata import METADATA_PROTOCOL, encode_metadata
from companion.node.presence import PresenceService, PresenceSettings
from companion.protocol import TOPICS, Metadata
from support.cards import metadata as md
from support.recorders import Recorder


@dataclass
class RawPeer:
    """A bare gossipsub peer with strict signing and no topic validators."""

    metadata: Metadata | None = None
    aikyo_style: bool = False
    """Answer metadata like aikyo: an empty stream to a peer it already knows."""
    host: Any = None
    pubsub: Any = None
    known: set[ID] = field(default_factory=set)
    received: list[Any] = field(default_factory=list)
    received_event: trio.Event = field(default_factory=trio.Event)

    @property
    def peer_id(self) -> str:
        return str(self.host.get_id())

    @property
    def addr(self) -> str:
        return str(self.host.get_addrs()[0])

    async def _serve(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        if not (self.aikyo_style and peer in self.known) and self.metadata is not None:
            await stream.write(encode_metadata(self.metadata))
        await stream.close()

    async def request_metadata(self, peer: ID) -> bytes:
        """What aikyo does on identify: ask, remember the peer if it answered."""
        stream = await self.host.new_stream(peer, [METADATA_PROTOCOL])
        data = b""
        try:
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    break
                data += chunk
        except Exception:
            pass
        if data:
            self.known.add(peer)
        return data

    async def connect(self, addr: str) -> None:
        with trio.fail_after(5):
            await self.host.connect(parse_peer_addr(addr))

    async def publish(self, topic: str, data: bytes) -> None:
        await self.pubsub.publish(topic, data)

    async def _drain(self, sub: Any) -> None:
        while True:
            self.received.append(await sub.get())
            self.received_event.set()
            self.received_event = trio.Event()


@asynccontextmanager
async def raw_peer(metadata: Metadata | None = None, *, aikyo_style: bool = False) -> AsyncIterator[RawPeer]:
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",))
    peer = RawPeer(metadata, aikyo_style)
    peer.host = make_host(config, create_new_key_pair())
    router = make_gossipsub(config)
    peer.pubsub = Pubsub(peer.host, router, strict_signing=True)
    if metadata is not None:
        peer.host.set_stream_handler(METADATA_PROTOCOL, peer._serve)
    async with (
        peer.host.run(listen_addrs=[Multiaddr(a) for a in config.listen]),
        background_trio_service(peer.pubsub),
        background_trio_service(router),
    ):
        try:
            await peer.pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                for topic in TOPICS:
                    nursery.start_soon(peer._drain, await peer.pubsub.subscribe(topic))
                yield peer
                nursery.cancel_scope.cancel()
        finally:
            # connections close while pubsub still runs, as the node does (node.py
            # _close_host): a peer's subscription arriving during the stop would otherwise
            # reach a pubsub whose task nursery is closed and crash the host
            with trio.CancelScope(shield=True), trio.move_on_after(3):
                await peer.host.close()


# --- our own node, run in a test's nursery --------------------------------------------------------


@asynccontextmanager
async def running(
    nursery: trio.Nursery, metadata: Metadata | None, **config: Any
) -> AsyncIterator[tuple[CompanionNode, Recorder]]:
    """A node with ``config`` running in ``nursery`` (started: it listens), stopped on exit."""
    node = CompanionNode(metadata, NodeConfig(**config))
    recorder = Recorder()
    scope = trio.CancelScope()
    await nursery.start(run_node, node, recorder, scope)
    try:
        yield node, recorder
    finally:
        scope.cancel()


async def run_node(
    node: CompanionNode, recorder: Recorder, scope: trio.CancelScope, task_status: Any
) -> None:
    with scope:
        await node.run(recorder, task_status=task_status)


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


# --- a companion's presence service, without a node ---------------------------------------------


def presence_service(
    events: list[MembershipEvent] | None = None,
    drops: DropCounters | None = None,
    settings: PresenceSettings | None = None,
) -> PresenceService:
    """A companion node's presence service (``companion_me``, a fresh peer id), its events into
    ``events``; 30 s interval and 90 s ttl unless ``settings`` says otherwise. Give it a
    pubsub (``_pubsub``, or :meth:`~PresenceService.start`) before it publishes."""
    me = create_new_key_pair()
    return PresenceService(
        Membership(ID.from_pubkey(me.public_key).to_base58(), None),
        md("me"),
        settings or PresenceSettings(30.0, 90, 1.0, 65536),
        drops or DropCounters(trio.current_time),
        (events if events is not None else []).extend,
    )
