"""The one HTTP client helper: a reply read whole, and a server that is slow, closes early, sends
too much or is not there, each ending in one :class:`RequestFailed` within the deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from companion.bridge.httpclient import ReplyTooLarge, RequestFailed, RequestTimedOut, request

Serve = Callable[[trio.SocketStream, bytes], Awaitable[None]]


async def _read_head(stream: trio.SocketStream) -> bytes:
    """What the client sent, up to the end of its head and the body its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            while len(body) < int(value):
                body += await stream.receive_some(4096)
    return data


async def _with_server(serve: Serve, client: Callable[[int], Awaitable[None]]) -> list[bytes]:
    """Run ``serve`` for each connection on a loopback port while ``client`` talks to it; what
    the client sent, one entry per connection."""
    seen: list[bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        sent = await _read_head(stream)
        seen.append(sent)
        await serve(stream, sent)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        await client(port)
        nursery.cancel_scope.cancel()
    return seen


async def _answer_nothing(stream: trio.SocketStream) -> None:
    await stream.aclose()


async def _answer(stream: trio.SocketStream, body: bytes, status: str = "200 OK") -> None:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    await stream.send_all(head.encode() + body)
    await stream.aclose()


async def test_a_post_is_sent_as_json_and_its_reply_read_whole() -> None:
    replies = []

    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        await _answer(stream, b'{"ok": true}', "201 Created")

    async def client(port: int) -> None:
        url = f"http://127.0.0.1:{port}/actions/x?companion=c"
        headers = {"Authorization": "Bearer t"}
        replies.append(await request("POST", url, body=b'{"a":1}', headers=headers, timeout=5, limit=100))

    seen = await _with_server(serve, client)
    assert replies[0].status == 201 and replies[0].body == b'{"ok": true}'
    sent = seen[0]
    assert sent.startswith(b"POST /actions/x?companion=c HTTP/1.1\r\n")
    assert b"content-type: application/json" in sent.lower()
    assert b"authorization: bearer t" in sent.lower()
    assert sent.endswith(b'\r\n\r\n{"a":1}')


async def test_a_get_sends_no_body() -> None:
    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        await _answer(stream, b"[]")

    async def client(port: int) -> None:
        reply = await request("GET", f"http://127.0.0.1:{port}/companions", timeout=5, limit=100)
        assert (reply.status, reply.body) == (200, b"[]")

    seen = await _with_server(serve, client)
    assert seen[0].startswith(b"GET /companions HTTP/1.1\r\n")
    assert b"content-length" not in seen[0].lower() and seen[0].endswith(b"\r\n\r\n")


async def _failure_against(serve: Serve, *, timeout: float = 5, limit: int = 1000) -> RequestFailed:
    """What a GET to a server that runs ``serve`` raises: a :class:`RequestFailed` (the test
    fails if it raises anything else or nothing), within the test's own limit of 30 s."""
    raised: list[RequestFailed] = []

    async def client(port: int) -> None:
        with trio.move_on_after(30) as guard, pytest.raises(RequestFailed) as failed:
            await request("GET", f"http://127.0.0.1:{port}/", timeout=timeout, limit=limit)
        assert not guard.cancelled_caught
        raised.append(failed.value)

    await _with_server(serve, client)
    return raised[0]


async def test_a_server_that_never_answers_is_given_up_at_the_deadline() -> None:
    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        await trio.sleep_forever()

    failure = await _failure_against(serve, timeout=0.2)
    assert isinstance(failure, RequestTimedOut) and "within 0.2s" in str(failure)


async def test_a_server_that_answers_slowly_is_given_up_at_the_deadline() -> None:
    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        while True:  # a byte at a time, never finishing within the deadline
            await stream.send_all(b"x")
            await trio.sleep(0.05)

    assert isinstance(await _failure_against(serve, timeout=0.3, limit=10_000), RequestTimedOut)


@pytest.mark.parametrize(
    "sent_before_closing",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part",  # early: no short reply
        b"",  # before answering
        b"SSH-2.0-OpenSSH\r\n\r\n",  # no HTTP
    ],
)
async def test_a_server_that_closes_early_or_sends_no_http_is_a_failure(sent_before_closing: bytes) -> None:
    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        await stream.send_all(sent_before_closing)
        await stream.aclose()

    assert not isinstance(await _failure_against(serve), RequestTimedOut | ReplyTooLarge)


async def test_a_server_that_sends_too_much_is_cut_off_at_the_limit() -> None:
    async def serve(stream: trio.SocketStream, sent: bytes) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n"
        try:
            await stream.send_all(head)
            while True:  # endless: the client must stop reading, not the server stop sending
                await stream.send_all(b"x" * 65536)
        except trio.BrokenResourceError:
            pass

    failure = await _failure_against(serve, limit=1000)
    assert isinstance(failure, ReplyTooLarge) and "larger than 1000 bytes" in str(failure)


async def test_nobody_listening_is_a_failure_and_an_os_error() -> None:
    async with trio.open_nursery() as nursery:  # a port that was free a moment ago
        listeners = await nursery.start(partial(trio.serve_tcp, _answer_nothing, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()
    with pytest.raises(RequestFailed) as failed:
        await request("GET", f"http://127.0.0.1:{port}/", timeout=5, limit=1000)
    assert isinstance(failed.value, OSError)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "ws://127.0.0.1/", "http:///nohost"])
async def test_a_url_it_cannot_use_is_refused_before_connecting(url: str) -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        await request("GET", url, timeout=5, limit=1000)
