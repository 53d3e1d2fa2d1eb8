"""The clients of ``companion run --ws``: the node they publish through and the bridge serving them.

Clients see the conversation as the first card's companion sees it: that node's handler hands
every payload to them, and its engine publishes through the bridge, so they get its payloads as
they go out. What clients send goes out through one more node in this process that is not a
companion (a companion's node may publish only as that companion; clients speak as
``user_...``); the companions here dial it. The page lists every companion they see.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from ..log import log_event
from ..protocol import Envelope, Metadata, State
from ..transport import Inbound, Publisher
from .lines import BRIDGE_LINE

if TYPE_CHECKING:
    from ..bridge import Bridge
    from ..engine import NodeLike
    from ..node import CompanionNode, InboundHandler
    from ..trust import TrustStore
    from .bridge import BridgeOptions

__all__ = ["CLIENT_NODE_TIMEOUT", "ClientNode", "bridged", "open_to_clients", "start_client_node"]

logger = logging.getLogger("companion.app.clients")

CLIENT_NODE_TIMEOUT: Final = 10.0
"""How long the clients' node may take to meet this process's companions before clients are
let in anyway (with a warning)."""


def bridged(node: CompanionNode, bridge: Bridge | None) -> NodeLike:
    """The node as its engine sees it: through the bridge when the node carries it."""
    return node if bridge is None else _BridgedNode(node, bridge.publisher(node))


class _BridgedNode:
    """A node as its engine sees it when the node carries the bridge: it publishes through the
    bridge, so local clients get the engine's payloads as they are published."""

    def __init__(self, node: CompanionNode, publisher: Publisher) -> None:
        self.membership = node.membership
        self.add_membership_listener = node.add_membership_listener
        self._node = node
        self._publisher = publisher

    @property
    def directory(self) -> Mapping[str, Metadata]:
        return self._node.directory

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        await self._publisher.publish(topic, envelope)


class Delivering:
    """The handler of the node that carries the bridge: clients get every payload first (they
    see a message before anything the engine says about it), except the node's own, which they
    got when it was published (``bridge.publisher``)."""

    def __init__(self, bridge: Bridge, inner: InboundHandler, *, own_peer: str) -> None:
        self.bridge = bridge
        self.inner = inner
        self.own_peer = own_peer

    async def handle(self, inbound: Inbound) -> None:
        if inbound.sender_peer != self.own_peer:
            self.bridge.deliver(inbound)
        await self.inner.handle(inbound)


class _Ignoring:
    """The clients' node hands nothing to anyone: clients are served from a companion's view."""

    async def handle(self, inbound: Inbound) -> None:
        return None


class _Directories(Mapping[str, Metadata]):
    """Every companion the given nodes see (live: read on each access)."""

    def __init__(self, nodes: Sequence[CompanionNode]) -> None:
        self._nodes = nodes

    def __getitem__(self, key: str) -> Metadata:
        for node in self._nodes:
            found = node.directory.get(key)
            if found is not None:
                return found
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(cid for node in self._nodes for cid in node.directory))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class ClientNode:
    """The clients' node, the bridge serving them, and the address the companions dial."""

    node: CompanionNode
    bridge: Bridge
    address: str


async def start_client_node(
    options: BridgeOptions, nodes: list[CompanionNode], nursery: trio.Nursery, trust: TrustStore
) -> ClientNode:
    """The node clients publish through: not a companion (a companion's node may publish only as
    that companion, clients speak as ``user_...``). The companions dial it; the bridge lists
    every companion they see (``nodes`` fills up as they start). Its clients are this run's
    approvers: the companions accept their answers and approvals."""
    from ..node import CompanionNode, NodeConfig
    from .bridge import make_bridge

    node = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="clients"), trust=trust)
    trust.allow(node.peer_id, "approver")
    bridge = make_bridge(options, node, _Directories(nodes))
    await nursery.start(node.run, _Ignoring())
    return ClientNode(node, bridge, node.listen_addrs[0])


async def open_to_clients(
    options: BridgeOptions, clients: ClientNode, local: set[str], nursery: trio.Nursery
) -> int:
    """Let clients in once the clients' node has met this process's companions (``local``), or
    after :data:`CLIENT_NODE_TIMEOUT` with a warning; prints the ``bridge ws://...`` line."""
    from .bridge import client_urls, serve_clients

    node = clients.node
    if not await node.wait_for(lambda: local <= set(node.directory), CLIENT_NODE_TIMEOUT):
        log_event(
            logger,
            "clients_node_not_connected",
            logging.WARNING,
            missing=sorted(local - set(node.directory)),
            timeout=CLIENT_NODE_TIMEOUT,
        )
    publisher = clients.bridge.publisher(node)
    port: int = await nursery.start(serve_clients, options, clients.bridge, publisher)
    ws, *others = client_urls(options, port)
    print(f"{BRIDGE_LINE}{ws}", flush=True)
    for url in others:
        print(f"  {url}", flush=True)
    return port
