"""Bridge processes and Firehose clients for integration tests (everything on 127.0.0.1, or
inside a network namespace the test created).

Run as a script (``python -m support.live_bridge probe HOST PORT TOKEN``), it is a client that
tries the bridge with and without the token and prints what it got as one JSON line: the
tests run it inside a bridge's network namespace with ``nsenter``.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from trio_websocket import WebSocketConnection

from support.network import Event, Network, Proc

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
    proc = Proc(name, argv, warm=net.warm)
    net.procs.append(proc)
    started = proc.event("started", 30)
    listening = proc.event("bridge_listening", 30)
    return proc, int(listening["port"]), started


WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


def upgrade_request(host: str, *, key: bytes = WS_KEY, extra: str = "", target: str = "/") -> bytes:
    """A WebSocket opening handshake (well-formed unless ``key`` or ``extra`` say otherwise)."""
    return (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + b"Sec-WebSocket-Key: "
        + key
        + f"\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode()
    )


def http_request(method: str, target: str, host: str, extra: str = "", body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def exchange(address: str, port: int, request: bytes, timeout: float = 10) -> tuple[int, bytes]:
    """Send raw request bytes; the response's status and head (the socket is closed after)."""
    stream = await trio.open_tcp_stream(address, port)
    try:
        await stream.send_all(request)
        data = b""
        with trio.fail_after(timeout):
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
    finally:
        await stream.aclose()
    head = data.partition(b"\r\n\r\n")[0]
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return status, head


def error_code(frame: Any) -> str | None:
    """The code of an error frame, ``None`` for a payload."""
    if isinstance(frame, dict) and "error" in frame and "jsonrpc" not in frame:
        return str(frame["error"].get("code"))
    return None


async def probe(address: str, port: int, token: str) -> dict[str, Any]:
    """What a client gets from the bridge at ``address:port`` with and without ``token``."""
    from trio_websocket import ConnectionRejected, open_websocket_url

    host = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    requests = {
        "ws_without_token": upgrade_request(host),
        "ws_wrong_token": upgrade_request(host, target="/?token=nope"),
        "companions_without_token": http_request("GET", "/companions", host),
        "companions_with_token": http_request("GET", f"/companions?token={token}", host),
        "page_without_token": http_request("GET", "/", host),
    }
    out: dict[str, Any] = {}
    for name, request in requests.items():
        out[name], _ = await exchange(address, port, request)
    url = f"ws://{host}/?token={token}"
    try:
        async with open_websocket_url(url) as a, open_websocket_url(url) as b:
            await a.send_message(message_frame("user_probe", ["companion_x"], "hello", "probe-1"))
            got = await next_frame(b, lambda f: f.get("params", {}).get("id") == "probe-1", 10)
            out["ws_with_token"] = got["params"]["message"]
    except ConnectionRejected as exc:
        out["ws_with_token"] = exc.status_code
    return out


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


async def send_until_received(
    send: Callable[[str], Awaitable[None]], receiver: WebSocketConnection, what: str, tries: int = 5
) -> Any:
    """``send(message_id)`` a fresh message id until ``receiver`` gets the frame with that id
    (3 s each, at most ``tries``): gossipsub may need a moment to form its mesh after the joins,
    and what it is given before is lost. The frame that arrived is returned."""
    for _ in range(tries):
        message_id = str(uuid.uuid4())
        await send(message_id)

        def arrived(frame: Any, message_id: str = message_id) -> bool:
            return bool(frame.get("params", {}).get("id") == message_id)

        try:
            return await next_frame(receiver, arrived, 3)
        except trio.TooSlowError:
            continue
    raise AssertionError(f"{what} never crossed the network")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "probe":
        sys.exit("usage: -m support.live_bridge probe ADDRESS PORT TOKEN")
    print(json.dumps(trio.run(probe, sys.argv[2], int(sys.argv[3]), sys.argv[4])), flush=True)
