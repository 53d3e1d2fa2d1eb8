"""py-libp2p's pubsub and gossipsub with their edges made safe, by subclassing (py-libp2p 0.8.1).

What py-libp2p does, measured, and what these subclasses change:

- An RPC that does not decode (``DecodeError`` from ``ParseFromString`` in
  ``continuously_read_stream``) escapes the pubsub service and ends the whole node. Here any
  failure while reading a peer's RPC stream resets that one stream and counts ``malformed_rpc``;
  the node goes on.
- Several tasks write RPCs to one peer stream (the per-peer send queue, the flush of messages
  held for a peer whose subscriptions were pending, the replay of the message cache to a peer
  that subscribed late), and Yamux takes its write lock per frame, not per RPC: when the send
  window runs out, two RPCs interleave and the receiver cannot decode either. Here whole RPC
  writes are serialized per stream, and a stream whose write failed half-way is reset at once
  (never followed by another RPC's bytes).
- A message whose signature does not verify is dropped with a debug line only; here it is
  counted (``bad_signature``).
- Delivered messages wait in a 32-slot channel per subscription that drops silently when full;
  here they go straight to the node (``deliver``), whose own bounded channel counts overflows.
- The per-peer send queue holds 32 RPCs and drops the rest with a debug line; here it holds
  ``outbound_queue_size``, the node's own publishes wait (bounded) while it is half full
  (:meth:`GuardedPubsub.wait_for_room`), and every payload py-libp2p drops is counted
  (``outbound_queue_full``, ``outbound_oversized``, ``equivocation``).
- When a write to a peer fails, py-libp2p forgets the subscriptions the peer announced on its
  own (still working) stream, and never hears them again: here they are kept while the peer
  stays connected (:class:`SubscriptionKeepingPubsub`).
- Every RPC py-libp2p sends carries the node's signed peer record (``senderRecord``), and every
  py-libp2p receiver verifies its signature again (``maybe_consume_signed_record``): with a
  message a node sends or forwards, that was ~9 % of a receiving node's CPU in a 10-node mesh at
  20 msg/s (py-spy), for a record that never changed. Here it goes on the first RPC of each
  stream and again only when it changed (:meth:`GuardedPubsub.write_msg`); go-libp2p and
  js-libp2p send none on ordinary RPCs, and identify still carries it.
- A message a topic validator refuses is not marked seen, so every copy of it (one per mesh
  peer, and those IWANT fetches) has its signature verified and its payload parsed and refused
  again. Here it is marked seen once its signature verified, as go-libp2p does.
- A node's own messages go to its mesh peers only, so those published while the mesh is empty
  (a PRUNE and its backoff) reach nobody. Here they go to every peer on the topic, as
  go-libp2p's and js-libp2p's ``floodPublish`` does.
- The per-peer send loop writes one RPC per write: a Yamux frame, a Noise frame and a
  ``send()`` each, and as many reads on the peer. With 30 companions on 2 cores the send calls
  alone were 12 % of a node's CPU while they talked, with the send queues full. Here the loop
  takes what the queue holds (up to :data:`BATCH_BYTES`) and writes those RPCs, each with its
  own length prefix, in one write (:meth:`GuardedPubsub.handle_sending_messages`): the bytes on
  the stream are the same, only fewer frames carry them, and an idle queue still sends each
  RPC at once.
- Gossipsub's message cache keys messages by py-libp2p's default id (``from ‖ seqno``) whatever
  id function the pubsub was given, while the seen cache uses that function (ours computes
  js-libp2p's id, :mod:`.msgid`). The ids a node gossips (IHAVE) were therefore never the ones
  its peers had marked seen: nearly every IHAVE drew an IWANT and a full copy of a message the
  peer already had (30 companions: 4,946 IWANTs for 5,888 IHAVEs, and each node read each
  message 8.0 times), and the IWANTs of js-libp2p peers, which name messages by the js id, were
  never served. Here the cache uses the pubsub's own id function (:class:`KeyedMessageCache`):
  494 IWANTs for 5,549 IHAVEs, 4.6 reads of each message.
- Each copy of a message (one from most mesh peers) got a task of py-libp2p's service manager
  only for ``push_msg`` to find it seen; here copies are dropped where the RPC is read
  (:meth:`GuardedPubsub._is_subscribed_to_msg`).
- A copy of every message was held (30 s, 100 per peer, a WARNING for each one past that) for
  every connected peer not on its topic, for the whole connection; here only for a peer that
  has announced no subscription yet (:class:`HelloAwareQueues`).
- Sequence numbers start at the clock in nanoseconds instead of seconds, so a restarted node
  (same key) never reuses the seqnos, and therefore the message ids, of its previous run: peers
  would otherwise drop its new messages as replays or as equivocation.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeAlias
from weakref import WeakKeyDictionary, WeakSet

import trio
from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamClosed, StreamError, StreamReset
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.mcache import CacheEntry, MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.pubsub.validators import signature_validator
from libp2p.utils import encode_varint_prefixed

from companion.log import bound, log_event
from companion.node.drops import Drop, DropCounters

__all__ = [
    "CountingGossipSub",
    "GuardedPubsub",
    "HelloAwareQueues",
    "KeyedMessageCache",
    "SubscriptionKeepingPubsub",
    "reset_quietly",
]

logger = logging.getLogger("companion.node.pubsub")

Deliver = Callable[[str, rpc_pb2.Message], None]
"""``(topic, message)``: a validated message for one of our topics, called synchronously."""
Unsent = Callable[[rpc_pb2.Message], None]
"""Told of each message a failed write to a peer took with it (``send_failed``), synchronously."""

BATCH_BYTES: Final = 32 * 1024
"""The most bytes of queued RPCs one write carries (one RPC larger than this goes alone): well
within one Noise frame (65,519 bytes of plaintext), so a batch is one frame on the wire."""


def _topic_of(msg: rpc_pb2.Message) -> str:
    return ",".join(msg.topicIDs) if msg.topicIDs else "?"


class KeyedMessageCache(MessageCache):
    """Gossipsub's message cache, keyed by the pubsub's message id function rather than by
    py-libp2p's ``from ‖ seqno`` (see the module docstring): the ids it gossips and serves are
    the ones the seen cache, IWANT and js-libp2p peers use."""

    def __init__(
        self, window_size: int, history_size: int, message_id: Callable[[rpc_pb2.Message], bytes]
    ) -> None:
        super().__init__(window_size, history_size)
        self._message_id = message_id

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = self._message_id(msg)
        if mid in self.msgs:
            return
        self.msgs[mid] = msg
        self.history[0].append(CacheEntry(mid, msg.topicIDs))

    def forget(self, mids: Iterable[bytes]) -> int:
        """Remove the messages ``mids`` names from the cache and its history, so they are
        neither gossiped (IHAVE), served (IWANT) nor replayed to a peer that subscribes; how
        many went."""
        gone = {mid for mid in mids if self.msgs.pop(mid, None) is not None}
        if gone:
            for entries in self.history:
                entries[:] = [entry for entry in entries if entry.mid not in gone]
        return len(gone)


Pending: TypeAlias = list[tuple[float, rpc_pb2.RPC]]


class HelloAwareQueues(dict[ID, Pending]):
    """Gossipsub's per-peer queue of messages held until a peer subscribes, kept only for peers
    that have announced no subscription yet.

    py-libp2p 0.8.1's ``GossipSub.publish`` holds a copy of *every* message it sends or forwards
    for *every* connected peer that is not on the message's topic (up to 100 per peer, 30 s),
    and hands them over when the peer subscribes to a topic: meant for the moments between a
    connection and the peer's first RPC (its subscriptions), it goes on for the whole
    connection. So an aikyo node, which never subscribes to the presence topic, or a client on
    fewer topics than a companion, had a list rebuilt on every message and, past 100 in 30 s
    (10 companions talking to a client on ``messages`` alone: 26 s), a WARNING per message
    ("pending message queue for peer ... exceeded limit"). A peer that announced its
    subscriptions said what it wants, as go-libp2p and js-libp2p take it (they hold nothing);
    a topic it joins later still gets gossipsub's replay of the recent messages. The table
    stands in for py-libp2p's; a queue asked for such a peer is a throwaway list."""

    def __init__(self, announced: Callable[[ID], bool]) -> None:
        super().__init__()
        self._announced = announced

    def __missing__(self, peer: ID) -> Pending:
        queue: Pending = []
        if not self._announced(peer):
            self[peer] = queue
        return queue


