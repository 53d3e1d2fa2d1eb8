"""A small HTTP/1.1 front door on trio: read one request with h11, answer it or hand it to WebSocket.

One listening port serves the web page, a few JSON endpoints and WebSocket clients on any
path (aikyo's clients connect to ``ws://host:port`` with path ``/``). A request is read with a
deadline and a size limit; an upgrade request is handed to trio-websocket together with the
bytes already read, so the WebSocket handshake is done by a well-kept library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final
from urllib.parse import parse_qs, urlsplit

import h11
import trio

__all__ = [
    "HttpError",
    "HttpRequest",
    "HttpResponse",
    "ReplayStream",
    "Route",
    "json_response",
    "read_request",
    "send_response",
    "text_response",
]

MAX_HEAD_BYTES: Final = 16 * 1024
MAX_BODY_BYTES: Final = 256 * 1024


class HttpError(Exception):
    """A request we cannot serve; ``status`` is what the client gets."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str
    headers: dict[str, str]
    """Lower-cased names; repeated headers joined with ``", "``."""
    body: bytes = b""
    raw: bytes = b""
    """Every byte read from the connection so far (replayed to the WebSocket handshake)."""
    http_version: str = "1.1"

    @property
    def path(self) -> str:
        return urlsplit(self.target).path or "/"

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def query_value(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    @property
    def is_websocket(self) -> bool:
        """The request asks for a WebSocket (whether its handshake is well-formed is checked
        by :func:`~companion.bridge.handshake.check_handshake`)."""
        upgrade = self.headers.get("upgrade", "").lower()
        return "websocket" in {p.strip() for p in upgrade.split(",")}


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text_response(status: int, text: str) -> HttpResponse:
    return HttpResponse(status, (text + "\n").encode("utf-8"))


def json_response(status: int, body: str) -> HttpResponse:
    return HttpResponse(status, body.encode("utf-8"), "application/json; charset=utf-8")


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTP endpoint. ``needs_token``: the bridge's token (and origin) rule applies."""

    handler: Handler
    needs_token: bool = True
    methods: frozenset[str] = field(default_factory=lambda: frozenset({"GET"}))
    timeout: float | None = None
    """The handler's deadline (default: the bridge's request timeout)."""


async def read_request(stream: trio.abc.Stream) -> HttpRequest:
    """Read one request head (and body, unless it is an upgrade). The caller sets the deadline."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    raw = bytearray()
    request: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpError(exc.error_status_hint, f"bad request: {exc}") from None
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                if request is None and not raw:
                    raise HttpError(400, "connection closed before a request")
                conn.receive_data(b"")
            else:
                raw += data
                conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
            continue
        if event is h11.PAUSED or isinstance(event, h11.EndOfMessage):
            break  # PAUSED: an upgrade request; the rest of the stream is not HTTP any more
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
            continue
        if isinstance(event, h11.ConnectionClosed):
            raise HttpError(400, "connection closed mid-request")
    if request is None:
        raise HttpError(400, "no request")
    headers: dict[str, str] = {}
    for name, value in request.headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return HttpRequest(
        method=request.method.decode("ascii", "replace").upper(),
        target=request.target.decode("latin-1"),
        headers=headers,
        body=bytes(body),
        raw=bytes(raw),
        http_version=request.http_version.decode("ascii", "replace"),
    )


async def send_response(stream: trio.abc.Stream, response: HttpResponse) -> None:
    """Write a complete response; the connection ends after it (one request per connection)."""
    try:
        phrase = HTTPStatus(response.status).phrase
    except ValueError:
        phrase = "Status"
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Connection", "close"),
        ("X-Content-Type-Options", "nosniff"),
        ("Cache-Control", "no-cache"),
        *response.headers,
    ]
    head = f"HTTP/1.1 {response.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    await stream.send_all(head.encode("latin-1") + b"\r\n" + response.body)


class ReplayStream(trio.abc.Stream):
    """A stream that first yields bytes already read, then reads from the wrapped stream."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return chunk
        return await self._inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | memoryview) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._inner.aclose()
