"""RPC writes over real Yamux streams on loopback: whole RPCs per stream, and a write that did not
finish resets the stream instead of leaving half an RPC for the next writer to continue."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from google.protobuf.message import DecodeError
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import read_varint_prefixed_bytes_limited
from multiaddr import Multiaddr

from companion.node.config import NodeConfig, make_gossipsub, make_host
from companion.node.drops import DropCounters
from companion.node.msgid import js_message_id
from companion.node.pubsub import GuardedPubsub, HelloAwareQueues

PROTOCOL = TProtocol("/companion-test/rpc/1.0.0")
RPC_BYTES = 150_000  # more than one Yamux frame (64 KB): each write yields between its frames


def rpc(tag: int) -> rpc_pb2.RPC:
    return rpc_pb2.RPC(publish=[rpc_pb2.Message(data=bytes([tag]) * RPC_BYTES, topicIDs=["messages"])])


class Receiver:
    """Reads varint-prefixed RPCs from the one stream it is given, once ``go`` is set."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.parsed: list[rpc_pb2.RPC] = []
        self.failure: BaseException | None = None
        self.done = trio.Event()

    async def handle(self, stream: Any) -> None:
        await self.go.wait()  # until then the sender's window runs out
        try:
            while True:
                data = await read_varint_prefixed_bytes_limited(stream, 10 * RPC_BYTES)
                message = rpc_pb2.RPC()
                message.ParseFromString(data)
                self.parsed.append(message)
        except (DecodeError, StreamError, Exception) as exc:
            self.failure = exc
        finally:
            self.done.set()


@asynccontextmanager
async def pair(
    receiver: Receiver, unsent: list[rpc_pb2.Message] | None = None
) -> AsyncIterator[tuple[GuardedPubsub, Any]]:
    """A GuardedPubsub on one host and a stream from it to a second host that runs ``receiver``;
    the messages failed writes took go to ``unsent``."""
    config = NodeConfig()
    a, b = make_host(config, create_new_key_pair()), make_host(config, create_new_key_pair())
    b.set_stream_handler(PROTOCOL, receiver.handle)
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    router = make_gossipsub(config)
    pubsub = GuardedPubsub(
        a,
        router,
        drops=DropCounters(trio.current_time),
        deliver=lambda topic, msg: None,
        outbound_queue_size=128,
        unsent=None if unsent is None else unsent.append,
    )
    async with a.run(listen_addrs=listen), b.run(listen_addrs=listen):
        try:
            async with background_trio_service(pubsub), background_trio_service(router):
                with trio.fail_after(10):
                    await pubsub.wait_until_ready()
                    await a.connect(PeerInfo(b.get_id(), b.get_addrs()))
                    stream = await a.new_stream(b.get_id(), [PROTOCOL])
                yield pubsub, stream
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(3):
                await a.close()
                await b.close()


async def write_concurrently(write: Any, stream: Any, receiver: Receiver, count: int) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for tag in range(count):
                nursery.start_soon(write, stream, rpc(tag))
            await trio.sleep(0.5)
            receiver.go.set()
        await stream.close()
        await receiver.done.wait()


async def test_concurrent_rpc_writes_arrive_whole() -> None:
    receiver = Receiver()
    async with pair(receiver) as (pubsub, stream):
        await write_concurrently(pubsub.write_msg, stream, receiver, 4)
    assert sorted(m.publish[0].data[0] for m in receiver.parsed) == [0, 1, 2, 3]
    assert all(m.publish[0].data == m.publish[0].data[:1] * RPC_BYTES for m in receiver.parsed)


async def test_py_libp2p_alone_interleaves_them() -> None:
    """Why the lock exists: the same writes through py-libp2p's own ``write_msg`` mix their frames
    (if this starts passing, py-libp2p serializes RPC writes itself)."""
    receiver = Receiver()
    async with pair(receiver) as (pubsub, stream):

        async def unguarded(stream: Any, message: rpc_pb2.RPC) -> None:
            await Pubsub.write_msg(pubsub, stream, message)

        await write_concurrently(unguarded, stream, receiver, 4)
    assert isinstance(receiver.failure, DecodeError) or len(receiver.parsed) < 4