class CountingGossipSub(GossipSub):
    """GossipSub that counts the payloads it drops instead of only logging them at debug level,
    and the mesh changes peers ask for (``control``: GRAFTs and PRUNEs received; a mesh that
    keeps churning shows here)."""

    drops: DropCounters | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control: Counter[str] = Counter()

    def attach(self, pubsub: Pubsub) -> None:
        """The pubsub attaches its router as it is built, before any message: from then on the
        message cache names messages by the pubsub's id (:class:`KeyedMessageCache`)."""
        super().attach(pubsub)
        self.mcache = KeyedMessageCache(
            self.mcache.window_size, self.mcache.history_size, pubsub.get_message_id
        )
        pending = HelloAwareQueues(lambda peer: any(peer in peers for peers in pubsub.peer_topics.values()))
        pending.update(self._pending_messages)
        self._pending_messages = pending  # type: ignore[assignment]  # a dict, as py-libp2p uses it

    def _get_peers_to_send(
        self, topic_ids: Any, msg_forwarder: ID, origin: ID, msg_id: bytes | None = None
    ) -> set[ID]:
        """Flood publishing, as go-libp2p and js-libp2p do by default (``floodPublish``): this
        node's own messages go to every peer subscribed to the topic, not only to its mesh
        peers. py-libp2p 0.8.1 sends them to the mesh alone, and in a small network the mesh
        can be empty while peers are there: after a peer PRUNEd us, until a heartbeat after its
        backoff grafts it again; a reply published then reached nobody. Forwarded
        messages still go to the mesh only; the connection bound keeps the fan-out of one's
        own messages small."""
        peers = set(super()._get_peers_to_send(topic_ids, msg_forwarder, origin, msg_id))
        pubsub = self.pubsub
        if pubsub is None or origin != pubsub.my_id or msg_forwarder != origin:
            return peers
        for topic in topic_ids:
            peers.update(p for p in pubsub.peer_topics.get(topic, ()) if p != origin)
        return peers

    def _perform_opportunistic_grafting(self, topic: str, peers_to_graft: Any) -> int:
        """Off. It is meant for meshes of scored peers; with no peer scoring configured (every
        score 0) py-libp2p 0.8.1 grafts every peer outside the mesh on every heartbeat, past
        D_high, and the next heartbeat prunes them again: 178 PRUNEs per node per minute in an
        idle 10-node network (measured), and most of its idle CPU."""
        return 0

    async def handle_graft(self, graft_msg: rpc_pb2.ControlGraft, sender_peer_id: ID) -> None:
        self.control["graft_received"] += 1
        await super().handle_graft(graft_msg, sender_peer_id)

    async def handle_prune(self, prune_msg: rpc_pb2.ControlPrune, sender_peer_id: ID) -> None:
        self.control["prune_received"] += 1
        await super().handle_prune(prune_msg, sender_peer_id)

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        if self.drops is not None:
            label = "outbound_queue_full" if reason == "queue_full" else "outbound_oversized"
            for msg in rpc.publish:
                self.drops.record(
                    Drop(label, f"py-libp2p dropped an RPC to this peer ({reason})"),
                    peer=str(peer_id),
                    topic=_topic_of(msg),
                )
        super()._handle_dropped_rpc(peer_id, rpc, reason)

    def _check_equivocation(self, msg: rpc_pb2.Message) -> bool:
        ok = super()._check_equivocation(msg)
        if not ok and self.drops is not None:
            self.drops.record(
                Drop("equivocation", "same signer and seqno as an earlier message, other content"),
                peer=ID(msg.from_id).to_base58() if msg.from_id else "?",
                topic=_topic_of(msg),
            )
        return ok


