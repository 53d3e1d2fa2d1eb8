"""The clients of ``companion run --ws``: the node they publish through and the bridge serving them.

The bridge is attached to one more node in this process, which is not a companion (a
companion's node may publish only as that companion; clients speak as ``user_...``). The
companions here dial it, and gossip brings it the network's payloads through them. Clients get
everything that node receives: the companions' payloads as gossip delivers
them, each other's frames through the node's echo (never their own frame back), the bridge's
voice likewise. The companions' engines publish through their own nodes. The page lists every
companion this process's companions see.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from companion.app.lines import BRIDGE_LINE
from companion.log import log_event
from companion.protocol import Metadata

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from companion.app.bridge import BridgeOptions
    from companion.bridge import Bridge
    from companion.node import CompanionNode
    from companion.node.trust import TrustStore

__all__ = ["CLIENT_NODE_TIMEOUT", "ClientNode", "let_clients_in", "run_client_node"]

logger = logging.getLogger("companion.app.clients")

CLIENT_NODE_TIMEOUT: Final = 10.0
"""How long the clients' node may take to meet this process's companions before clients are
let in anyway (with a warning)."""


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


async def run_client_node(
    options: BridgeOptions,
    nodes: list[CompanionNode],
    trust: TrustStore,
    *,
    task_status: TaskStatus[ClientNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node clients publish through and receive from until cancelled (started with it
    once it listens), with the bridge as its handler: not a companion (a companion's node may
    publish only as that companion, clients speak as ``user_...``). It listens on 127.0.0.1
    only and the companions dial it, so it receives the network's payloads through them. The
    bridge lists every companion they see (``nodes`` fills up as they start). Its clients are
    this run's approvers: the companions accept their answers and approvals."""
    from companion.app.bridge import make_bridge
    from companion.node import CompanionNode, NodeConfig

    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="clients")
    node = CompanionNode(None, config, trust=trust)
    trust.allow(node.peer_id, "approver")
    bridge = make_bridge(options, node, _Directories(nodes))
    await bridge.bind()  # a taken --ws address is an error before any node starts
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, bridge)
        task_status.started(ClientNode(node, bridge, node.listen_addrs[0]))


async def let_clients_in(
    options: BridgeOptions,
    clients: ClientNode,
    local: set[str],
    *,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve clients until cancelled, from when the clients' node has met this process's
    companions (``local``), or after :data:`CLIENT_NODE_TIMEOUT` with a warning; started with
    the port once the ``bridge ws://...`` line is printed."""
    from companion.app.bridge import client_urls, serve_clients

    node = clients.node
    if not await node.wait_for(lambda: local <= set(node.directory), CLIENT_NODE_TIMEOUT):
        log_event(
            logger,
            "clients_node_not_connected",
            logging.WARNING,
            missing=sorted(local - set(node.directory)),
            timeout=CLIENT_NODE_TIMEOUT,
        )
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve_clients, options, clients.bridge, node)
        ws, *others = client_urls(options, port)
        print(f"{BRIDGE_LINE}{ws}", flush=True)
        for url in others:
            print(f"  {url}", flush=True)
        task_status.started(port)
