"""The bridge shell on a real loopback socket, with the network replaced by a MemoryHub."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, ConnectionRejected, WebSocketConnection, open_websocket_url

from companion.bridge import Bridge, BridgeConfig, QueueLimits
from companion.bridge.channel import CLOSE_GOING_AWAY, CLOSE_POLICY
from companion.memory import Inbound, MemoryEndpoint, MemoryHub
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Envelope,
    Message,
    Metadata,
    Query,
    QueryResult,
    State,
    encode,
)
from support.bridges import bridge_on_hub, http_exchange, serve_until_cancelled, silent_client
from support.cards import metadata as md

AYA = md("aya", name="Aya", personality="kind", sample="hi")


@dataclass
class Env:
    bridge: Bridge
    companion: MemoryEndpoint
    url: str

    async def next_inbound(self, topic: str | None = None) -> Inbound:
        with trio.fail_after(5):
            while True:
                item = await self.companion.receive_channel.receive()
                if item.sender_peer == "companion" or (topic is not None and item.topic != topic):
                    continue
                return item


@asynccontextmanager
async def running_bridge(
    nursery: trio.Nursery,
    directory: Mapping[str, Metadata] | None = None,
    **config: Any,
) -> AsyncIterator[Env]:
    net = bridge_on_hub(
        nursery, directory if directory is not None else {AYA.id: AYA}, host="127.0.0.1", **config
    )
    port = await nursery.start(net.bridge.serve)
    yield Env(net.bridge, net.companion, f"ws://127.0.0.1:{port}/")


async def recv_json(ws: WebSocketConnection) -> Any:
    with trio.fail_after(5):
        return json.loads(await ws.get_message())


def message_frame(text: str = "hello", to: list[str] | None = None, **params: Any) -> str:
    body = {
        "jsonrpc": "2.0",
        "method": "message.send",
        "params": {
            "id": "m-1",
            "from": "user_yamada",
            "to": to or ["companion_aya"],
            "message": text,
            **params,
        },
    }
    return json.dumps({"topic": "messages", "body": body})


async def test_client_message_is_published_and_replies_come_back(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        await ws.send_message(message_frame("こんにちは"))
        got = await env.next_inbound(MESSAGES)
        assert isinstance(got.payload, Message)
        assert got.payload.params.message == "こんにちは"
        assert got.payload.params.from_ == "user_yamada"

        reply = Message.create("companion_aya", ["user_yamada"], "やあ", {"emotion": "happy"})
        query = Query.create("companion_aya", "speak", {"message": "やあ", "emotion": "happy"})
        action = Action.create("companion_aya", "wave", {"hand": "left"})
        for topic, envelope in ((MESSAGES, reply), (QUERIES, query), (ACTIONS, action)):
            await env.companion.publish(topic, envelope)
            frame = await ws.get_message()
            assert frame == encode(envelope).decode()  # the raw JSON, unchanged


async def test_states_are_sent_only_to_clients_that_ask(nursery: trio.Nursery) -> None:
    async with (
        running_bridge(nursery) as env,
        open_websocket_url(env.url) as plain,
        open_websocket_url(env.url + "?topics=messages,states") as watcher,
    ):
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(2)
        states: list[State] = [State.create("companion_aya", "speak", 8, True)]
        await env.companion.publish(STATES, states)
        await env.companion.publish(MESSAGES, Message.create("companion_aya", ["user_x"], "after"))
        assert isinstance(await recv_json(watcher), list)
        assert (await recv_json(watcher))["params"]["message"] == "after"
        assert (await recv_json(plain))["params"]["message"] == "after"  # no states before it


async def test_unknown_topic_in_url_is_rejected(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env:
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(env.url + "?topics=gossip"):
                pass
        assert info.value.status_code == 400
        assert b"gossip" in (info.value.body or b"")


async def test_bad_frames_get_error_frames_and_the_connection_stays_open(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        forged: dict[str, Any] = {"from": "companion_kyoko"}  # "from" is a keyword: passed as **params
        cases = [
            ("not json", "not_json"),
            (json.dumps({"body": {}}), "invalid_frame"),
            (json.dumps({"topic": "states", "body": {}}), "unknown_topic"),
            (json.dumps({"topic": "messages", "body": {"jsonrpc": "2.0"}}), "invalid_body"),
            (message_frame(**forged), "forbidden_sender"),
        ]
        for frame, code in cases:
            await ws.send_message(frame)
            answer = await recv_json(ws)
            assert answer["error"]["code"] == code, answer
        await ws.send_message(b"\xff")
        assert (await recv_json(ws))["error"]["code"] == "not_utf8"
        await ws.send_message(message_frame("still here"))
        got = await env.next_inbound(MESSAGES)
        assert isinstance(got.payload, Message) and got.payload.params.message == "still here"


async def test_other_clients_see_a_clients_message_but_the_sender_gets_no_echo(nursery: trio.Nursery) -> None:
    async with (
        running_bridge(nursery) as env,
        open_websocket_url(env.url) as a,
        open_websocket_url(env.url) as b,
    ):
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(2)
        await a.send_message(message_frame("from a"))
        # b gets it from the hub's echo of the bridge's own publish; a never does
        assert (await recv_json(b))["params"]["message"] == "from a"
        await env.next_inbound(MESSAGES)
        await env.companion.publish(MESSAGES, Message.create("companion_aya", ["user_yamada"], "next"))
        assert (await recv_json(a))["params"]["message"] == "next"
        assert (await recv_json(b))["params"]["message"] == "next"


def result_frame(query_id: str, **body: Any) -> str:
    result = {"jsonrpc": "2.0", "id": query_id, "result": {"success": True, "body": body or {"spoken": True}}}
    return json.dumps({"topic": "queries", "body": result})


async def test_query_result_from_a_client_reaches_the_companion(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(1)
        query = Query.create("companion_aya", "speak", {"message": "hi"}, id="q-9")
        await env.companion.publish(QUERIES, query)
        assert (await recv_json(ws))["id"] == "q-9"
        await ws.send_message(result_frame("q-9"))
        got = await env.next_inbound(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.id == "q-9"


async def test_forged_and_repeated_query_results_are_refused(nursery: trio.Nursery) -> None:
    """A client answers only what it was asked, once: a result for an id it never received
    (another client's query, a made-up id) and a second result are refused and counted."""
    async with (
        running_bridge(nursery) as env,
        open_websocket_url(env.url) as honest,
        open_websocket_url(env.url + "?topics=messages") as forger,
    ):
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(2)
        approval = Query.create("companion_aya", "approval", {"action": "buy", "preview": "buy"})
        await env.companion.publish(QUERIES, approval)
        assert (await recv_json(honest))["id"] == approval.id
        for query_id in (approval.id, "made-up"):
            await forger.send_message(result_frame(query_id, approved=True))
            error = (await recv_json(forger))["error"]
            assert error["code"] == "unknown_query" and error["ref"] == query_id
        await honest.send_message(result_frame(approval.id, approved=False))
        got = await env.next_inbound(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.result is not None
        assert got.payload.result.body == {"approved": False}
        await honest.send_message(result_frame(approval.id, approved=True))
        assert (await recv_json(honest))["error"]["code"] == "already_answered"
        assert env.bridge.stats()["refused"] == {"unknown_query": 2, "already_answered": 1}
        # both still served: the forger's next message goes out, the honest client's next answer too
        await forger.send_message(message_frame("after"))
        assert isinstance((await env.next_inbound(MESSAGES)).payload, Message)
        assert (await recv_json(honest))["params"]["message"] == "after"  # other clients see it
        speak = Query.create("companion_aya", "speak", {"message": "again"})
        await env.companion.publish(QUERIES, speak)
        assert (await recv_json(honest))["id"] == speak.id
        await honest.send_message(result_frame(speak.id))
        # a query result, never a list of states: every other payload type has an id
        assert (await env.next_inbound(QUERIES)).payload.id == speak.id  # type: ignore[union-attr]


async def test_token_is_required_when_set(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery, token="s3cret") as env:
        for suffix in ("", "?token=wrong"):
            with pytest.raises(ConnectionRejected) as info:
                async with open_websocket_url(env.url + suffix):
                    pass
            assert info.value.status_code == 401
        async with open_websocket_url(env.url + "?token=s3cret") as ws:
            await ws.send_message(message_frame())
            await env.next_inbound(MESSAGES)
        headers = [(b"Authorization", b"Bearer s3cret")]
        async with open_websocket_url(env.url, extra_headers=headers) as ws:
            await ws.send_message(message_frame())
            await env.next_inbound(MESSAGES)


async def test_foreign_browser_origin_is_refused(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env:
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(env.url, extra_headers=[(b"Origin", b"https://evil.example")]):
                pass
        assert info.value.status_code == 403
        async with open_websocket_url(env.url, extra_headers=[(b"Origin", b"http://localhost:5173")]) as ws:
            await ws.send_message(message_frame())
            await env.next_inbound(MESSAGES)


async def test_receive_hook_turns_custom_frames_into_payloads(nursery: trio.Nursery) -> None:
    calls: list[Any] = []

    async def hook(data: Any) -> Mapping[str, Any] | None:
        calls.append(data)
        if data.get("say") is None:
            return None  # consumed: nothing to publish
        if data["say"] == "boom":
            raise RuntimeError("hook bug")
        payload: Mapping[str, Any] = json.loads(message_frame(data["say"]))
        return payload

    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        env.bridge.set_receive_hook(hook)
        await ws.send_message(json.dumps({"ping": 1}))
        await ws.send_message(json.dumps({"say": "boom"}))
        assert (await recv_json(ws))["error"]["code"] == "hook_failed"
        await ws.send_message(json.dumps({"say": "via hook"}))
        got = await env.next_inbound(MESSAGES)
        assert isinstance(got.payload, Message) and got.payload.params.message == "via hook"
        assert calls[0] == {"ping": 1}
        # the hook's output is checked like any frame
        env.bridge.set_receive_hook(lambda data: {"topic": "nowhere", "body": {}})
        await ws.send_message("{}")
        assert (await recv_json(ws))["error"]["code"] == "unknown_topic"


async def test_slow_receive_hook_hits_its_deadline(nursery: trio.Nursery) -> None:
    async def hook(data: Any) -> Mapping[str, Any] | None:
        await trio.sleep_forever()
        return None

    async with running_bridge(nursery, hook_timeout=0.2) as env, open_websocket_url(env.url) as ws:
        env.bridge.set_receive_hook(hook)
        await ws.send_message("{}")
        error = (await recv_json(ws))["error"]
        assert error["code"] == "hook_failed" and "0.2s" in error["message"]


class StuckPublisher:
    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        await trio.sleep_forever()


class BrokenPublisher:
    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        raise OSError("network down")


@pytest.mark.parametrize(
    ("publisher", "words"), [(StuckPublisher(), "in time"), (BrokenPublisher(), "network down")]
)
async def test_publish_failures_become_error_frames(
    nursery: trio.Nursery, publisher: Any, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(publisher, config=BridgeConfig(port=0, publish_timeout=0.2))
    port = await nursery.start(bridge.serve)
    async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
        await ws.send_message(message_frame())
        error = (await recv_json(ws))["error"]
        assert error["code"] == "publish_failed" and words in error["message"]


async def test_what_the_bridges_node_publishes_reaches_clients_through_its_echo_once(
    nursery: trio.Nursery,
) -> None:
    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(1)
        node = env.bridge._publisher  # the bridge's node, as the voice publishes through it
        await node.publish(MESSAGES, Message.create("companion_aya", ["user_yamada"], "local"))
        assert (await recv_json(ws))["params"]["message"] == "local"
        await env.next_inbound(MESSAGES)  # it also went to the network
        await env.companion.publish(MESSAGES, Message.create("companion_aya", ["user_yamada"], "remote"))
        assert (await recv_json(ws))["params"]["message"] == "remote"  # and no duplicate of "local"


async def test_client_that_stops_reading_is_disconnected_and_others_keep_up(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="companion.bridge")
    limits = QueueLimits(max_frames=16, max_bytes=512 * 1024)
    async with running_bridge(nursery, limits=limits, close_timeout=0.5) as env:
        stream = await silent_client(env.bridge.port)
        async with open_websocket_url(env.url, message_queue_size=1000) as fast:
            with trio.fail_after(5):
                await env.bridge.wait_for_clients(2)
            filler = "x" * 40_000
            sent = 0
            with trio.fail_after(20):
                while env.bridge.client_count == 2:
                    sent += 1
                    message = Message.create("companion_aya", ["user_yamada"], f"{sent} {filler}")
                    await env.companion.publish(MESSAGES, message)
                    frame = await recv_json(fast)
                    assert frame["params"]["message"].startswith(f"{sent} ")
                    assert sent < 2000, "the silent client was never disconnected"
            # the fast client still gets everything after the slow one was dropped
            await env.companion.publish(MESSAGES, Message.create("companion_aya", ["user_yamada"], "after"))
            assert (await recv_json(fast))["params"]["message"] == "after"
        slow = [r for r in caplog.records if r.getMessage() == "client_too_slow"]
        assert len(slow) == 1
        with trio.fail_after(5):  # the silent client's socket is closed by the bridge
            while await stream.receive_some(65536):
                pass
        await stream.aclose()


class SilentChannel:
    """A frame channel whose client never takes a frame."""

    def __init__(self) -> None:
        self.closed: tuple[int, str] | None = None
        self.inbox: trio.MemoryReceiveChannel[str | bytes]
        self.outbox, self.inbox = trio.open_memory_channel[str | bytes](10)

    async def send(self, text: str) -> None:
        await trio.sleep_forever()

    async def receive(self) -> str | bytes | None:
        try:
            return await self.inbox.receive()
        except trio.EndOfChannel:
            return None

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_slow_rule_on_any_frame_channel(nursery: trio.Nursery) -> None:
    hub = MemoryHub()
    config = BridgeConfig(limits=QueueLimits(max_frames=3), close_timeout=0.2)
    bridge = Bridge(hub.endpoint("bridge"), config=config)
    channel = SilentChannel()
    done = trio.Event()

    async def run() -> None:
        await bridge.serve_channel(channel, label="silent")
        done.set()

    nursery.start_soon(run)
    with trio.fail_after(5):
        await bridge.wait_for_clients(1)
    message = Message.create("companion_aya", ["user_a"], "hi")
    for _ in range(5):  # one in flight (stuck in send) + 3 queued, then overflow
        bridge.deliver(Inbound(MESSAGES, message, "peer", encode(message)))
        await trio.testing.wait_all_tasks_blocked()
    with trio.fail_after(5):
        await done.wait()
    assert channel.closed is not None
    code, reason = channel.closed
    assert code == CLOSE_POLICY and "too slow" in reason


class GatedChannel(SilentChannel):
    """A client that takes each frame only when the test lets it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []
        self.gate = trio.Event()
        self.in_send = trio.Event()

    async def send(self, text: str) -> None:
        self.in_send.set()
        await self.gate.wait()
        self.sent.append(text)


async def test_kick_lets_the_frame_in_flight_finish_then_closes_cleanly(nursery: trio.Nursery) -> None:
    config = BridgeConfig(limits=QueueLimits(max_frames=2), close_timeout=30)
    bridge = Bridge(MemoryHub().endpoint("bridge"), config=config)
    channel = GatedChannel()
    done = trio.Event()

    async def run() -> None:
        await bridge.serve_channel(channel)
        done.set()

    nursery.start_soon(run)
    with trio.fail_after(5):
        await bridge.wait_for_clients(1)
    message = Message.create("companion_aya", ["user_a"], "hi")
    bridge.deliver(Inbound(MESSAGES, message, "peer", encode(message)))
    with trio.fail_after(5):
        await channel.in_send.wait()
    for _ in range(3):  # 2 queued, the third overflows while the first is being written
        bridge.deliver(Inbound(MESSAGES, message, "peer", encode(message)))
    channel.gate.set()  # the client reads again: the frame in flight completes
    with trio.fail_after(5):  # well before the 30 s grace
        await done.wait()
    assert len(channel.sent) == 1
    assert channel.closed is not None and channel.closed[0] == CLOSE_POLICY


async def test_bridge_shutdown_closes_clients_with_going_away(nursery: trio.Nursery) -> None:
    bridge = Bridge(MemoryHub().endpoint("bridge"), config=BridgeConfig(port=0))
    port, serve_scope = await serve_until_cancelled(nursery, bridge)
    async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
        with trio.fail_after(5):
            await bridge.wait_for_clients(1)
        serve_scope.cancel()
        with pytest.raises(ConnectionClosed) as info, trio.fail_after(5):
            await ws.get_message()
        assert info.value.reason is not None and info.value.reason.code == CLOSE_GOING_AWAY


async def http_get(port: int, target: str, headers: str = "") -> tuple[int, dict[str, str], bytes]:
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}\r\n".encode()
    head, body = await http_exchange(port, request, 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return status, {k.lower(): v for k, v in fields.items()}, body


async def test_page_and_directory_over_http(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery, token="t0k") as env:
        port = env.bridge.port
        status, headers, body = await http_get(port, "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert b"<title>" in body
        assert "default-src 'self'" in headers["content-security-policy"]
        status, headers, body = await http_get(port, "/app.js")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        status, _, _ = await http_get(port, "/companions")
        assert status == 401
        status, headers, body = await http_get(port, "/companions?token=t0k")
        assert status == 200 and headers["content-type"].startswith("application/json")
        assert json.loads(body) == {"companions": [AYA.model_dump(by_alias=True)]}
        status, _, _ = await http_get(port, "/../../etc/passwd")
        assert status == 404


async def test_garbage_and_silent_connections_are_closed(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery, request_timeout=0.3) as env:
        stream = await trio.open_tcp_stream("127.0.0.1", env.bridge.port)
        await stream.send_all(b"\x00\x01 not http\r\n\r\n")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 400")
        await stream.aclose()
        silent = await trio.open_tcp_stream("127.0.0.1", env.bridge.port)
        with trio.fail_after(5):  # the request deadline closes it
            assert await silent.receive_some(10) == b""
        await silent.aclose()


async def test_bridge_full_refuses_more_clients(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery, max_clients=1) as env, open_websocket_url(env.url):
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(1)
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(env.url):
                pass
        assert info.value.status_code == 503


async def test_a_flood_is_answered_with_rate_limited_frames_and_nothing_is_lost(
    nursery: trio.Nursery,
) -> None:
    """10,000 frames as fast as the socket takes them: each is either published or answered
    with a ``rate_limited`` error frame naming it; an honest client is served meanwhile."""
    count = 10_000
    async with (
        running_bridge(nursery) as env,
        open_websocket_url(env.url) as flooder,
        open_websocket_url(env.url) as honest,
    ):
        refused: dict[str, float] = {}
        other: list[Any] = []

        async def read_answers() -> None:
            while True:
                frame = json.loads(await flooder.get_message())
                error = frame.get("error", {})
                if error.get("code") == "rate_limited":
                    refused[error["ref"]] = error["retry_after"]
                elif frame.get("params", {}).get("id") != "h-1":  # the other client's message
                    other.append(frame)

        async def flood() -> None:
            for i in range(count):
                await flooder.send_message(message_frame(f"flood {i}", id=f"f{i}"))

        published: set[str] = set()
        async with trio.open_nursery() as inner:
            inner.start_soon(read_answers)
            with trio.fail_after(60):
                await flood()
                await honest.send_message(message_frame("honest", id="h-1"))
                while len(refused) + len(published) < count or "h-1" not in published:
                    got = await env.next_inbound(MESSAGES)
                    assert isinstance(got.payload, Message)
                    published.add(got.payload.params.id)
            inner.cancel_scope.cancel()
        flood_published = published - {"h-1"}
        assert not other, other[:3]
        assert not flood_published & refused.keys()
        assert flood_published | refused.keys() == {f"f{i}" for i in range(count)}
        assert 30 <= len(flood_published) <= 30 + 10 * 60  # the burst, then 10/s
        assert all(0 < wait <= 0.1 + 1e-6 for wait in refused.values())
        assert env.bridge.stats()["refused"] == {"rate_limited": len(refused)}
        # once it waits as told, the flooder is served again
        await trio.sleep(max(refused.values()))
        await flooder.send_message(message_frame("after", id="f-after"))
        got = await env.next_inbound(MESSAGES)
        assert isinstance(got.payload, Message) and got.payload.params.id == "f-after"


async def raw_exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes, return the response head's status line and headers."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    data = b""
    with trio.fail_after(5):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    await stream.aclose()
    return data.partition(b"\r\n\r\n")[0]


def upgrade(
    host: bytes = b"127.0.0.1", key: bytes = b"dGhlIHNhbXBsZSBub25jZQ==", extra: bytes = b""
) -> bytes:
    return (
        b"GET / HTTP/1.1\r\nHost: " + host + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n"
    )


async def test_dns_rebinding_gets_nothing_and_honest_clients_still_do(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="companion.bridge")
    async with running_bridge(nursery) as env:
        port = env.bridge.port
        evil = f"evil.example:{port}".encode()
        origin = b"Origin: http://" + evil + b"\r\n"
        head = await raw_exchange(port, upgrade(evil, extra=origin))
        assert head.startswith(b"HTTP/1.1 421"), head
        for path in (b"/companions", b"/", b"/app.js", b"/nowhere"):
            head = await raw_exchange(
                port, b"GET " + path + b" HTTP/1.1\r\nHost: " + evil + b"\r\n" + origin + b"\r\n"
            )
            assert head.startswith(b"HTTP/1.1 421"), (path, head)
        assert env.bridge.client_count == 0
        for _ in range(50):  # a page that keeps trying: counted, logged a few times, not 50
            await raw_exchange(port, b"GET /companions HTTP/1.1\r\nHost: " + evil + b"\r\n\r\n")
        assert env.bridge.stats()["requests_refused"] == {"421": 55}
        logged = [r for r in caplog.records if r.getMessage() in ("request_refused", "client_refused")]
        assert len(logged) == 2  # one per kind within the interval
        # the bridge's own page, opened as http://127.0.0.1:PORT/ or http://localhost:PORT/
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            head = await raw_exchange(port, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert head.startswith(b"HTTP/1.1 200"), head
            own = f"Origin: http://{host}\r\n".encode()
            head = await raw_exchange(port, upgrade(host.encode(), extra=own))
            assert head.startswith(b"HTTP/1.1 101"), head
        async with open_websocket_url(env.url) as ws:
            await ws.send_message(message_frame("still served"))
            got = await env.next_inbound(MESSAGES)
            assert isinstance(got.payload, Message) and got.payload.params.message == "still served"


async def test_allowed_host_names_pass(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery, allowed_hosts=("companion.example",)) as env:
        port = env.bridge.port
        host = f"companion.example:{port}".encode()
        head = await raw_exchange(port, upgrade(host, extra=b"Origin: http://" + host + b"\r\n"))
        assert head.startswith(b"HTTP/1.1 101"), head


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (upgrade(key=b"!!"), b"400"),
        (upgrade(key=b"YWJj"), b"400"),
        (upgrade().replace(b"Sec-WebSocket-Version: 13\r\n", b""), b"400"),
        (upgrade().replace(b"Connection: Upgrade\r\n", b""), b"400"),
        (upgrade().replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"), b"426"),
        (upgrade().replace(b"GET /", b"POST /"), b"400"),
    ],
)
async def test_malformed_handshakes_are_refused(
    nursery: trio.Nursery, request_bytes: bytes, status: bytes
) -> None:
    async with running_bridge(nursery) as env:
        head = await raw_exchange(env.bridge.port, request_bytes)
        assert head.startswith(b"HTTP/1.1 " + status), head
        if status == b"426":
            assert b"Sec-WebSocket-Version: 13" in head
        assert env.bridge.client_count == 0
        async with open_websocket_url(env.url) as ws:  # an honest client still gets in
            await ws.send_message(message_frame("ok"))
            await env.next_inbound(MESSAGES)


async def test_an_address_in_use_is_an_error_naming_it(nursery: trio.Nursery) -> None:
    async with running_bridge(nursery) as env:
        port = env.bridge.port
        second = Bridge(MemoryHub().endpoint("b"), config=BridgeConfig(port=port))
        with pytest.raises(
            OSError, match=f"cannot listen on 127.0.0.1:{port} \\(--ws\\): the address is already in use"
        ):
            await second.serve()


def test_a_bridge_beyond_loopback_must_have_a_token() -> None:
    with pytest.raises(ValueError, match=r"0\.0\.0\.0 .*must require a token"):
        BridgeConfig(host="0.0.0.0")
    assert BridgeConfig(host="0.0.0.0", token="t").token == "t"
    assert BridgeConfig(host="localhost").token is None


async def test_a_session_key_lets_another_connection_of_the_same_client_answer(nursery: trio.Nursery) -> None:
    """The page switches to WebRTC or reconnects: its queries are answered on its new link.
    Connections name their session with ``{"session": KEY}``; only that key's holders may answer."""
    key = "k" * 32
    async with (
        running_bridge(nursery) as env,
        open_websocket_url(env.url) as first,
        open_websocket_url(env.url + "?topics=messages") as second,
        open_websocket_url(env.url + "?topics=messages") as stranger,
    ):
        await first.send_message(json.dumps({"session": key}))
        await stranger.send_message(json.dumps({"session": "z" * 32}))
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(3)
        approval = Query.create("companion_aya", "approval", {"action": "buy"})
        await env.companion.publish(QUERIES, approval)
        assert (await recv_json(first))["id"] == approval.id
        await stranger.send_message(result_frame(approval.id, approved=True))
        assert (await recv_json(stranger))["error"]["code"] == "unknown_query"
        await second.send_message(json.dumps({"session": key}))  # the same client, a new link
        await second.send_message(result_frame(approval.id, approved=False))
        got = await env.next_inbound(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.id == approval.id
        for bad in ({"session": "short"}, {"session": key, "more": 1}, {"session": 5}):
            await second.send_message(json.dumps(bad))
            assert (await recv_json(second))["error"]["code"] == "invalid_session"


async def test_a_client_that_sends_but_never_reads_its_answers_is_dropped(nursery: trio.Nursery) -> None:
    """Its error frames fill half its queue: it is not read from any more, and after the drain
    deadline it is disconnected as too slow; its answers were never thrown away meanwhile."""
    config = BridgeConfig(limits=QueueLimits(max_frames=4), drain_timeout=0.3, close_timeout=0.2)
    bridge = Bridge(MemoryHub().endpoint("bridge"), config=config)
    channel = SilentChannel()
    done = trio.Event()

    async def run() -> None:
        await bridge.serve_channel(channel, label="flooder")
        done.set()

    nursery.start_soon(run)
    with trio.fail_after(5):
        await bridge.wait_for_clients(1)
    read = 0
    with trio.fail_after(5):
        while True:  # the bridge stops taking frames once two answers wait
            try:
                channel.outbox.send_nowait("not json")
            except trio.WouldBlock:
                break
            read += 1
            await trio.testing.wait_all_tasks_blocked()
    assert read <= 4 + 10  # one in flight, two queued, the rest in the channel's own buffer
    with trio.fail_after(5):
        await done.wait()
    assert channel.closed is not None
    code, reason = channel.closed
    assert code == CLOSE_POLICY and "did not read its answers within 0.3s" in reason
    assert bridge.stats()["refused"] == {"not_json": 3}


async def test_written_waits_for_a_message_to_reach_every_client(nursery: trio.Nursery) -> None:
    """A stop's step before closing the clients (``companion.app.stopping``): ``written`` holds
    until the message arrived and every client's frames are written; a message that never comes
    ends the wait at its deadline."""
    async with running_bridge(nursery) as env, open_websocket_url(env.url) as ws:
        with trio.fail_after(5):
            await env.bridge.wait_for_clients(1)
        reply = Message.create("companion_aya", ["user_yamada"], "last words")
        async with trio.open_nursery() as inner:
            done: list[bool] = []

            async def wait() -> None:
                done.append(await env.bridge.written([reply.params.id], 5))

            inner.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []  # nothing arrived yet
            await env.companion.publish(MESSAGES, reply)
        assert done == [True]
        assert (await recv_json(ws))["params"]["message"] == "last words"
        with trio.fail_after(5):
            assert await env.bridge.written(["never-sent"], 0.05) is False
