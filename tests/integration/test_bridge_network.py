"""`companion bridge` processes on a real libp2p network (separate processes on 127.0.0.1).

Two bridges and a companion node: a Firehose client on one bridge reaches a client on the other
through gossipsub; clients of one bridge see each other through its node's echo, once each and
never their own frames; payloads a companion publishes reach clients byte for byte; bad frames
get error frames; a client that stops reading is dropped while the others keep up.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.listen import fetch_companions
from support.bridges import silent_client
from support.live_bridge import (
    blocking,
    message_frame,
    next_frame,
    send_until_received,
    start_bridge,
)
from support.network import network

pytestmark = pytest.mark.integration


def recent(port: int) -> list[dict[str, Any]]:
    """A bridge's ``GET /history``, oldest first."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/history?limit=50", timeout=10) as response:
        messages: list[dict[str, Any]] = json.loads(response.read())["messages"]
    return messages


async def test_clients_on_two_bridges_talk_through_the_network(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        _juniper, j_started = await blocking(net.companion, "juniper")
        j_addr = j_started["addrs"][0]
        b1, port1, b1_started = await blocking(start_bridge, net, "bridge1", j_addr)
        b2, port2, _ = await blocking(start_bridge, net, "bridge2", j_addr, b1_started["addrs"][0])
        for bridge in (b1, b2):
            await blocking(bridge.event, "companion_joined", 30, companion_id="companion_juniper")

        # the bridge's directory (its node learned juniper's metadata) is served to clients
        listed = await fetch_companions(f"http://127.0.0.1:{port1}/companions")
        assert [m.id for m in listed] == ["companion_juniper"]

        raw, _ = await blocking(net.raw, "raw")
        raw.send({"op": "connect", "addr": b1_started["addrs"][0]})
        await blocking(raw.event, "connected", 15)
        await blocking(b1.event, "companion_joined", 30, companion_id="companion_raw")

        async with (
            open_websocket_url(f"ws://127.0.0.1:{port1}/") as alice,
            open_websocket_url(f"ws://127.0.0.1:{port2}/") as bob,
        ):
            # client -> bridge1 -> gossipsub -> bridge2 -> client (gossip may need a moment to
            # form its mesh after the joins: a few attempts, each with a deadline)
            def hello(i: str) -> str:
                return message_frame("user_alice", ["companion_juniper"], "hello", i)

            got = await send_until_received(lambda i: alice.send_message(hello(i)), bob, "a client's message")
            assert got["params"]["from"] == "user_alice" and got["params"]["message"] == "hello"
            msg_id = got["params"]["id"]  # the try that crossed

            # a companion's payloads reach clients exactly as published
            reply = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "message.send",
                    "params": {
                        "id": "r-1",
                        "from": "companion_raw",
                        "to": ["user_alice"],
                        "message": "hi!",
                        "metadata": {"emotion": "happy"},
                    },
                },
                separators=(",", ":"),
            )
            speak = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "query.send",
                    "id": "q-1",
                    "params": {"from": "companion_raw", "type": "speak", "body": {"message": "hi!"}},
                },
                separators=(",", ":"),
            )
            raw.send({"op": "publish", "topic": "messages", "text": reply})
            raw.send({"op": "publish", "topic": "queries", "text": speak})
            with trio.fail_after(10):
                frames: list[str | bytes] = []
                while len(frames) < 2:
                    frame = await alice.get_message()
                    if '"companion_raw"' in frame:
                        frames.append(frame)
            assert frames == [reply, speak]

            # the client answers the speak query; it crosses the network to the other bridge
            result = {"jsonrpc": "2.0", "id": "q-1", "result": {"success": True, "body": {"spoken": True}}}
            await alice.send_message(json.dumps({"topic": "queries", "body": result}))
            answered = await next_frame(bob, lambda f: f.get("id") == "q-1" and "result" in f, 10)
            assert answered["result"]["body"] == {"spoken": True}

            # bad frames get error frames; the connection stays open
            await alice.send_message("{oops")
            error = await next_frame(alice, lambda f: "error" in f and "jsonrpc" not in f, 5)
            assert error["error"]["code"] == "not_json"
            spoof = message_frame("companion_juniper", ["companion_raw"], "I am juniper", "s-1")
            await alice.send_message(spoof)
            error = await next_frame(alice, lambda f: "error" in f and "jsonrpc" not in f, 5)
            assert error["error"]["code"] == "forbidden_sender"
            last_id = str(uuid.uuid4())
            await alice.send_message(
                message_frame("user_alice", ["companion_juniper"], "still here", last_id)
            )
            await next_frame(bob, lambda f: f.get("params", {}).get("id") == last_id, 10)

        # a standalone bridge has no store: /history is what it relayed since it started, once
        # each, the refused spoof not among them (a page that reloads shows the conversation)
        for port in (port1, port2):
            said = [item["message"]["params"] for item in await blocking(recent, port)]
            ids = [p["id"] for p in said]
            assert len(ids) == len(set(ids)) and "s-1" not in ids, said
            # (juniper answers "hello" too, whenever its reply comes: only alice's and raw's here)
            theirs = [(p["id"], p["message"]) for p in said if p["from"] in ("user_alice", "companion_raw")]
            assert [line for line in theirs if line[1] != "hello"] == [
                ("r-1", "hi!"),
                (last_id, "still here"),
            ], said
            assert ids.index(msg_id) < ids.index("r-1"), said  # (earlier tries may be there too)


