"""Nodes in one process over real loopback sockets: membership, delivery, authenticity, replays."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from companion.memory import Inbound
from companion.node import CompanionNode, NodeNotRunning
from companion.node import node as node_module
from companion.node.membership import MembershipEvent
from companion.node.metadata import fetch_metadata
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    PREVIEWS,
    QUERIES,
    STATES,
    Action,
    Message,
    Metadata,
    Query,
    QueryResult,
    State,
    encode,
)
from support.cards import metadata as md
from support.nodes import RawPeer, raw_peer, running, until
from support.recorders import Recorder


async def deliver(
    src: Callable[[str], Any],
    publish: Callable[[str, Any], Any],
    topic: str,
    recorder: Recorder,
    match: Callable[[Inbound, str], bool],
) -> Inbound:
    """Publish fresh payloads until one arrives (the first may precede the mesh); bounded."""
    for attempt in range(40):
        tag = f"t{attempt}"
        await publish(topic, src(tag))

        def arrived(i: Inbound, tag: str = tag) -> bool:
            return i.topic == topic and match(i, tag)

        got = await recorder.wait_for(arrived, 0.25)
        if got is not None:
            return got
    raise AssertionError(f"nothing arrived on {topic}")


async def test_join_publish_and_leave() -> None:
    events: list[MembershipEvent] = []
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (a, rec_a):
        a.add_membership_listener(events.append)
        async with running(nursery, md("b"), peers=[a.listen_addrs[0]]) as (b, rec_b):
            assert await a.wait_for(lambda: set(a.directory) == {"companion_a", "companion_b"}, 10)
            assert await b.wait_for(lambda: set(b.directory) == {"companion_a", "companion_b"}, 10)
            assert b.directory["companion_a"] == md("a")
            payloads: dict[str, Callable[[str], Any]] = {
                MESSAGES: lambda t: Message.create("companion_b", ["companion_a"], t),
                STATES: lambda t: [State.create("companion_b", "speak", 5, True)],
                QUERIES: lambda t: Query.create("companion_b", "speak", id=t),
                ACTIONS: lambda t: Action.create("companion_b", t, {}),
            }
            for topic, make in payloads.items():
                got = await deliver(make, b.publish, topic, rec_a, lambda i, t: i.sender_peer == b.peer_id)
                assert got.raw  # the bridge forwards these bytes unchanged
            sent = b.stats()["sent"]  # what b wrote to a, by topic (an idle network's CPU goes here)
            assert all(sent.get(f"publish:{topic}", 0) >= 1 for topic in payloads), sent
            # a node receives its own payloads too (the leader acts on its own states)
            assert await rec_b.wait_for(lambda i: i.sender_peer == b.peer_id, 5)
            reply = await deliver(
                lambda t: QueryResult(id=t, error="no"),
                a.publish,
                QUERIES,
                rec_b,
                lambda i, t: i.raw == encode(QueryResult(id=t, error="no")),
            )
            assert reply.sender_peer == a.peer_id
        # a deadline for a failure only: under load (a cold suite beside mypy) the leave took > 5 s
        assert await a.wait_for(lambda: set(a.directory) == {"companion_a"}, 20)
        nursery.cancel_scope.cancel()
    assert [(e.kind, e.companion_id) for e in events] == [("joined", "companion_b"), ("left", "companion_b")]


async def test_only_a_message_published_as_such_counts_as_sent() -> None:
    """A reply's preview (PREVIEWS) carries the id the reply will have: when the preview went
    out before a stop began and its id counted as sent, the stop took the reply it then
    published for one sent before, did not wait for the clients to read it, and closed them
    (the streamed stop's test, failing now and then)."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (a, _rec):
        reply = Message.create("companion_a", ["user_x"], "The sea is calm.")
        await a.publish(PREVIEWS, reply)
        assert list(a.messages_sent) == []
        await a.publish(MESSAGES, reply)
        assert list(a.messages_sent) == [reply.params.id]
        nursery.cancel_scope.cancel()


async def test_publish_outside_run_is_refused() -> None:
    node = CompanionNode(md("a"))
    with pytest.raises(NodeNotRunning):
        await node.publish(MESSAGES, Message.create("companion_a", [], "x"))


@pytest.mark.parametrize("we_dial", [True, False])
async def test_metadata_learned_from_an_aikyo_style_peer(
    we_dial: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aikyo answers a peer it knows with an empty stream, and asks as soon as it connects:
    our node must hold its answer until its own request reached the peer. Our request is
    delayed here so the peer's request always comes first."""
    real_fetch = fetch_metadata  # the one node_module imports and calls

    async def late_fetch(*args: Any, **kwargs: Any) -> Any:
        await trio.sleep(0.3)
        return await real_fetch(*args, **kwargs)

    monkeypatch.setattr(node_module, "fetch_metadata", late_fetch)
    async with trio.open_nursery() as nursery, raw_peer(md("js"), aikyo_style=True) as js:
        peers = [js.addr] if we_dial else []
        async with running(nursery, md("py"), peers=peers) as (node, _):
            if not we_dial:
                await js.connect(node.listen_addrs[0])
            await until(lambda: bool(js.host.get_network().connections))
            answer = await js.request_metadata(ID.from_base58(node.peer_id))
            assert Metadata.model_validate_json(answer) == md("py")
            assert await node.wait_for(lambda: "companion_js" in node.directory, 10)
        nursery.cancel_scope.cancel()


async def test_bridge_node_is_not_a_companion() -> None:
    async with trio.open_nursery() as nursery, running(nursery, None) as (bridge, rec):
        async with running(nursery, md("a"), peers=[bridge.listen_addrs[0]]) as (a, _):
            assert await bridge.wait_for(lambda: "companion_a" in bridge.directory, 10)
            await until(lambda: bool(a.connected_peers))
            assert set(a.directory) == {"companion_a"}
            # a client relayed by the bridge may speak as a user
            await deliver(
                lambda t: Message.create("user_1", ["companion_a"], t),
                bridge.publish,
                MESSAGES,
                rec,
                lambda i, t: i.sender_peer == bridge.peer_id,
            )
            # ...but not as a companion that is bound to another peer: refused at its own edge
            before = bridge.drops.by_reason["spoofed_sender"]
            await bridge.publish(MESSAGES, Message.create("companion_a", ["companion_a"], "forged"))
            assert bridge.drops.by_reason["spoofed_sender"] == before + 1
        nursery.cancel_scope.cancel()


def params_id(inbound: Inbound) -> str:
    return inbound.payload.params.id if isinstance(inbound.payload, Message) else ""


async def test_spoofed_sender_is_rejected_and_not_forwarded() -> None:
    """a - b - c in a line, a spoofer x attached to b only, claiming to be a."""
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, _ = await stack.enter_async_context(running(nursery, md("a")))
        b, _ = await stack.enter_async_context(running(nursery, md("b"), peers=[a.listen_addrs[0]]))
        c, rec_c = await stack.enter_async_context(running(nursery, md("c"), peers=[b.listen_addrs[0]]))
        spoofer = await stack.enter_async_context(raw_peer(md("x")))
        await spoofer.connect(b.listen_addrs[0])
        assert await b.wait_for(lambda: {"companion_a", "companion_x"} <= set(b.directory), 10)
        # the genuine path x -> b -> c works
        await deliver(
            lambda t: encode(Message.create("companion_x", ["companion_c"], t)),
            spoofer.publish,
            MESSAGES,
            rec_c,
            lambda i, t: i.sender_peer == spoofer.peer_id,
        )
        for n in range(5):
            forged = Message.create("companion_a", ["companion_c"], "I am a", id=f"forged{n}")
            await spoofer.publish(MESSAGES, encode(forged))
        await until(lambda: b.drops.by_reason["spoofed_sender"] >= 5)
        genuine = Message.create("companion_x", ["companion_c"], "after", id="after")
        await spoofer.publish(MESSAGES, encode(genuine))
        assert await rec_c.wait_for(lambda i: params_id(i) == "after", 5)
        assert not any(params_id(i).startswith("forged") for i in rec_c.items)
        assert c.drops.by_reason["spoofed_sender"] == 0  # b never forwarded them
        nursery.cancel_scope.cancel()


async def test_replay_after_seen_cache_expiry_is_ignored() -> None:
    async with trio.open_nursery() as nursery:
        async with running(nursery, md("a")) as (a, rec), raw_peer(md("x")) as peer:
            await peer.connect(a.listen_addrs[0])
            assert await a.wait_for(lambda: "companion_x" in a.directory, 10)
            got = await deliver(
                lambda t: encode(Message.create("companion_x", ["companion_a"], t)),
                peer.publish,
                MESSAGES,
                rec,
                lambda i, t: i.sender_peer == peer.peer_id,
            )
            signed = next(m for m in peer.received if m.data == got.raw)
            pubsub = a._pubsub
            assert pubsub is not None
            pubsub.seen_messages = type(pubsub.seen_messages)(pubsub.seen_messages.ttl)
            count = len(rec.items)
            await pubsub.push_msg(peer.host.get_id(), signed)
            assert a.drops.by_reason["replay"] == 1
            await trio.sleep(0)
            assert len(rec.items) == count
        nursery.cancel_scope.cancel()


async def test_malformed_signed_message_does_not_stop_the_node() -> None:
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        a, _ = await stack.enter_async_context(running(nursery, md("a")))
        _, rec_b = await stack.enter_async_context(running(nursery, md("b"), peers=[a.listen_addrs[0]]))
        assert await a.wait_for(lambda: "companion_b" in a.directory, 10)
        pubsub = a._pubsub
        assert pubsub is not None
        bogus = rpc_pb2.Message(
            from_id=b"\x12\x20" + b"h" * 32,  # a hashed peer id: the key must come from `key`
            seqno=b"\x00" * 8,
            data=b"{}",
            topicIDs=[MESSAGES],
            signature=b"sig",
            key=b"\xff\xff garbage",
        )
        await pubsub.push_msg(pubsub.my_id, bogus)
        assert a.drops.by_reason["malformed_rpc"] == 1
        await deliver(
            lambda t: Message.create("companion_a", ["companion_b"], t),
            a.publish,
            MESSAGES,
            rec_b,
            lambda i, t: i.sender_peer == a.peer_id,
        )
        nursery.cancel_scope.cancel()


async def test_raw_peer_helper_sees_everything(nursery: trio.Nursery) -> None:
    async with raw_peer() as peer:
        assert isinstance(peer, RawPeer) and peer.received == []


async def test_a_failed_write_to_a_peer_does_not_stop_its_deliveries() -> None:
    """A write to b fails (its stream reset, as when b's window stays shut for 5 s): py-libp2p
    forgot b's subscriptions and never sent b anything again; b still hears a afterwards."""
    async with trio.open_nursery() as nursery, running(nursery, md("a")) as (a, _rec_a):
        async with running(nursery, md("b"), peers=[a.listen_addrs[0]]) as (b, rec_b):
            assert await a.wait_for(lambda: "companion_b" in a.directory, 10)

            def make(tag: str) -> Message:
                return Message.create("companion_a", ["companion_b"], tag)

            def from_a(item: Inbound, tag: str) -> bool:
                return item.sender_peer == a.peer_id and isinstance(item.payload, Message)

            await deliver(make, a.publish, MESSAGES, rec_b, from_a)
            assert a._pubsub is not None
            b_id = ID.from_base58(b.peer_id)
            await a._pubsub.peers[b_id].reset()  # our stream to b: the next write fails
            rec_b.items.clear()
            await deliver(make, a.publish, MESSAGES, rec_b, from_a)
            assert a.stats()["connected_peers"] == 1
        nursery.cancel_scope.cancel()
