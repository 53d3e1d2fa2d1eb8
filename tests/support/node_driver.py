"""Our CompanionNode in a process driven over stdin, for tests against other implementations.

``python -m support.node_driver METADATA_JSON [--peer ADDR] [--config NODE_CONFIG_JSON]``; commands on
stdin, one JSON object a line: ``{"op": "connect", "addr": A}``,
``{"op": "publish", "topic": T, "text": ENVELOPE_JSON}``, ``{"op": "stats"}``,
``{"op": "disconnect", "peer": PEER_ID}`` (hang up on one peer and keep hanging up: the
peer's own node redials known peers, so every later connection to it is closed at once).
Events on stdout, one JSON object a line: ``started``, ``joined``/``left`` (companion_id),
``inbound`` (topic, peer, text), ``connected``, ``published``, ``stats`` (the node's counters),
``disconnected``, ``error``. ``--config`` overrides NodeConfig fields (e.g.
``{"health_check_interval": 1}``).
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

import trio

from companion.log import configure_logging
from companion.memory import Inbound
from companion.node import CompanionNode, NodeConfig
from companion.node.membership import MembershipEvent
from companion.node.topology import close_peer
from companion.protocol import Metadata
from support.commands import emit, serve_commands


class Printer:
    async def handle(self, inbound: Inbound) -> None:
        emit("inbound", topic=inbound.topic, peer=inbound.sender_peer, text=inbound.raw.decode())


def on_membership(event: MembershipEvent) -> None:
    emit(
        event.kind, companion_id=event.companion_id, peer=event.peer_id, metadata=event.metadata.model_dump()
    )


async def main(metadata: Metadata, peers: list[str], overrides: dict[str, Any]) -> None:
    node = CompanionNode(metadata, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), peers=peers, **overrides))
    node.add_membership_listener(on_membership)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, Printer())
        emit("started", peer_id=node.peer_id, addrs=node.listen_addrs)
        banned: set[str] = set()
        nursery.start_soon(keep_out, node, banned)
        await serve_commands(partial(command, node, banned))
        nursery.cancel_scope.cancel()


async def disconnect(node: CompanionNode, peer: str) -> None:
    """Close every connection to ``peer`` (a test reaching past the node's public surface), as the
    node's own trims do (py-libp2p's ``host.disconnect`` leaves a connection the peer opens
    meanwhile open but unlisted: the peer then never sees the hang-up)."""
    from libp2p.peer.id import ID

    with trio.fail_after(10):
        await close_peer(node._host.get_network(), ID.from_base58(peer))


async def keep_out(node: CompanionNode, banned: set[str]) -> None:
    """Close any connection to a peer this driver hung up on, within 50 ms of its opening: the
    other node's connection keeper redials known peers, and a dial in flight during the hang-up
    lands after it."""
    while True:
        await trio.sleep(0.05)
        network = node._host.get_network() if node._host is not None else None
        if network is None:
            continue
        for peer in [p for p in network.connections if p.to_base58() in banned]:
            with trio.move_on_after(5):
                await close_peer(network, peer)


async def command(node: CompanionNode, banned: set[str], command: dict[str, Any]) -> None:
    if command["op"] == "connect":
        await node.connect(command["addr"])
        emit("connected", addr=command["addr"])
    elif command["op"] == "publish":
        await node.publish_raw(command["topic"], command["text"].encode())
        emit("published", topic=command["topic"])
    elif command["op"] == "stats":
        emit("stats", **node.stats())
    elif command["op"] == "disconnect":
        banned.add(command["peer"])
        await disconnect(node, command["peer"])
        emit("disconnected", peer=command["peer"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("metadata")
    parser.add_argument("--peer", action="append", default=[])
    parser.add_argument("--config", default="{}", help="NodeConfig fields as JSON")
    args = parser.parse_args()
    configure_logging("WARNING")
    trio.run(main, Metadata.model_validate_json(args.metadata), args.peer, json.loads(args.config))
