"""A bare py-libp2p gossipsub peer for integration tests: strict signing, no validators, so it
publishes any bytes it is told to, and writes any bytes on any stream. It may claim a companion
id over the metadata protocol, or answer metadata and identify requests with garbage.

``python -m support.raw_publisher [--companion ID] [--metadata-b64 DATA] [--identify-b64 DATA]``

Commands on stdin, one JSON object per line (``"b64"`` may be ``"text"`` for UTF-8 data):

- ``{"op": "connect", "addr": MULTIADDR}``
- ``{"op": "publish", "topic": T, "b64": DATA, "keep": NAME?, "ack": bool?}``: publish (signed);
  ``keep`` remembers the signed message under ``NAME`` for ``resend``.
- ``{"op": "pace", "seconds": S}``: the pause after every publish (default 5 ms).
- ``{"op": "flood", "topic": T, "rate": R, "count": N, "size": BYTES, "to": [IDS]}``: ``N``
  well-formed ``message.send`` envelopes from our companion id, ``BYTES`` long, at ``R`` per second
  (slower if the receiver reads slower: never more than py-libp2p's send queue holds).
- ``{"op": "resend", "name": NAME}``: write the kept message again, byte for byte (same
  signature and seqno: a replay), in a fresh RPC on a fresh pubsub stream to every peer.
- ``{"op": "rpc", "b64": DATA, "frame": bool}``: write bytes on a fresh pubsub stream to every
  peer (``frame``: with a varint length prefix, as RPCs travel).
- ``{"op": "interleave", "size": BYTES}``: two signed RPCs of ``BYTES`` each, written to a fresh
  pubsub stream with their halves interleaved (what two unserialized writers produce when the
  Yamux send window runs out).
- ``{"op": "stream", "protocol": P, "b64": DATA}``: open a stream to every peer on protocol
  ``P``, write the bytes, read the answer (bounded), reset.

- ``{"op": "forge", "type": T, "answer": A}``: answer every query of type ``T`` it hears at once
  with a QueryResult of the fields ``A`` (``{"result": {"success": ..., "body": ...}}`` or
  ``{"error": TEXT}``).

Events on stdout, one JSON object per line: ``started`` (peer_id, addrs), ``connected``,
``published`` (count), ``flooded`` (count), ``sent`` (op, peers), ``message`` (topic, from_peer,
text: what others published on ``messages``), ``forging`` (type), ``forged`` (query id), ``error``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils import encode_varint_prefixed
from multiaddr import Multiaddr

from companion.log import configure_logging
from companion.node.config import GOSSIP_V11, NodeConfig, make_gossipsub, make_host
from companion.node.discovery import parse_peer_addr
from companion.node.drops import DropCounters
from companion.node.metadata import METADATA_PROTOCOL, encode_metadata
from companion.node.pubsub import GuardedPubsub
from companion.protocol import MESSAGES, QUERIES, TOPICS, Message, Metadata, encode
from support.commands import emit, serve_commands

IDENTIFY_PROTOCOL = TProtocol("/ipfs/id/1.0.0")
SCRATCH_TOPIC = "raw-scratch"
"""Messages made only to be written by hand (``interleave``) go to a topic nobody subscribes."""
READ_AT_MOST = 0.2
"""Seconds a peer is given to read bytes written on a stream before the stream is reset, unless
it ends the stream first."""


class RecordingPubsub(GuardedPubsub):
    """Remembers the last message this peer signed, so it can be written again by hand. It is
    the node's own pubsub otherwise (no validators): whole RPC writes and streams that recover,
    so that a long attack under load measures the target, not py-libp2p's sender."""

    last_own: rpc_pb2.Message | None = None

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        if msg_forwarder == self.my_id:
            self.last_own = msg
        await super().push_msg(msg_forwarder, msg)