class SubscriptionKeepingPubsub(Pubsub):
    """Pubsub that remembers a peer's subscriptions when only our stream to it failed.

    py-libp2p forgets them whenever a write to the peer fails (e.g. its Yamux window stayed
    shut for 5 s while it was busy) and opens a new stream; but the subscriptions came on the
    peer's own stream, which still works, and nothing announces them again: we would never send
    the peer a message again while the connection lasts (measured under load: a peer that stops
    hearing anything). Forgotten they are only once the peer is gone."""

    def _handle_dead_peer(self, peer_id: ID) -> None:
        kept = (
            [topic for topic, peers in self.peer_topics.items() if peer_id in peers]
            if self._peer_is_connected(peer_id)
            else []
        )
        count = self._peer_subscription_count.get(peer_id)
        super()._handle_dead_peer(peer_id)
        for topic in kept:
            self.peer_topics.setdefault(topic, set()).add(peer_id)
        if kept and count is not None:
            self._peer_subscription_count[peer_id] = count


class GuardedPubsub(SubscriptionKeepingPubsub):
    """Pubsub that survives any bytes a peer sends and loses nothing without counting it."""

    def __init__(
        self,
        host: Any,
        router: GossipSub,
        *,
        drops: DropCounters,
        deliver: Deliver,
        outbound_queue_size: int,
        unsent: Unsent | None = None,
        **options: Any,
    ) -> None:
        super().__init__(host, router, **options)
        self.counter = time.time_ns()  # the seqno counter (see the module docstring)
        self._drops = drops
        self._deliver = deliver
        self._unsent = unsent
        """The node's say in a lost message: its own presence announcement is made again."""
        self._outbound_queue_size = outbound_queue_size
        self._write_locks: WeakKeyDictionary[INetStream, trio.Lock] = WeakKeyDictionary()
        self.sent: Counter[str] = Counter()
        """What this node wrote to its peers: ``rpcs``, ``writes`` (each one a frame and a send,
        carrying one RPC or a batch of queued ones), and what they carried (``publish:<topic>``
        messages, ``ihave``/``iwant``/``graft``/``prune`` control, ``subscriptions``). An idle
        network's CPU goes to these writes."""
        self._records_sent: WeakKeyDictionary[INetStream, bytes] = WeakKeyDictionary()
        self.refused_seen = 0
        """Messages a topic validator refused, remembered as seen (their copies are ignored)."""
        self.records_left_out = 0
        """RPCs sent without the signed peer record the stream already carried."""
        self._broken: WeakSet[INetStream] = WeakSet()
        self._written = trio.Event()
        self._readers: set[trio.lowlevel.Task] = set()
        self._validating: set[trio.lowlevel.Task] = set()
        if isinstance(router, CountingGossipSub):
            router.drops = drops

    # --- reading --------------------------------------------------------------------------

    async def stream_handler(self, stream: INetStream) -> None:
        """Read a peer's RPC stream until it ends; whatever goes wrong ends only this stream.

        Only the offending stream is reset: the peer's state (its subscriptions, our stream to
        it) stays, so a hostile extra stream cannot cut an honest one off, and a peer whose own
        stream broke opens a new one (py-libp2p and js-libp2p both do when a write fails)."""
        task = trio.lowlevel.current_task()
        self._readers.add(task)
        try:
            await self.continuously_read_stream(stream)
            return
        except Exception as exc:  # undecodable bytes, or py-libp2p choking on what they decoded to
            self._drops.record(
                Drop("malformed_rpc", f"RPC stream reset: {type(exc).__name__}: {exc}"),
                peer=str(stream.muxed_conn.peer_id),
                topic="*",
            )
        finally:
            self._readers.discard(task)
        await reset_quietly(stream)

    def _handle_dead_peer(self, peer_id: ID) -> None:
        if trio.lowlevel.current_task() in self._readers:
            # py-libp2p's reader calls this after resetting a stream that announced an RPC over
            # the size limit: forgetting the peer would cut off its other, honest stream (tasks
            # the reader spawned are not readers: their calls go through)
            self._drops.record(
                Drop("oversized_rpc", f"RPC stream reset: an RPC over {self.max_inbound_rpc_size} bytes"),
                peer=str(peer_id),
                topic="*",
            )
            return
        super()._handle_dead_peer(peer_id)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        """Each received message runs in its own task whose exception would stop the service
        (e.g. a bogus ``key`` makes the signature check raise): contain and count it.

        py-libp2p drops a message whose signature does not verify with a debug line only; a new
        message that never reached the validators is checked again here (only then, so an
        honest message is verified once) and counted as ``bad_signature``."""
        task = trio.lowlevel.current_task()
        fresh = not self._is_msg_seen(msg)
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:
            self._drops.record(
                Drop("malformed_rpc", repr(exc)), peer=str(msg_forwarder), topic=_topic_of(msg)
            )
            return
        finally:
            validated = task in self._validating
            self._validating.discard(task)
        if fresh and validated and not self._is_msg_seen(msg):
            # refused by a topic validator (ours: the edge, presence): remembered as seen, as
            # go-libp2p marks a message seen before validating it, so the copies every other
            # mesh peer and IWANT bring are dropped before their signature and JSON are
            # checked again (py-libp2p 0.8.1 marks only accepted ones, and re-validates and
            # counts every copy of a refused one). Only after the signature verified: a forged
            # copy of an honest message cannot get the honest one ignored.
            self._mark_msg_seen(msg)
            self.refused_seen += 1
        if fresh and not validated and self.strict_signing and not signature_validator(msg):
            self._drops.record(
                Drop("bad_signature", "a message whose signature does not verify (py-libp2p drops it)"),
                peer=str(msg_forwarder),
                topic=_topic_of(msg),
            )

    async def validate_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        self._validating.add(trio.lowlevel.current_task())  # the signature verified (push_msg)
        await super().validate_msg(msg_forwarder, msg)

    def _is_subscribed_to_msg(self, msg: rpc_pb2.Message) -> bool:
        """Whether the reader hands ``msg`` on (py-libp2p asks this of each message an RPC
        carries, before it starts a task to handle it): only one for our topics that is not a
        copy of a message already handled. A node hears each message from most of its mesh peers
        and py-libp2p started a task (its service manager's, with a name, a parent and stats) for
        every copy, only for :meth:`push_msg` to find it seen; here a copy is dropped where it is
        read (~90 us less per copy of a 300-byte message, a tenth of its cost written and read).
        What ``push_msg`` checks first (blacklists) only ever refuses, and a copy of a message
        still being validated goes through as before (it is not seen yet)."""
        return super()._is_subscribed_to_msg(msg) and not self._is_msg_seen(msg)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        for topic in publish_message.topicIDs:
            if topic not in self.topic_ids:
                continue
            try:
                self._deliver(topic, publish_message)
            except Exception as exc:  # a bug in delivery must not stop gossipsub's forwarding
                self._drops.record(Drop("internal_error", repr(exc)), peer="?", topic=topic)

    # --- writing --------------------------------------------------------------------------

    async def handle_sending_messages(self, peer_id: ID, stream: INetStream, queue: RpcQueue) -> None:
        """py-libp2p's per-peer send loop, writing what the queue holds together: wait for one
        RPC, take those queued behind it up to :data:`BATCH_BYTES`, write them at once (see the
        module docstring). Ends when the queue closes or a write fails, as py-libp2p's does."""
        try:
            while True:
                first = await queue.pop()
                if first is None:
                    return  # the queue closed: the peer is gone
                batch, size = [first], first.ByteSize()
                while size < BATCH_BYTES:
                    nxt = queue._queue.pop()  # what is already queued: never waits
                    if nxt is None:
                        break
                    more = nxt.ByteSize()
                    if size + more > BATCH_BYTES:
                        if not await self._write_rpcs(stream, batch):
                            return
                        batch, size = [], 0
                    batch.append(nxt)
                    size += more
                if not await self._write_rpcs(stream, batch):
                    return
        except Exception as exc:
            log_event(logger, "send_loop_failed", logging.DEBUG, peer=str(peer_id), error=repr(exc)[:200])
            self._handle_dead_peer(peer_id)

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        """One whole RPC (see :meth:`_write_rpcs`)."""
        return await self._write_rpcs(stream, [rpc_msg])

    async def _write_rpcs(self, stream: INetStream, rpcs: list[rpc_pb2.RPC]) -> bool:
        """Whole RPCs, in one write, one writer at a time per stream; a write that did not
        finish resets the stream.

        A failed write ends that stream for good: later writes to it return ``False`` at once
        (py-libp2p's loops go on writing to a stream that failed, and each failure used to tear
        down the peer's *new* stream too). If it was the peer's current stream, its send queue
        goes with it (those payloads are counted as ``send_failed``, with the ones being
        written) and py-libp2p opens a new stream while the peer stays connected."""
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            if stream in self._broken:
                return False
            peer: ID = stream.muxed_conn.peer_id
            current = self.peers.get(peer) is stream
            ok = False
            try:
                await stream.write(b"".join(encode_varint_prefixed(self._serialize(stream, r)) for r in rpcs))
                ok = True
                for rpc_msg in rpcs:
                    _count_sent(self.sent, rpc_msg)
                self.sent["writes"] += 1
            except (StreamClosed, StreamReset) as exc:
                log_event(logger, "rpc_write_failed", logging.DEBUG, peer=str(peer), error=repr(exc))
            finally:
                self._written.set()
                self._written = trio.Event()
                if not ok:
                    self._broken.add(stream)
                    queue = self.peer_queues.get(peer) if current else None
                    self._count_lost(peer, [*rpcs, *_queued(queue)])
                    await reset_quietly(stream)
                    if current and self.peers.get(peer) is stream:
                        self._handle_dead_peer(peer)
            return ok

    def _serialize(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bytes:
        """The RPC's bytes, without the signed peer record if this stream already carried the
        same one (see the module docstring). The RPC object is left as it was: py-libp2p may
        write the same one to other peers."""
        if not rpc_msg.HasField("senderRecord"):
            return bytes(rpc_msg.SerializeToString())
        record = rpc_msg.senderRecord
        if self._records_sent.get(stream) != record:
            self._records_sent[stream] = record
            return bytes(rpc_msg.SerializeToString())
        rpc_msg.ClearField("senderRecord")
        try:
            data = bytes(rpc_msg.SerializeToString())
        finally:
            rpc_msg.senderRecord = record
        self.records_left_out += 1
        return data

    def _count_lost(self, peer: ID, rpcs: list[rpc_pb2.RPC]) -> None:
        lost = [msg for rpc in rpcs for msg in rpc.publish]
        for msg in lost:
            self._drops.record(
                Drop("send_failed", f"the stream to this peer failed with {len(lost)} payloads unsent"),
                peer=str(peer),
                topic=_topic_of(msg),
            )
            if self._unsent is not None:
                self._unsent(msg)

    async def _handle_new_peer(self, peer_id: ID) -> None:
        try:
            await super()._handle_new_peer(peer_id)
        except StreamError as exc:
            if isinstance(exc, StreamClosed):
                raise
            # py-libp2p retries a registration that failed with StreamClosed while the peer stays
            # connected, and gives up for good on anything else (a reset hello stream, say)
            raise StreamClosed(f"pubsub stream to {peer_id} failed: {exc!r}") from exc
        queue = self.peer_queues.get(peer_id)
        if queue is not None:
            queue._queue.max_size = self._outbound_queue_size  # py-libp2p fixes it at 32

    def fullest_queue(self) -> int:
        """RPCs waiting in the fullest per-peer send queue."""
        return max((len(q) for q in self.peer_queues.values()), default=0)

    async def wait_for_room(self, limit: int, timeout: float) -> bool:
        """Wait until every per-peer send queue holds fewer than ``limit`` RPCs; ``False`` if
        ``timeout`` passed first (the caller publishes anyway; overflows are counted)."""
        with trio.move_on_after(timeout):
            while self.fullest_queue() >= limit:
                await self._written.wait()
            return True
        log_event(
            logger,
            "publish_backpressure_timeout",
            logging.WARNING,
            queued=self.fullest_queue(),
            limit=limit,
            waited=bound(timeout),
        )
        return False


def _queued(queue: RpcQueue | None) -> list[rpc_pb2.RPC]:
    """What a py-libp2p send queue still holds (it has no public way to say)."""
    if queue is None:
        return []
    inner = queue._queue
    return [*inner._priority, *inner._non_priority]


async def reset_quietly(stream: INetStream) -> None:
    """Reset ``stream`` within a second, shielded, whatever that raises (it is gone either way)."""
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        try:
            await stream.reset()
        except Exception as exc:
            log_event(logger, "stream_reset_failed", logging.DEBUG, error=repr(exc))


def _count_sent(sent: Counter[str], rpc: rpc_pb2.RPC) -> None:
    sent["rpcs"] += 1
    for msg in rpc.publish:
        sent[f"publish:{_topic_of(msg)}"] += 1
    sent["subscriptions"] += len(rpc.subscriptions)
    if rpc.HasField("control"):
        control = rpc.control
        for kind in ("ihave", "iwant", "graft", "prune", "idontwant"):
            sent[kind] += len(getattr(control, kind, ()))
