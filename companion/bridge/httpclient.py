"""One HTTP/1.1 request with h11 on trio, for the clients of a bridge's endpoints.

The terminal client reads ``/companions`` and ``/history``, the WebRTC client posts its offer to
``/webrtc/offer`` and ``companion action run`` posts to ``/actions/TOOL``: one request each, so
a full HTTP client library would be a dependency for very little. The helper sits here, beside
the server it talks to, because the bridge layer is the lowest one that ``rtc``, ``listen`` and
``app`` may all import.

Every exchange has one deadline (connecting, sending and reading the whole reply) and the
reply's body a size limit; redirects are not followed. Whatever goes wrong is one
:class:`RequestFailed`, an ``OSError``, so a caller that reports "cannot reach the bridge"
catches one family.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["HttpReply", "ReplyTooLarge", "RequestFailed", "RequestTimedOut", "request"]

READ_SIZE: Final = 65536


class RequestFailed(OSError):
    """The request got no complete reply: unreachable, cut short, not HTTP, too slow or too large."""


class RequestTimedOut(RequestFailed):
    """No complete reply within the deadline."""


class ReplyTooLarge(RequestFailed):
    """The reply's body went past the caller's limit (the rest is not read)."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    body: bytes


async def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float,
    limit: int,
) -> HttpReply:
    """Send one request to an ``http://`` or ``https://`` URL and read its reply, all within
    ``timeout`` seconds and at most ``limit`` bytes of body. A ``body`` goes as JSON. Raises
    ``ValueError`` for a URL it cannot use and :class:`RequestFailed` for the rest."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        raise ValueError(f"cannot send a request to {url!r}: use http:// or https://")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    fields = [("Host", parts.netloc.rpartition("@")[2]), ("Connection", "close")]
    if body is not None:
        fields += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    fields += list((headers or {}).items())
    conn = h11.Connection(h11.CLIENT)
    out = conn.send(h11.Request(method=method, target=target, headers=fields))
    if body is not None:
        out += conn.send(h11.Data(data=body))
    out += conn.send(h11.EndOfMessage())
    try:
        with trio.fail_after(timeout):
            stream: trio.abc.Stream
            if https:
                context = ssl.create_default_context()
                stream = await trio.open_ssl_over_tcp_stream(parts.hostname, port, ssl_context=context)
            else:
                stream = await trio.open_tcp_stream(parts.hostname, port)
            async with stream:
                await stream.send_all(out)
                return await _read_reply(conn, stream, limit)
    except RequestFailed:
        raise
    except trio.TooSlowError as exc:
        raise RequestTimedOut(f"no answer from {parts.netloc} within {timeout:g}s") from exc
    except (OSError, h11.ProtocolError, trio.BrokenResourceError) as exc:  # ssl.SSLError is one
        raise RequestFailed(f"no answer from {parts.netloc}: {exc}") from exc


async def _read_reply(conn: h11.Connection, stream: trio.abc.Stream, limit: int) -> HttpReply:
    status = 0
    data = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(READ_SIZE))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            data += event.data
            if len(data) > limit:
                raise ReplyTooLarge(f"a reply larger than {limit} bytes")
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return HttpReply(status, bytes(data))