class Raw:
    def __init__(self, host: Any, pubsub: RecordingPubsub, companion: str | None) -> None:
        self.host = host
        self.pubsub = pubsub
        self.companion = companion or "companion_raw"
        self.kept: dict[str, rpc_pb2.Message] = {}
        self.forgeries: dict[str, dict[str, Any]] = {}
        self.published = 0
        self.pace = 0.005

    def peers(self) -> list[ID]:
        return list(self.host.get_network().connections)

    async def publish(self, topic: str, data: bytes) -> rpc_pb2.Message:
        """Publish, first waiting (bounded) while a send queue is half full, as the node does:
        offer no more than goes out (what the receiver refuses is its business)."""
        await self.pubsub.wait_for_room(NodeConfig().outbound_queue_size // 2, 10.0)
        await self.pubsub.publish(topic, data)
        self.published += 1
        assert self.pubsub.last_own is not None
        return self.pubsub.last_own

    async def write_everywhere(self, protocol: TProtocol, data: bytes, *, answer: bool = False) -> int:
        """Open a stream to every connected peer, write ``data``, optionally read, then reset."""
        done = 0
        for peer in self.peers():
            with trio.move_on_after(5):
                try:
                    stream = await self.host.new_stream(peer, [protocol])
                except Exception as exc:
                    emit("error", op="new_stream", error=repr(exc)[:300])
                    continue
                try:
                    await stream.write(data)
                    if answer:
                        with trio.move_on_after(2):
                            await stream.read(65536)
                    await self.until_peer_ends(stream, READ_AT_MOST)
                    done += 1
                except Exception as exc:
                    emit("error", op="write", error=repr(exc)[:300])
                finally:
                    with trio.move_on_after(1):
                        with contextlib.suppress(Exception):
                            await stream.reset()
        return done

    @staticmethod
    async def until_peer_ends(stream: Any, timeout: float) -> None:
        """Let the peer read what was written before the reset: until it resets or closes its
        side (it read the bytes and refused them: a tenth of the fuzzed RPCs, milliseconds
        instead of the whole wait), at most ``timeout`` seconds (the rest it reads and keeps
        the stream open, waiting for more)."""
        with trio.move_on_after(timeout):
            try:
                while await stream.read(65536):
                    pass  # the peer writes nothing here; anything it does is read and ignored
            except Exception:
                return  # reset by the peer: it read them

    async def flood(self, topic: str, rate: float, count: int, size: int, to: list[str]) -> None:
        start = trio.current_time()
        for n in range(count):
            await trio.sleep_until(start + n / rate)
            head = Message.create(self.companion, to, "", id=f"flood-{n}")
            filler = "x" * max(0, size - len(encode(head)))
            await self.publish(topic, encode(Message.create(self.companion, to, filler, id=f"flood-{n}")))
        emit("flooded", count=count, seconds=round(trio.current_time() - start, 2))

    async def run(self, command: dict[str, Any]) -> None:
        op = command["op"]
        data = b""
        if "b64" in command:
            data = base64.b64decode(command["b64"])
        elif "text" in command:
            data = command["text"].encode()
        protocol = GOSSIP_V11[0]
        if op == "connect":
            with trio.fail_after(10):
                await self.host.connect(parse_peer_addr(command["addr"]))
            emit("connected", addr=command["addr"])
        elif op == "pace":
            self.pace = float(command["seconds"])
        elif op == "forge":
            self.forgeries[command["type"]] = command["answer"]
            emit("forging", type=command["type"])
        elif op == "publish":
            msg = await self.publish(command["topic"], data)
            if command.get("keep"):
                self.kept[command["keep"]] = msg
            await trio.sleep(self.pace)
            if command.get("ack"):
                emit("published", count=self.published)
        elif op == "flood":
            to = list(command.get("to", []))
            await self.flood(
                command.get("topic", MESSAGES), command["rate"], command["count"], command["size"], to
            )
        elif op == "resend":
            rpc = rpc_pb2.RPC(publish=[self.kept[command["name"]]])
            peers = await self.write_everywhere(protocol, encode_varint_prefixed(rpc.SerializeToString()))
            emit("sent", op=op, peers=peers)
        elif op == "rpc":
            framed = encode_varint_prefixed(data) if command.get("frame", True) else data
            emit("sent", op=op, peers=await self.write_everywhere(protocol, framed))
        elif op == "interleave":
            halves = []
            for n in range(2):
                msg = await self.publish(SCRATCH_TOPIC, bytes([65 + n]) * int(command["size"]))
                halves.append(encode_varint_prefixed(rpc_pb2.RPC(publish=[msg]).SerializeToString()))
            a, b = halves
            cut = len(a) // 2
            mixed = a[:cut] + b[:cut] + a[cut:] + b[cut:]
            emit("sent", op=op, peers=await self.write_everywhere(protocol, mixed))
        elif op == "garble":  # garbage on this peer's own pubsub stream to each peer
            for stream in list(self.pubsub.peers.values()):
                await stream.write(encode_varint_prefixed(data))
            emit("sent", op=op, peers=len(self.pubsub.peers))
        elif op == "stream":
            peers = await self.write_everywhere(TProtocol(command["protocol"]), data, answer=True)
            emit("sent", op=op, peers=peers)
        else:
            emit("error", op=op, error="unknown op")


async def main(companion: str | None, metadata_answer: bytes | None, identify_answer: bytes | None) -> None:
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",))
    host = make_host(config, create_new_key_pair())
    router = make_gossipsub(config)
    me: list[ID] = []

    queries_send, queries = trio.open_memory_channel[bytes](1024)

    def deliver(topic: str, msg: rpc_pb2.Message) -> None:
        if topic == QUERIES and ID(msg.from_id) not in me:
            with contextlib.suppress(trio.WouldBlock):
                queries_send.send_nowait(bytes(msg.data))
        if topic == MESSAGES and ID(msg.from_id) not in me:
            text = msg.data.decode("utf-8", "replace")
            emit("message", topic=topic, from_peer=ID(msg.from_id).to_base58(), text=text[:4000])

    pubsub = RecordingPubsub(
        host,
        router,
        drops=DropCounters(trio.current_time, node="raw"),
        deliver=deliver,
        outbound_queue_size=config.outbound_queue_size,
        strict_signing=True,
    )
    me.append(host.get_id())
    raw = Raw(host, pubsub, companion)
    if companion is not None or metadata_answer is not None:
        answer = metadata_answer
        if answer is None:
            assert companion is not None
            metadata = Metadata(id=companion, name=companion, personality="raw", story="raw", sample="raw")
            answer = encode_metadata(metadata)

        async def serve(stream: Any) -> None:
            await stream.write(answer)
            await stream.close()

        host.set_stream_handler(METADATA_PROTOCOL, serve)
    if identify_answer is not None:

        async def identify(stream: Any) -> None:
            await stream.write(identify_answer)
            await stream.close()

        host.set_stream_handler(IDENTIFY_PROTOCOL, identify)
    async with (
        host.run(listen_addrs=[Multiaddr(a) for a in config.listen]),
        background_trio_service(pubsub),
        background_trio_service(router),
    ):
        await pubsub.wait_until_ready()
        for topic in TOPICS:  # what others publish comes through ``deliver``
            await pubsub.subscribe(topic)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forge_answers, raw, queries)
            emit("started", peer_id=str(host.get_id()), addrs=[str(a) for a in host.get_addrs()])
            await serve_commands(raw.run)
            with trio.move_on_after(5):
                await host.close()
            nursery.cancel_scope.cancel()


async def forge_answers(raw: Raw, queries: trio.MemoryReceiveChannel[bytes]) -> None:
    """Answer every query of a forged type the moment it arrives, before any honest client."""
    async for data in queries:
        try:
            query = json.loads(data)
            forged = raw.forgeries.get(query.get("params", {}).get("type")) if query.get("method") else None
        except (ValueError, AttributeError):
            continue
        if forged is None:
            continue
        answer = {"jsonrpc": "2.0", "id": query["id"], **forged}
        await raw.pubsub.publish(QUERIES, json.dumps(answer).encode())
        emit("forged", id=query["id"], type=query["params"]["type"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--companion", default=None)
    parser.add_argument("--metadata-b64", default=None, help="answer metadata requests with these bytes")
    parser.add_argument("--identify-b64", default=None, help="answer identify requests with these bytes")
    args = parser.parse_args()
    configure_logging("WARNING")
    trio.run(
        main,
        args.companion,
        None if args.metadata_b64 is None else base64.b64decode(args.metadata_b64),
        None if args.identify_b64 is None else base64.b64decode(args.identify_b64),
    )
