"""A bare py-libp2p gossipsub peer for integration tests: strict signing, no validators, so it
publishes any bytes it is told to. It may claim a companion id over the metadata protocol.

Commands on stdin, one JSON object per line:
``{"op": "connect", "addr": MULTIADDR}``, ``{"op": "publish", "topic": T, "b64": DATA}``
(``"text"`` instead of ``"b64"`` for UTF-8), ``{"op": "pace", "seconds": S}`` between publishes,
``{"op": "forge", "type": T, "answer": A}``: answer every query of type T it hears at once with
a QueryResult of the fields A (``{"result": {"success": ..., "body": ...}}`` or ``{"error": TEXT}``).
Events on stdout, one JSON object per line: ``started`` (peer_id, addrs), ``connected``,
``published`` (count), ``forged`` (query id), ``error``.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from companion.log import configure_logging
from companion.node.config import NodeConfig, make_gossipsub, make_host
from companion.node.discovery import parse_peer_addr
from companion.node.metadata import METADATA_PROTOCOL, encode_metadata
from companion.protocol import TOPICS, Metadata


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main(companion: str | None) -> None:
    config = NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",))
    host = make_host(config, create_new_key_pair())
    router = make_gossipsub(config)
    pubsub = Pubsub(host, router, strict_signing=True)
    if companion is not None:
        metadata = Metadata(id=companion, name=companion, personality="raw", story="raw", sample="raw")

        async def serve(stream: Any) -> None:
            await stream.write(encode_metadata(metadata))
            await stream.close()

        host.set_stream_handler(METADATA_PROTOCOL, serve)
    async with (
        host.run(listen_addrs=[Multiaddr(a) for a in config.listen]),
        background_trio_service(pubsub),
        background_trio_service(router),
    ):
        await pubsub.wait_until_ready()
        async with trio.open_nursery() as nursery:
            forgeries: dict[str, dict[str, Any]] = {}
            for topic in TOPICS:
                sub = await pubsub.subscribe(topic)
                if topic == "queries":
                    nursery.start_soon(forge_answers, sub, pubsub, forgeries)
                else:
                    nursery.start_soon(drain, sub)
            emit("started", peer_id=str(host.get_id()), addrs=[str(a) for a in host.get_addrs()])
            await commands(host, pubsub, forgeries)
            with trio.move_on_after(5):
                await host.close()
            nursery.cancel_scope.cancel()


async def drain(sub: Any) -> None:
    while True:
        await sub.get()


async def forge_answers(sub: Any, pubsub: Any, forgeries: dict[str, dict[str, Any]]) -> None:
    """Answer every query of a forged type the moment it arrives, before any honest client."""
    while True:
        msg = await sub.get()
        try:
            query = json.loads(msg.data)
            forged = forgeries.get(query.get("params", {}).get("type")) if query.get("method") else None
        except (ValueError, AttributeError):
            continue
        if forged is None:
            continue
        answer = {"jsonrpc": "2.0", "id": query["id"], **forged}
        await pubsub.publish("queries", json.dumps(answer).encode())
        emit("forged", id=query["id"], type=query["params"]["type"])


async def commands(host: Any, pubsub: Any, forgeries: dict[str, dict[str, Any]]) -> None:
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    buffer = b""
    pace = 0.005
    published = 0
    while True:
        chunk = await stdin.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            command = json.loads(line)
            op = command["op"]
            try:
                if op == "connect":
                    with trio.fail_after(10):
                        await host.connect(parse_peer_addr(command["addr"]))
                    emit("connected", addr=command["addr"])
                elif op == "pace":
                    pace = float(command["seconds"])
                elif op == "forge":
                    forgeries[command["type"]] = command["answer"]
                    emit("forging", type=command["type"])
                elif op == "publish":
                    data = base64.b64decode(command["b64"]) if "b64" in command else command["text"].encode()
                    await pubsub.publish(command["topic"], data)
                    published += 1
                    await trio.sleep(pace)
                    if command.get("ack"):
                        emit("published", count=published)
            except Exception as exc:
                emit("error", op=op, error=repr(exc))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--companion", default=None)
    configure_logging("WARNING")
    trio.run(main, parser.parse_args().companion)
