"""The bridge's edge against hostile browsers and clients: real `companion bridge` processes.

Each attack is played against a running bridge over real sockets (a DNS-rebinding page's
requests, malformed handshakes, a 10,000-frame flood, a forged query result, a bridge bound
beyond loopback without a token), and each test then checks that honest clients are still
served. The flood and the forged result cross a real libp2p network to a second bridge,
whose client sees exactly what was published.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from support import live_bridge
from support.live import stdout_line
from support.live_bridge import (
    blocking,
    error_code,
    exchange,
    http_request,
    message_frame,
    next_frame,
    start_bridge,
    upgrade_request,
)
from support.network import Network, Proc, network

pytestmark = pytest.mark.integration

FLOOD = 10_000


async def test_dns_rebinding_and_malformed_handshakes_are_refused(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        bridge, port, _ = await blocking(start_bridge, net, "bridge")
        evil = f"evil.example:{port}"
        origin = f"Origin: http://{evil}\r\n"
        # the rebinding page: its Origin and Host are both its own name
        refused = {
            "websocket": upgrade_request(evil, extra=origin),
            "companions": http_request("GET", "/companions", evil, origin),
            "page": http_request("GET", "/", evil),
            "webrtc offer": http_request("POST", "/webrtc/offer", evil, origin, b'{"type":"offer"}'),
        }
        for what, request in refused.items():
            status, head = await exchange("127.0.0.1", port, request)
            assert status == 421, (what, head)
        # malformed handshakes never become clients
        local = f"127.0.0.1:{port}"
        malformed = {
            b"!!": 400,  # the key is not base64
            b"YWJj": 400,  # base64 of 3 bytes, not 16
        }
        for key, expected in malformed.items():
            status, head = await exchange("127.0.0.1", port, upgrade_request(local, key=key))
            assert status == expected, (key, head)
        no_version = upgrade_request(local).replace(b"Sec-WebSocket-Version: 13\r\n", b"")
        assert (await exchange("127.0.0.1", port, no_version))[0] == 400
        other_version = upgrade_request(local).replace(b"Version: 13", b"Version: 8")
        status, head = await exchange("127.0.0.1", port, other_version)
        assert status == 426 and b"Sec-WebSocket-Version: 13" in head
        assert bridge.count("client_connected") == 0
        # the bridge's own page and its clients are served as before
        for host in (local, f"localhost:{port}"):
            assert (await exchange("127.0.0.1", port, http_request("GET", "/", host)))[0] == 200
            status, _ = await exchange("127.0.0.1", port, http_request("GET", "/companions", host))
            assert status == 200
        headers = [(b"Origin", f"http://{local}".encode())]
        async with (
            open_websocket_url(f"ws://{local}/", extra_headers=headers) as page,
            open_websocket_url(f"ws://localhost:{port}/") as other,
        ):
            await page.send_message(message_frame("user_me", ["companion_x"], "still here", "m-1"))
            got = await next_frame(other, lambda f: f.get("params", {}).get("id") == "m-1", 10)
            assert got["params"]["message"] == "still here"


async def two_bridges(net: Network) -> tuple[Proc, int, Proc, int]:
    """Bridge A and bridge B, peered over libp2p on 127.0.0.1."""
    a, port_a, a_started = await blocking(start_bridge, net, "bridge-a")
    b, port_b, _ = await blocking(start_bridge, net, "bridge-b", a_started["addrs"][0])
    return a, port_a, b, port_b


async def mesh_ready(sender: WebSocketConnection, receiver: WebSocketConnection) -> None:
    """Gossip needs a moment to form its mesh: probe until one message crosses."""
    for _attempt in range(20):
        probe = f"probe-{uuid.uuid4()}"
        await sender.send_message(message_frame("user_probe", ["companion_x"], "probe", probe))

        def crossed(f: Any, p: str = probe) -> bool:
            return bool(f.get("params", {}).get("id") == p)

        try:
            await next_frame(receiver, crossed, 2)
        except trio.TooSlowError:
            continue
        return
    raise AssertionError("no message crossed between the two bridges")


async def test_a_flood_is_answered_with_rate_limited_and_nothing_is_lost(tmp_path: Path) -> None:
    """10,000 frames as fast as one client can send them: every frame is either published
    (and reaches a client of another bridge across the network) or answered with a
    ``rate_limited`` error frame naming it. Nothing disappears without a word."""
    with network(tmp_path) as net:
        a, port_a, _b, port_b = await two_bridges(net)
        async with (
            open_websocket_url(f"ws://127.0.0.1:{port_a}/") as honest,
            open_websocket_url(f"ws://127.0.0.1:{port_a}/", message_queue_size=1024) as flooder,
            open_websocket_url(f"ws://127.0.0.1:{port_b}/", message_queue_size=1024) as observer,
        ):
            await mesh_ready(honest, observer)
            ids = [f"flood-{i}" for i in range(FLOOD)]
            refused: set[str] = set()
            arrived: set[str] = set()
            other_errors: list[Any] = []
            accounted = trio.Event()

            def account() -> None:
                if len(refused) + len(arrived) >= FLOOD:
                    accounted.set()

            async def answers() -> None:
                while True:
                    frame = json.loads(await flooder.get_message())
                    code = error_code(frame)
                    if code == "rate_limited":
                        refused.add(frame["error"]["ref"])
                        account()
                    elif code is not None:
                        other_errors.append(frame)

            async def flood() -> None:
                for msg_id in ids:
                    await flooder.send_message(message_frame("user_flood", ["companion_x"], "spam", msg_id))

            async def observe() -> None:
                while True:
                    frame = json.loads(await observer.get_message())
                    msg_id = frame.get("params", {}).get("id", "")
                    if msg_id.startswith("flood-"):
                        assert msg_id not in arrived, f"{msg_id} arrived twice"
                        arrived.add(msg_id)
                        account()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answers)
                nursery.start_soon(flood)
                nursery.start_soon(observe)
                # until every frame is published or refused, while either keeps coming (15 s
                # each). The last one is often a refusal, which the observer never sees: it
                # waited out its 15 s for a frame that was not coming.
                heard = -1
                while not accounted.is_set() and len(refused) + len(arrived) > heard:
                    heard = len(refused) + len(arrived)
                    with trio.move_on_after(15):
                        await accounted.wait()
                nursery.cancel_scope.cancel()
            assert not other_errors, other_errors[:3]
            lost = set(ids) - refused - arrived
            assert not lost, f"{len(lost)} frames neither published nor refused ({len(arrived)} arrived)"
            assert not refused & arrived
            assert len(arrived) >= 30  # the burst at least went out
            assert len(refused) >= FLOOD - 2_000
            # every refusal was counted, and logged once per kind and interval, not 10,000 times
            assert a.count("frame_refused", code="rate_limited") <= 10
            a.signal(signal.SIGUSR1)
            stats = await blocking(a.event, "bridge_stats", 10)
            assert stats["refused"] == {"rate_limited": len(refused)}
            assert stats["published"] >= len(arrived)
            # the honest client and the flooder (after its pause) are served again
            await trio.sleep(0.2)
            for ws, msg_id in ((honest, "after-honest"), (flooder, "after-flood")):

                def arrived_after(f: Any, i: str = msg_id) -> bool:
                    return bool(f.get("params", {}).get("id") == i)

                await ws.send_message(message_frame("user_me", ["companion_x"], "after", msg_id))
                await next_frame(observer, arrived_after, 10)


def result_frame(query_id: str, body: dict[str, Any]) -> str:
    result = {"jsonrpc": "2.0", "id": query_id, "result": {"success": True, "body": body}}
    return json.dumps({"topic": "queries", "body": result})


async def test_a_forged_query_result_is_refused(tmp_path: Path) -> None:
    """A client that was never sent a query cannot answer it (a forged approval, or a speak
    result that cuts a companion's line short); the client that was sent it answers once."""
    with network(tmp_path) as net:
        a, port_a, b, port_b = await two_bridges(net)
        raw, _ = await blocking(net.raw, "raw")
        a_addr = (await blocking(a.event, "started", 30))["addrs"][0]
        raw.send({"op": "connect", "addr": a_addr})
        await blocking(raw.event, "connected", 15)
        await blocking(a.event, "companion_joined", 30, companion_id="companion_raw")
        async with (
            open_websocket_url(f"ws://127.0.0.1:{port_a}/") as honest,
            open_websocket_url(f"ws://127.0.0.1:{port_a}/?topics=messages") as forger,
            open_websocket_url(f"ws://127.0.0.1:{port_b}/") as observer,
        ):
            await mesh_ready(honest, observer)
            # the companion asks for an approval; only the honest client is sent it
            query_id = f"q-{uuid.uuid4()}"
            approval: dict[str, Any] = {
                "jsonrpc": "2.0",
                "method": "query.send",
                "id": query_id,
                "params": {"from": "companion_raw", "type": "approval", "body": {"action": "buy"}},
            }
            for _attempt in range(10):
                raw.send({"op": "publish", "topic": "queries", "text": json.dumps(approval)})
                try:
                    await next_frame(honest, lambda f: f.get("id") == query_id, 2)
                except trio.TooSlowError:
                    continue
                break
            else:
                raise AssertionError("the query never reached the honest client")
            for forged_id in (query_id, "made-up-id"):
                await forger.send_message(result_frame(forged_id, {"approved": True}))
                error = await next_frame(forger, lambda f: error_code(f) is not None, 10)
                assert error["error"]["code"] == "unknown_query" and error["error"]["ref"] == forged_id
            await honest.send_message(result_frame(query_id, {"approved": False}))
            await honest.send_message(result_frame(query_id, {"approved": True}))
            error = await next_frame(honest, lambda f: error_code(f) is not None, 10)
            assert error["error"]["code"] == "already_answered"
            # across the network: the honest answer once, no forged one, then a later message
            marker = f"m-{uuid.uuid4()}"
            await forger.send_message(message_frame("user_forger", ["companion_raw"], "hi", marker))
            seen: list[Any] = []

            def seen_until_marker(f: Any) -> bool:
                seen.append(f)
                return bool(f.get("params", {}).get("id") == marker)

            await next_frame(observer, seen_until_marker, 10)
            results = [f for f in seen if "result" in f and f.get("id") in (query_id, "made-up-id")]
            assert [r["result"]["body"] for r in results] == [{"approved": False}]
            assert b.count("frame_refused") == 0
            # the honest client still answers the next query
            speak: dict[str, Any] = {
                **approval,
                "id": f"q-{uuid.uuid4()}",
                "params": {"from": "companion_raw", "type": "speak"},
            }
            raw.send({"op": "publish", "topic": "queries", "text": json.dumps(speak)})
            await next_frame(honest, lambda f: f.get("id") == speak["id"], 10)
            await honest.send_message(result_frame(speak["id"], {"spoken": True}))
            answered = await next_frame(observer, lambda f: f.get("id") == speak["id"] and "result" in f, 10)
            assert answered["result"]["body"] == {"spoken": True}


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=10
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _netns_available(), reason="needs unshare -n, nsenter and ip (root)")
async def test_beyond_loopback_a_token_is_generated_and_required(tmp_path: Path) -> None:
    """`companion bridge --ws 0.0.0.0:0` without --token, in a network namespace of its own
    (loopback, plus a LAN-style address on its loopback interface; nothing else): it prints
    a generated token, and refuses every client without it."""
    lan = "10.77.0.1"
    setup = f'ip link set lo up && ip addr add {lan}/32 dev lo && exec "$@"'
    argv = [
        "unshare", "-n", "sh", "-c", setup, "sh",
        sys.executable, "-m", "companion", "bridge", "--ws", "0.0.0.0:0", "--no-mdns",
        "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path / "data"), "--no-webrtc",
        "--log-format", "json",
    ]  # fmt: skip
    proc = Proc("bridge-lan", argv)
    try:
        port = int((await blocking(proc.event, "bridge_listening", 30))["port"])
        token_line = await blocking(stdout_line, proc, lambda line: line.startswith("  token: "), 10)
        token = token_line.split()[1]
        assert len(token) >= 20 and "generated" in token_line
        assert any(f"?token={token}" in text for text in proc.lines)
        for address in ("127.0.0.1", lan):
            inside = ["nsenter", f"--net=/proc/{proc.pid}/ns/net"]
            out = subprocess.run(
                [*inside, sys.executable, "-m", "support.live_bridge", "probe", address, str(port), token],
                capture_output=True, text=True, timeout=60, cwd=Path(live_bridge.__file__).parents[1],
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            got = json.loads(out.stdout.strip().splitlines()[-1])
            assert got == {
                "ws_without_token": 401,
                "ws_wrong_token": 401,
                "companions_without_token": 401,
                "companions_with_token": 200,
                "page_without_token": 200,
                "ws_with_token": "hello",
            }, (address, got)
    finally:
        proc.stop()


async def test_the_bridge_keeps_its_peer_id_across_runs(tmp_path: Path) -> None:
    """Companions trust the bridge as an answerer by its peer id: it must not change."""
    data = tmp_path / "data-bridge"
    printed = subprocess.run(
        [sys.executable, "-m", "companion", "bridge", "--print-peer-id", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    with network(tmp_path) as net:
        for run in range(2):
            bridge, _, started = await blocking(start_bridge, net, "bridge")
            assert started["peer_id"] == printed, run
            bridge.stop()
            net.procs.remove(bridge)
