"""What the node does per RPC besides its payloads, seen from a plain py-libp2p peer over real
loopback sockets: the signed peer record once per stream (not on every RPC), Yamux window
updates once per half window (not after every read), and copies of a refused message ignored
(not verified, parsed and refused once per copy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from companion.node import CompanionNode
from companion.node.yamux import CREDIT_BATCH, BatchedYamuxStream
from companion.protocol import MESSAGES, Message, encode
from support.cards import metadata as md
from support.nodes import RawPeer, raw_peer, running

TEXT = "x" * 900
"""A payload of about 1 KB; with its signature and py-libp2p's signed peer record on every RPC,
60 of them are about 80 KB."""


async def until(predicate: Callable[[], bool], timeout: float, why: Callable[[], str] | None = None) -> None:
    """Wait until ``predicate`` holds; past ``timeout``, ``TooSlowError``, or an assertion that
    says ``why()`` when given."""
    try:
        with trio.fail_after(timeout):
            while not predicate():
                await trio.sleep(0.02)
    except trio.TooSlowError:
        if why is None:
            raise
        raise AssertionError(why()) from None


async def linked(node: CompanionNode, peer: RawPeer) -> None:
    """Connected both ways on pubsub, with gossipsub meshes on ``messages``."""
    await peer.connect(node.listen_addrs[0])
    node_id = ID.from_base58(node.peer_id)
    await until(lambda: node_id in peer.pubsub.peers and node._pubsub is not None, 10)
    await until(lambda: ID.from_base58(peer.peer_id) in node._pubsub.peers, 10)  # type: ignore[union-attr]
    # and each knows the other is subscribed to ``messages``: before that a publish may reach
    # nobody (a loaded machine took longer than the 10 s wait for the first refusal)
    await until(lambda: node_id in peer.pubsub.peer_topics.get(MESSAGES, set()), 10)
    peer_id = ID.from_base58(peer.peer_id)
    await until(lambda: peer_id in node._pubsub.peer_topics.get(MESSAGES, set()), 10)  # type: ignore[union-attr]


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


async def test_yamux_window_updates_are_batched_and_traffic_never_stalls() -> None:
    """A peer sends the node 60 messages of 1 KB (about 80 KB): py-libp2p's Yamux credited them
    back after every other read (a frame each way per message, ~30 here); the node credits once
    per 16 KiB read (about 5), and 400 more (beyond the whole window) still all arrive."""
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
        queue = peer.pubsub.peer_queues[ID.from_base58(node.peer_id)]

        async def send(text: str) -> None:
            # py-libp2p drops what its 32-RPC send queue cannot hold, silently: on a busy machine
            # the raw peer (in this process) outran the node and dropped its own messages. It
            # waits for room as the node's own publishes do; a stalled stream keeps it full
            with trio.fail_after(15):
                while len(queue) >= 16:
                    await trio.sleep(0.005)
            await peer.publish(MESSAGES, encode(Message.create("user_w", ["companion_a"], text)))

        router, dropped = peer.pubsub.router, [0]
        drop_rpc = router._handle_dropped_rpc

        def count_drop(*args: Any) -> None:
            dropped[0] += 1
            drop_rpc(*args)

        router._handle_dropped_rpc = count_drop
        start, credits, window = heard(), 0, stream.send_window
        for i in range(60):
            await send(f"{i} {TEXT}")
            await trio.sleep(0.005)
            credits += stream.send_window > window  # a WINDOW_UPDATE arrived since the last look
            window = stream.send_window
        await until(lambda: heard() >= start + 60, 15)
        assert credits <= 80_000 // CREDIT_BATCH + 2, f"{credits} window updates for 60 messages of 1 KB"
        for i in range(400):
            await send(f"b{i} {TEXT}")
            await trio.sleep(0.002)
        await until(
            lambda: heard() >= start + 460,
            30,
            lambda: (
                f"{heard() - start} of 460 heard; the node's drops {node.drops.snapshot()}, "
                f"the raw peer's {dropped[0]}"
            ),
        )
        nursery.cancel_scope.cancel()


async def test_the_production_settings_are_those_of_the_running_node() -> None:
    """Not a config object: what the running host, gossipsub router and connections use (issue 12:
    D 6, D_high 8, adaptive gossip off, v1.1, py-libp2p's ping monitor off, batched Yamux)."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (node, _rec), raw_peer() as peer:
        await linked(node, peer)
        router, network = node._router, node._host.get_network()
        assert router is not None
        assert (router.degree, router.degree_low, router.degree_high) == (6, 4, 8)
        assert router.adaptive_gossip_enabled is False and router.heartbeat_interval == 1
        assert set(router.protocols) == {"/meshsub/1.1.0", "/meshsub/1.0.0"}
        assert network.connection_config.enable_health_monitoring is False
        assert network._health_monitor is None
        assert node.health.settings.interval == 30 and node.health.settings.failures_allowed == 1
        conns = [c for cs in network.connections.values() for c in cs]
        streams = [s for c in conns for s in c.muxed_conn.streams.values()]
        assert streams and all(isinstance(s, BatchedYamuxStream) for s in streams)
        nursery.cancel_scope.cancel()


async def test_copies_of_a_refused_message_are_not_parsed_again() -> None:
    """In a mesh every peer forwards a copy; py-libp2p marked only accepted messages seen, so each
    copy of a refused one had its signature verified and its payload parsed and refused again
    (and counted again). A forged copy arriving first still cannot get the genuine one ignored."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (node, rec), raw_peer() as peer:
        await linked(node, peer)
        pubsub = node._pubsub
        assert pubsub is not None
        await peer.publish(MESSAGES, b"not json at all")
        await until(lambda: any(m.data == b"not json at all" for m in peer.received), 5)
        signed = next(m for m in peer.received if m.data == b"not json at all")
        await until(lambda: node.drops.by_reason["not_json"] >= 1, 10)
        stream = peer.pubsub.peers[ID.from_base58(node.peer_id)]
        for _ in range(3):  # the copies three more mesh peers would forward
            await peer.pubsub.write_msg(stream, rpc_pb2.RPC(publish=[signed]))
        genuine = encode(Message.create("user_w", ["companion_a"], "genuine"))
        forged = rpc_pb2.Message()
        forged.CopyFrom(signed)
        forged.data = genuine  # the signer and seqno of the next message, other bytes
        forged.seqno = (peer.pubsub.counter + 1).to_bytes(8, "big")
        await peer.pubsub.write_msg(stream, rpc_pb2.RPC(publish=[forged]))
        await until(lambda: node.drops.by_reason["bad_signature"] >= 1, 10)
        await peer.publish(MESSAGES, genuine)  # a new seqno: delivered
        await until(lambda: any(i.raw == genuine for i in rec.items), 10)
        assert node.drops.by_reason["not_json"] == 1, node.drops.snapshot()
        assert pubsub.refused_seen == 1
        nursery.cancel_scope.cancel()
