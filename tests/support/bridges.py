"""A bridge on an in-memory network: what every bridge, WebRTC, listen and browser test that needs
no libp2p starts from; and a WebSocket client that never reads, for any bridge."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from companion.bridge import Bridge, BridgeConfig
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import Metadata


@dataclass(frozen=True)
class HubBridge:
    hub: MemoryHub
    bridge: Bridge
    node: MemoryEndpoint
    """The bridge's node (endpoint ``bridge``): what it publishes comes back to it (the echo rule)."""
    companion: MemoryEndpoint
    """Endpoint ``companion``: stands for the network; what it publishes reaches the bridge, and
    the other way round."""


def bridge_on_hub(
    nursery: trio.Nursery, directory: Mapping[str, Metadata] | None = None, **config: Any
) -> HubBridge:
    """A bridge (``BridgeConfig(port=0, **config)``) whose node is the endpoint ``bridge`` of a new
    :class:`MemoryHub`, handed everything that node receives until ``nursery`` ends. Serving it
    is the caller's: ``port = await nursery.start(hub_bridge.bridge.serve)``."""
    hub = MemoryHub()
    node, companion = hub.endpoint("bridge"), hub.endpoint("companion")
    bridge = Bridge(node, directory=directory, config=BridgeConfig(**{"port": 0, **config}))
    nursery.start_soon(bridge.pump, node.receive_channel)
    return HubBridge(hub, bridge, node, companion)


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


async def serve_until_cancelled(nursery: trio.Nursery, bridge: Bridge) -> tuple[int, trio.CancelScope]:
    """``bridge`` serving in ``nursery``: its port, and the scope that stops it (a bridge that
    goes away while its clients stay)."""
    scope = trio.CancelScope()

    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await bridge.serve(task_status=task_status)

    port: int = await nursery.start(serve)
    return port, scope


async def http_exchange(port: int, request: bytes, timeout: float) -> tuple[bytes, bytes]:
    """``request`` sent as it is to 127.0.0.1:``port``, the answer read until the server closes
    (within ``timeout``): its head and its body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    data = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body
