"""What the node puts on the wire besides payloads, seen from a plain py-libp2p peer over real
loopback sockets: the signed peer record once per stream (not on every RPC), and Yamux window
updates once per half window (not after every read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import DEFAULT_WINDOW_SIZE
from node_support import RawPeer, raw_peer
from support.cards import metadata as md
from test_node_network import running

from companion.node import CompanionNode
from companion.protocol import MESSAGES, Message, encode

TEXT = "x" * 900
"""A payload of about 1 KB; with its signature and py-libp2p's signed peer record on every RPC,
60 of them are about 80 KB, less than half a Yamux window (128 KiB)."""


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


async def linked(node: CompanionNode, peer: RawPeer) -> None:
    """Connected both ways on pubsub, with gossipsub meshes on ``messages``."""
    await peer.connect(node.listen_addrs[0])
    node_id = ID.from_base58(node.peer_id)
    await until(lambda: node_id in peer.pubsub.peers and node._pubsub is not None, 10)
    await until(lambda: ID.from_base58(peer.peer_id) in node._pubsub.peers, 10)  # type: ignore[union-attr]


def count_records(peer: RawPeer) -> list[int]:
    """Count the signed peer records the raw peer's peerstore consumes (one per RPC that carried
    one: py-libp2p verifies and stores each)."""
    store = peer.host.get_peerstore()
    original = store.consume_peer_record
    counted = [0]

    def consume(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return original(*args, **kwargs)

    store.consume_peer_record = consume
    return counted


async def test_the_signed_peer_record_goes_once_per_stream_not_on_every_rpc() -> None:
    """py-libp2p attaches the node's signed peer record to every RPC and every py-libp2p
    receiver verifies its signature again: here 30 messages carry it at most once more."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (node, _rec), raw_peer() as peer:
        await linked(node, peer)
        for i in range(40):  # until the mesh carries them
            await node.publish(MESSAGES, Message.create("companion_a", [], f"warm {i}"))
            if peer.received:
                break
            await trio.sleep(0.25)
        assert peer.received, "the raw peer never heard the node"
        records = count_records(peer)
        before = len(peer.received)
        for i in range(30):
            await node.publish(MESSAGES, Message.create("companion_a", [], f"m {i}"))
        await until(lambda: len(peer.received) >= before + 30, 15)
        assert records[0] <= 1, f"{records[0]} signed peer records for 30 messages"
        assert peer.host.get_peerstore().get_peer_record(ID.from_base58(node.peer_id)) is not None
        assert node._pubsub is not None and node._pubsub.records_left_out >= 30
        nursery.cancel_scope.cancel()


async def test_yamux_window_updates_wait_for_half_a_window_and_traffic_never_stalls() -> None:
    """A peer sends the node 60 messages of 1 KB: py-libp2p's Yamux credited them back after
    every other read (a frame each way per message); the node credits nothing until half its
    window is read, and 400 more (beyond the whole window) still all arrive."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (node, rec), raw_peer() as peer:
        await linked(node, peer)

        def heard() -> int:
            mine = [i for i in rec.items if i.sender_peer == peer.peer_id]
            return sum(1 for i in mine if isinstance(i.payload, Message))

        for i in range(40):  # until the mesh carries them
            await peer.publish(MESSAGES, encode(Message.create("user_w", ["companion_a"], f"warm {i}")))
            if heard():
                break
            await trio.sleep(0.25)
        assert heard(), "the node never heard the raw peer"
        stream = peer.pubsub.peers[ID.from_base58(node.peer_id)].muxed_stream
        window = stream.send_window
        start = heard()
        for i in range(60):
            await peer.publish(MESSAGES, encode(Message.create("user_w", ["companion_a"], f"{i} {TEXT}")))
            await trio.sleep(0.002)
        await until(lambda: heard() >= start + 60, 15)
        assert stream.send_window <= window - 60_000, (
            f"send window {stream.send_window} of {DEFAULT_WINDOW_SIZE}: credited after reads"
        )
        for i in range(400):
            await peer.publish(MESSAGES, encode(Message.create("user_w", ["companion_a"], f"b{i} {TEXT}")))
            await trio.sleep(0.002)
        await until(lambda: heard() >= start + 460, 30)
        nursery.cancel_scope.cancel()