async def test_a_write_cut_short_resets_the_stream() -> None:
    receiver = Receiver()
    unsent: list[rpc_pb2.Message] = []
    async with pair(receiver, unsent) as (pubsub, stream):
        with trio.move_on_after(1.0) as waited:  # the receiver does not read: the window runs out mid-RPC
            for tag in range(200):
                await pubsub.write_msg(stream, rpc(tag % 9))
        assert waited.cancelled_caught, "30 MB went out without the receiver reading"
        assert len(unsent) == 1 and unsent[0].data == rpc(tag % 9).publish[0].data  # the node is told
        assert await pubsub.write_msg(stream, rpc(9)) is False  # never after half an RPC
        receiver.go.set()
        with trio.fail_after(10):
            await receiver.done.wait()
    assert isinstance(receiver.failure, StreamError)  # a reset, not a decoding error
    assert all(m.publish[0].data[0] != 9 for m in receiver.parsed)


def small(tag: int, size: int = 300) -> rpc_pb2.RPC:
    return rpc_pb2.RPC(publish=[rpc_pb2.Message(data=bytes([tag % 256]) * size, topicIDs=["messages"])])


async def test_the_send_loop_writes_what_the_queue_holds_together_whole_and_in_order() -> None:
    """A full send queue (a busy node's, under load) goes out in few writes, each RPC whole, in
    queue order, control first; one RPC bigger than a batch goes alone; an idle queue still
    sends each RPC as it comes."""
    receiver = Receiver()
    receiver.go.set()
    async with pair(receiver) as (pubsub, stream):
        queue = RpcQueue(max_size=128)
        for tag in range(100):
            queue.push(small(tag))
        queue.push(rpc(200))  # 150 KB: larger than BATCH_BYTES
        control = rpc_pb2.ControlMessage(ihave=[rpc_pb2.ControlIHave(topicID="x")])
        queue.push(rpc_pb2.RPC(control=control), priority=True)
        peer = stream.muxed_conn.peer_id
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pubsub.handle_sending_messages, peer, stream, queue)
            with trio.fail_after(10):
                while len(receiver.parsed) < 102:
                    await trio.sleep(0.01)
            batched = pubsub.sent["writes"]
            queue.push(small(201))
            with trio.fail_after(10):
                while len(receiver.parsed) < 103:
                    await trio.sleep(0.01)
            queue.close()
    assert receiver.parsed[0].control.ihave[0].topicID == "x"
    tags = [m.publish[0].data[0] for m in receiver.parsed[1:]]
    assert tags == [*range(100), 200, 201]
    assert [len(m.publish[0].data) for m in receiver.parsed[1:]] == [300] * 100 + [RPC_BYTES, 300]
    assert pubsub.sent["rpcs"] == 103
    assert batched <= 4, f"{batched} writes for 102 queued RPCs"  # 30 KB of small ones, then the big one
    assert pubsub.sent["writes"] == batched + 1


async def test_publishing_waits_for_room_within_its_deadline() -> None:
    receiver = Receiver()
    async with pair(receiver) as (pubsub, _stream):
        stuck = RpcQueue()  # a peer whose sender makes no progress
        for tag in range(40):
            stuck.push(rpc(tag))
        pubsub.peer_queues[ID(b"\x00stuck")] = stuck
        started = trio.current_time()
        assert await pubsub.wait_for_room(32, 0.3) is False
        assert 0.3 <= trio.current_time() - started < 2.0
        assert await pubsub.wait_for_room(64, 0.3) is True


