"""Bridge processes and Firehose clients for integration tests (everything on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from network_support import Event, Network, Proc
from trio_websocket import WebSocketConnection

T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking helper (process start, event wait) without stalling the trio loop."""
    return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def start_bridge(
    net: Network, name: str, *peers: str, extra: tuple[str, ...] = ()
) -> tuple[Proc, int, Event]:
    """``companion bridge`` on 127.0.0.1 (WebSocket on a free port); returns (process, ws port,
    its node's ``started`` event)."""
    argv = [
        sys.executable,
        "-m",
        "companion",
        "bridge",
        "--ws",
        "127.0.0.1:0",
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(net.tmp / f"data-{name}"),
        "--log-format",
        "json",
        *extra,
    ]
    for peer in peers:
        argv += ["--peer", peer]
    proc = Proc(name, argv)
    net.procs.append(proc)
    started = proc.event("started", 30)
    listening = proc.event("bridge_listening", 30)
    return proc, int(listening["port"]), started


def message_frame(
    sender: str, to: list[str], text: str, msg_id: str, metadata: dict[str, Any] | None = None
) -> str:
    params: dict[str, Any] = {"id": msg_id, "from": sender, "to": to, "message": text}
    if metadata is not None:
        params["metadata"] = metadata
    return json.dumps(
        {"topic": "messages", "body": {"jsonrpc": "2.0", "method": "message.send", "params": params}}
    )


async def next_frame(ws: WebSocketConnection, predicate: Callable[[Any], bool], timeout: float) -> Any:
    """The next frame (decoded) that satisfies ``predicate``; others are skipped."""
    with trio.fail_after(timeout):
        while True:
            frame = json.loads(await ws.get_message())
            if predicate(frame):
                return frame


async def silent_client(port: int) -> trio.SocketStream:
    """A WebSocket client that completes the handshake and then never reads (tiny receive buffer)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    await stream.send_all(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return stream
