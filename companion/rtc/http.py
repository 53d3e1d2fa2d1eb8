"""One JSON POST over HTTP/1.1 with h11 on trio: enough to send an SDP offer to a bridge.

The client side of ``/webrtc/offer``; a full HTTP client library would be a dependency for a
single request. Redirects are not followed; the whole exchange has one deadline.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import h11
import trio

__all__ = ["HttpReply", "offer_url", "post_json"]

MAX_REPLY_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    body: bytes


def offer_url(base: str, path: str = "/webrtc/offer") -> str:
    """The offer endpoint of a bridge given as ``http(s)://`` or as its ``ws(s)://`` URL."""
    parts = urlsplit(base if "://" in base else f"http://{base}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported bridge URL scheme {parts.scheme!r}: use http(s):// or ws(s)://")
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


async def post_json(
    url: str, body: bytes, *, headers: dict[str, str] | None = None, timeout: float
) -> HttpReply:
    """POST ``body`` as ``application/json``; raises ``OSError``/``h11`` errors on network or
    protocol failure and ``trio.TooSlowError`` past ``timeout``."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"no host in {url!r}")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rpartition("@")[2]
    with trio.fail_after(timeout):
        stream: trio.abc.Stream
        if https:
            stream = await trio.open_ssl_over_tcp_stream(
                parts.hostname, port, ssl_context=ssl.create_default_context()
            )
        else:
            stream = await trio.open_tcp_stream(parts.hostname, port)
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            request_headers = [
                ("Host", host_header),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
                *(headers or {}).items(),
            ]
            out = conn.send(h11.Request(method="POST", target=target, headers=request_headers))
            out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            await stream.send_all(out)
            return await _read_reply(conn, stream)


async def _read_reply(conn: h11.Connection, stream: trio.abc.Stream) -> HttpReply:
    status = 0
    data = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            data += event.data
            if len(data) > MAX_REPLY_BYTES:
                raise ValueError(f"reply larger than {MAX_REPLY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return HttpReply(status, bytes(data))