@asynccontextmanager
async def two_nodes() -> AsyncIterator[tuple[list[Any], list[Any], list[GuardedPubsub], list[bytes]]]:
    """Two hosts with the node's pubsub and router (js-libp2p message ids, as the node has them),
    both subscribed to ``messages``, not yet connected, their heartbeats 30 s apart (no mesh
    change or gossip but what a test does): ``(hosts, routers, pubsubs, got)``, ``got`` the data
    of what the second one delivered."""
    config = NodeConfig(heartbeat_interval=30)
    got: list[bytes] = []
    listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
    hosts = [make_host(config, create_new_key_pair()) for _ in range(2)]
    routers = [make_gossipsub(config) for _ in hosts]
    pubsubs = [
        GuardedPubsub(
            h,
            r,
            drops=DropCounters(trio.current_time),
            deliver=d,
            outbound_queue_size=128,
            msg_id_constructor=js_message_id,
        )
        for h, r, d in zip(
            hosts,
            routers,
            (lambda topic, msg: None, lambda topic, msg: got.append(bytes(msg.data))),
            strict=True,
        )
    ]
    a, b = hosts
    async with (
        a.run(listen_addrs=listen),
        b.run(listen_addrs=listen),
        background_trio_service(pubsubs[0]),
        background_trio_service(routers[0]),
        background_trio_service(pubsubs[1]),
        background_trio_service(routers[1]),
    ):
        try:
            with trio.fail_after(10):
                for pubsub in pubsubs:
                    await pubsub.wait_until_ready()
                    await pubsub.subscribe("messages")
            yield hosts, routers, pubsubs, got
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(3):
                await a.close()
                await b.close()


async def hello_from_a(hosts: Any, routers: list[Any], pubsubs: list[GuardedPubsub], got: list[bytes]) -> Any:
    """``a`` connects to ``b`` and publishes ``hello``; once ``b`` delivered it (into ``got``),
    the message as ``a``'s gossip cache holds it."""
    a, b = hosts
    await a.connect(PeerInfo(b.get_id(), b.get_addrs()))
    while b.get_id() not in pubsubs[0].peer_topics.get("messages", ()):
        await trio.sleep(0.01)
    await pubsubs[0].publish("messages", b"hello")
    while got != [b"hello"]:
        await trio.sleep(0.01)
    (message,) = [routers[0].mcache.get(mid) for mid in routers[0].mcache.window("messages")]
    return message


async def test_own_messages_reach_a_subscribed_peer_outside_the_mesh() -> None:
    """Flood publishing: a node's own message goes to every peer on the topic, so one published
    while the mesh is empty (here: the peer PRUNEd us, and the heartbeat that could graft again is
    30 s away) reaches it. py-libp2p alone sends it to the (empty) mesh,
    i.e. to nobody."""
    async with two_nodes() as ((a, b), routers, pubsubs, got):
        with trio.fail_after(10):
            await trio.sleep(0.3)  # the first heartbeats passed with nobody to graft
            await a.connect(PeerInfo(b.get_id(), b.get_addrs()))
            while b.get_id() not in routers[0].mesh["messages"]:
                await trio.sleep(0.01)
            # what handle_prune does when b PRUNEs us: b leaves our mesh, not the topic
            await routers[0].handle_prune(rpc_pb2.ControlPrune(topicID="messages"), b.get_id())
            assert not routers[0].mesh["messages"] and b.get_id() in pubsubs[0].peer_topics["messages"]
            await pubsubs[0].publish("messages", b"first")
        with trio.move_on_after(3):
            while not got:
                await trio.sleep(0.01)
        assert got == [b"first"]


