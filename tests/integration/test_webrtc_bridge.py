"""WebRTC clients of `companion bridge` processes on a real libp2p network (all on 127.0.0.1).

An aiortc client posts its offer to ``/webrtc/offer`` over HTTP and then speaks the Firehose
protocol over the data channel; a WebSocket client on a second bridge sees what crosses the
network; a bare gossipsub peer plays a companion that publishes replies and ``speak`` queries.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.rtc import OfferRejected, RtcClient, connect_rtc
from companion.voice import EspeakSynthesizer
from support.clients import drain_audio
from support.live_bridge import blocking, message_frame, next_frame, send_until_received, start_bridge
from support.network import Proc, network

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not EspeakSynthesizer.available(),
        reason="espeak-ng is not installed (scripts/system-deps.sh installs it)",
    ),
]

LONG = "I will keep talking for quite a while, so that there is time to leave in the middle. " * 3


def speak_query(query_id: str, text: str) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "query.send",
            "id": query_id,
            "params": {
                "from": "companion_raw",
                "type": "speak",
                "body": {"message": text, "emotion": "happy"},
            },
        },
        separators=(",", ":"),
    )


async def rtc_frame(client: RtcClient, predicate: Any, timeout: float) -> tuple[float, Any]:
    """The next data channel frame satisfying ``predicate``, with its arrival time."""
    with trio.fail_after(timeout):
        while True:
            frame = json.loads(await client.receive_text())
            if predicate(frame):
                return time.monotonic(), frame


async def test_webrtc_client_talks_hears_and_leaves_mid_speech(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        b1, port1, b1_started = await blocking(start_bridge, net, "bridge1")
        _b2, port2, _ = await blocking(
            start_bridge, net, "bridge2", b1_started["addrs"][0], extra=("--token", "tok")
        )
        raw, _ = await blocking(net.raw, "raw")
        raw.send({"op": "connect", "addr": b1_started["addrs"][0]})
        await blocking(raw.event, "connected", 15)
        await blocking(b1.event, "companion_joined", 30, companion_id="companion_raw")

        # the token rule applies to offers exactly as to WebSockets
        with pytest.raises(OfferRejected) as refused:
            async with connect_rtc(f"http://127.0.0.1:{port2}", voice=False):
                pass
        assert refused.value.status == 401

        async with (
            connect_rtc(f"http://127.0.0.1:{port1}", voice=True) as alice,
            open_websocket_url(f"ws://127.0.0.1:{port2}/?token=tok") as bob,
        ):
            assert alice.voice

            # data channel -> bridge1 -> gossipsub -> bridge2 -> WebSocket (the mesh may need a
            # moment after the joins: a few attempts, each with a deadline)
            def hello(i: str) -> str:
                return message_frame("user_alice", ["companion_raw"], "hello", i)

            got = await send_until_received(
                lambda i: alice.send_text(hello(i)), bob, "a WebRTC client's message"
            )
            assert got["params"]["message"] == "hello"

            # a companion's payloads reach the data channel byte for byte
            reply = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "message.send",
                    "params": {"id": "r-1", "from": "companion_raw", "to": ["user_alice"], "message": "hi!"},
                },
                separators=(",", ":"),
            )
            raw.send({"op": "publish", "topic": "messages", "text": reply})
            with trio.fail_after(10):
                while await alice.receive_text() != reply:
                    pass

            # a speak query is heard on the voice track; its result (published by bridge1's
            # voice) comes after the audio, on the data channel and across the network
            drain_audio(alice)
            raw.send(
                {
                    "op": "publish",
                    "topic": "queries",
                    "text": speak_query("q-1", "Hello from the lighthouse."),
                }
            )
            await rtc_frame(alice, lambda f: f.get("id") == "q-1" and f.get("method") == "query.send", 10)
            answered_at, result = await rtc_frame(alice, lambda f: f.get("id") == "q-1" and "result" in f, 20)
            assert result["result"]["success"] is True and result["result"]["body"]["spoken"] is True
            audible = [f for f in drain_audio(alice) if f.peak > 500]
            assert len(audible) > 25, "less than half a second of speech was heard"
            assert sum(f.received_at <= answered_at for f in audible) >= len(audible) - 5
            crossed = await next_frame(bob, lambda f: f.get("id") == "q-1" and "result" in f, 10)
            assert crossed["result"] == result["result"]

            # leave in the middle of a long line: the query is answered as interrupted
            raw.send({"op": "publish", "topic": "queries", "text": speak_query("q-2", LONG)})
            with trio.fail_after(10):
                async for frame in alice.audio:
                    if frame.peak > 500:
                        break
        # (alice has left; bob is still connected through bridge2)
        async with open_websocket_url(f"ws://127.0.0.1:{port2}/?token=tok") as carol:
            interrupted = await next_frame(carol, lambda f: f.get("id") == "q-2" and "result" in f, 20)
        assert interrupted["result"]["success"] is False
        assert interrupted["result"]["body"]["interrupted"] is True
        closed = await blocking(b1.event, "rtc_session_closed", 15)
        assert "closed" in closed["reason"]

        # the bridge takes new WebRTC clients afterwards
        async with connect_rtc(f"http://127.0.0.1:{port1}", voice=False) as dave:
            await dave.send_text("{oops")
            error = await rtc_frame(dave, lambda f: "error" in f, 10)
            assert error[1]["error"]["code"] == "not_json"


async def test_a_companion_answers_a_webrtc_client_and_speaks_through_its_track(tmp_path: Path) -> None:
    card = tmp_path / "juniper.yaml"
    card.write_text(
        "metadata:\n  id: companion_juniper\n  name: Juniper\n  personality: calm\n"
        "  story: a lighthouse keeper\n  sample: Clear skies.\nrole: reply briefly\n"
        "actions: [speak_with_voice]\nevents:\n  params:\n    type: object\n"
        "    properties:\n      mood: {type: string}\n    required: [mood]\n"
        "  conditions:\n    - expression: 'true'\n      execute:\n"
        "        - tool: speak_with_voice\n          instruction: reply out loud\n",
        encoding="utf-8",
    )
    with network(tmp_path) as net:
        bridge, port, b_started = await blocking(start_bridge, net, "bridge")
        argv = [
            sys.executable,
            "-m",
            "companion.cli.run",
            str(card),
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--peer",
            b_started["addrs"][0],
            "--approver",  # the bridge's clients (and its voice) answer juniper's speak queries
            b_started["peer_id"],
            "--data-dir",
            str(tmp_path / "data-juniper"),
            "--log-format",
            "json",
            "-v",
        ]
        juniper = Proc("juniper", argv)
        net.procs.append(juniper)
        await blocking(juniper.event, "started", 30)
        await blocking(bridge.event, "companion_joined", 30, companion_id="companion_juniper")

        async with connect_rtc(f"http://127.0.0.1:{port}", voice=True) as alice:
            await alice.send_text(message_frame("user_alice", ["companion_juniper"], "Good evening!", "m-1"))
            _, query = await rtc_frame(
                alice, lambda f: f.get("method") == "query.send" and f["params"]["type"] == "speak", 60
            )
            answered_at, _ = await rtc_frame(
                alice, lambda f: f.get("id") == query["id"] and "result" in f, 60
            )
            _, reply = await rtc_frame(
                alice,
                lambda f: f.get("method") == "message.send" and f["params"]["from"] == "companion_juniper",
                60,
            )
            assert reply["params"]["message"] == query["params"]["body"]["message"]
            audible = [f for f in drain_audio(alice) if f.peak > 500]
            assert audible and audible[0].received_at < answered_at