async def test_clients_of_one_bridge_see_each_others_frames_once_and_never_their_own(tmp_path: Path) -> None:
    """The bridge's clients see each other through its libp2p node's echo (py-libp2p delivers a
    node's own publications to it): every other client gets a frame once, its sender never."""
    with network(tmp_path) as net:
        _juniper, j_started = await blocking(net.companion, "juniper")
        bridge, port, _ = await blocking(start_bridge, net, "bridge", j_started["addrs"][0])
        await blocking(bridge.event, "companion_joined", 30, companion_id="companion_juniper")
        async with (
            open_websocket_url(f"ws://127.0.0.1:{port}/") as alice,
            open_websocket_url(f"ws://127.0.0.1:{port}/") as carol,
        ):
            sent = [str(uuid.uuid4()) for _ in range(3)]
            for msg_id in sent:
                await alice.send_message(message_frame("user_alice", [], "to nobody", msg_id))
            seen: list[str] = []
            while len(set(seen)) < len(sent):
                frame = await next_frame(carol, lambda f: f.get("params", {}).get("from") == "user_alice", 10)
                seen.append(frame["params"]["id"])
            # alice's echoes were delivered before carol's marker was sent: one to alice would
            # stand before the marker in her queue
            marker = str(uuid.uuid4())
            await carol.send_message(message_frame("user_carol", [], "marker", marker))
            frame = await next_frame(
                alice, lambda f: f.get("params", {}).get("from") in ("user_alice", "user_carol"), 10
            )
            assert frame["params"]["id"] == marker, f"alice got her own frame back: {frame}"
            # a second copy of alice's frames would stand before this one in carol's queue
            last = str(uuid.uuid4())
            await alice.send_message(message_frame("user_alice", [], "last", last))
            while (
                frame := await next_frame(
                    carol, lambda f: f.get("params", {}).get("from") == "user_alice", 10
                )
            )["params"]["id"] != last:
                seen.append(frame["params"]["id"])
            assert sorted(seen) == sorted(sent), f"carol got {seen} for {sent}"


async def test_a_client_that_stops_reading_is_dropped_and_others_keep_up(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        bridge, port, b_started = await blocking(start_bridge, net, "bridge", extra=("--max-queue", "64"))
        raw, _ = await blocking(net.raw, "raw")
        raw.send({"op": "connect", "addr": b_started["addrs"][0]})
        await blocking(raw.event, "connected", 15)
        await blocking(bridge.event, "companion_joined", 30, companion_id="companion_raw")

        silent = await silent_client(port)
        async with open_websocket_url(f"ws://127.0.0.1:{port}/", message_queue_size=4096) as fast:
            # the mesh is up once one probe message gets through
            for attempt in range(10):
                probe = {
                    "jsonrpc": "2.0",
                    "method": "action.send",
                    "params": {"from": "companion_raw", "name": "probe", "params": {"n": attempt}},
                }
                raw.send({"op": "publish", "topic": "actions", "text": json.dumps(probe)})
                try:
                    await next_frame(fast, lambda f: f.get("params", {}).get("name") == "probe", 2)
                except trio.TooSlowError:
                    continue
                break
            # more than the silent client's socket buffers and queue can hold; the commands go
            # to the publisher from a thread while this task keeps reading
            count = 500
            filler = "x" * 50_000
            commands: list[dict[str, object]] = [{"op": "pace", "seconds": 0.004}]
            for i in range(count):
                body = {
                    "jsonrpc": "2.0",
                    "method": "message.send",
                    "params": {
                        "id": f"m{i}",
                        "from": "companion_raw",
                        "to": ["user_x"],
                        "message": f"{i} {filler}",
                    },
                }
                data = base64.b64encode(json.dumps(body).encode()).decode()
                commands.append({"op": "publish", "topic": "messages", "b64": data})
            seen: set[str] = set()

            def send_commands() -> None:
                for c in commands:
                    raw.send(c)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(blocking, send_commands)
                with trio.move_on_after(90):
                    while len(seen) < count:
                        frame = json.loads(await fast.get_message())
                        if frame.get("method") == "message.send":
                            seen.add(frame["params"]["id"])
            kicked = await blocking(bridge.event, "client_too_slow", 30)
            assert "too slow" in kicked["reason"]
            assert len(seen) >= count * 0.98, f"the reading client got {len(seen)}/{count}"
        with trio.fail_after(10):  # the bridge closed the silent client's socket
            while await silent.receive_some(65536):
                pass
        await silent.aclose()