async def test_gossip_names_messages_by_the_id_peers_mark_seen() -> None:
    """A node gossips (IHAVE) the messages of its last heartbeats to peers outside its mesh; a
    peer that already has one must not ask for it (IWANT) and be sent it again. py-libp2p's
    message cache named messages by ``from || seqno`` while the seen cache (and js-libp2p) use the
    node's id (``js_message_id``): every IHAVE drew an IWANT and a duplicate. And an IWANT that
    names a message by that id (as js-libp2p's do) is served."""
    async with two_nodes() as ((a, b), routers, pubsubs, got):
        with trio.fail_after(10):
            message = await hello_from_a((a, b), routers, pubsubs, got)
            window = routers[0].mcache.window("messages")
            assert window == [js_message_id(message)]
            # what a's heartbeat sends a peer outside its mesh
            await routers[0].emit_ihave("messages", window, b.get_id())
            await trio.sleep(0.5)
            assert pubsubs[1].sent["iwant"] == 0  # b has it: it asks for nothing
            # (a sent it twice once, under the whole suite's load: py-libp2p replays its cache to
            # a peer whose subscription arrives, in a task that can run after the publish)
            served = pubsubs[0].sent["publish:messages"]

            # b asks for it by its id, as a js-libp2p peer does: a sends it (b drops the copy)
            await routers[1].emit_iwant(window, a.get_id())
            while pubsubs[0].sent["publish:messages"] < served + 1:
                await trio.sleep(0.01)
        assert got == [b"hello"]


async def test_copies_of_a_handled_message_are_dropped_where_they_are_read() -> None:
    """Every mesh peer forwards each message, so a node reads most messages several times (4.6
    copies each with 30 companions); py-libp2p started a task per copy only to find it seen. A
    copy is dropped as it is read; a new message still goes through."""
    async with two_nodes() as ((a, b), routers, pubsubs, got):
        handled: list[bytes] = []
        push_msg = pubsubs[1].push_msg

        async def counting_push_msg(forwarder: ID, msg: rpc_pb2.Message) -> None:
            handled.append(bytes(msg.data))
            await push_msg(forwarder, msg)

        pubsubs[1].push_msg = counting_push_msg  # type: ignore[method-assign,assignment]
        with trio.fail_after(10):
            message = await hello_from_a((a, b), routers, pubsubs, got)
            stream = pubsubs[0].peers[b.get_id()]
            for _ in range(50):  # a replaying peer, or fifty mesh peers
                assert await pubsubs[0].write_msg(stream, rpc_pb2.RPC(publish=[message]))
            await pubsubs[0].publish("messages", b"again")
            while got != [b"hello", b"again"]:
                await trio.sleep(0.01)
        assert handled == [b"hello", b"again"]


async def test_no_message_is_held_for_a_peer_that_said_what_it_subscribes_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """py-libp2p held every message for every connected peer not on its topic, for 30 s, and
    warned on each one past 100 (as a node does for an aikyo peer, which never joins the
    presence topic, or a client on ``messages`` alone). ``b`` is on ``messages`` only; ``a``
    publishes 150 messages on ``states``: nothing is held for ``b`` and nothing is said, and
    ``messages`` still reach ``b``."""
    async with two_nodes() as ((a, b), routers, pubsubs, got):
        await a.connect(PeerInfo(b.get_id(), b.get_addrs()))
        with trio.fail_after(10):
            while b.get_id() not in pubsubs[0].peer_topics.get("messages", ()):
                await trio.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="libp2p.pubsub.gossipsub"):
            for n in range(150):
                await pubsubs[0].publish("states", b"s%d" % n)
        assert b.get_id() not in routers[0]._pending_messages
        assert not [r for r in caplog.records if "pending message queue" in r.getMessage()]
        await pubsubs[0].publish("messages", b"hello")
        with trio.fail_after(10):
            while got != [b"hello"]:
                await trio.sleep(0.01)


def test_a_peer_that_announced_nothing_yet_is_still_held_for() -> None:
    """The queue's purpose stays: between a connection and the peer's first subscriptions,
    what is published waits for it (py-libp2p hands it over when the peer subscribes)."""
    told: set[ID] = set()
    queues = HelloAwareQueues(lambda peer: peer in told)
    early, known = ID(b"early"), ID(b"known")
    told.add(known)
    queues[early].append((0.0, rpc_pb2.RPC()))
    queues[known].append((0.0, rpc_pb2.RPC()))
    assert list(queues) == [early] and len(queues[early]) == 1
