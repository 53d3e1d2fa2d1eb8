"""``companion listen --webrtc``: the terminal client over a data channel, with the bridge's voice.

A real bridge with its WebRTC gateway on 127.0.0.1 (HTTP offer route included); the network is
a MemoryHub. The audio player is a small script that writes what it is given to a file.
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from companion.bridge import Bridge
from companion.cli import build_parser
from companion.listen import ListenOptions, run_listener
from companion.memory import Inbound, MemoryEndpoint
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult
from companion.rtc import RtcGateway
from companion.rtc.route import serve_webrtc
from companion.voice import EspeakSynthesizer
from support.bridges import bridge_on_hub
from support.clients import Screen, needs_espeak


@dataclass
class Setup:
    bridge: Bridge
    gateway: RtcGateway
    companion: MemoryEndpoint
    port: int

    async def from_client(self, kind: type, timeout: float = 15) -> object:
        with trio.fail_after(timeout):
            while True:
                item: Inbound = await self.companion.receive_channel.receive()
                if item.sender_peer != "companion" and isinstance(item.payload, kind):
                    return item.payload


@asynccontextmanager
async def bridge_with_webrtc(nursery: trio.Nursery, token: str | None = None) -> AsyncIterator[Setup]:
    net = bridge_on_hub(nursery, token=token)
    async with serve_webrtc(net.bridge, net.node, synthesizer=EspeakSynthesizer()) as gateway:
        port = await nursery.start(net.bridge.serve)
        yield Setup(net.bridge, gateway, net.companion, port)


def file_player(tmp_path: Path) -> tuple[str, ...]:
    """An audio 'player' that stores the raw PCM it is given (and the rate it was told)."""
    script = tmp_path / "player"
    script.write_text(f'#!/bin/sh\necho "$1" > {tmp_path}/rate\nexec cat > {tmp_path}/pcm\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return (str(script), "{rate}")


@needs_espeak
async def test_listen_over_webrtc_shows_sends_and_plays_the_bridge_voice(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    async with bridge_with_webrtc(nursery, token="tok") as setup:
        screen = Screen()
        lines_send, lines_receive = trio.open_memory_channel[str](8)
        options = ListenOptions(
            url=f"ws://127.0.0.1:{setup.port}/",
            user_id="user_kai",
            token="tok",
            answer_speak=False,
            webrtc=True,
            rtc_voice=True,
            rtc_player=file_player(tmp_path),
        )
        done = trio.Event()
        codes: list[int] = []

        async def run() -> None:
            codes.append(await run_listener(options, lines_receive, screen))
            done.set()

        nursery.start_soon(run)
        await screen.wait_for("connected to", timeout=10)
        with trio.fail_after(10):
            await setup.gateway.wait_for_sessions(1)

        reply = Message.create("companion_aya", ["user_kai"], "Welcome aboard.", {"emotion": "happy"})
        await setup.companion.publish(MESSAGES, reply)
        await screen.wait_for("Welcome aboard.", timeout=10)

        await lines_send.send("@aya hello over webrtc")
        sent = await setup.from_client(Message)
        assert isinstance(sent, Message) and sent.params.message == "hello over webrtc"

        query = Query.create("companion_aya", "speak", {"message": "The tide is turning.", "emotion": "sad"})
        await setup.companion.publish(QUERIES, query)
        result = await setup.from_client(QueryResult, timeout=20)
        assert isinstance(result, QueryResult) and result.id == query.id
        assert result.result is not None and result.result.body["spoken"] is True  # the bridge's voice
        assert not any("The tide is turning." in line.text for line in screen.lines)  # not answered here
        assert (tmp_path / "rate").read_text().strip() == "48000"
        with trio.fail_after(5):
            while (tmp_path / "pcm").stat().st_size < 48000 * 2:  # a second of mono audio played
                await trio.sleep(0.05)
        pcm = (tmp_path / "pcm").read_bytes()
        assert max(abs(v) for v in memoryview(pcm[: len(pcm) // 2 * 2]).cast("h")) > 1000

        await lines_send.aclose()  # end of input: the person leaves
        with trio.fail_after(10):
            await done.wait()
        assert codes == [0]
        with trio.fail_after(10):
            await setup.gateway.wait_for_sessions(0)


async def test_listen_over_webrtc_reports_a_refusal(nursery: trio.Nursery) -> None:
    async with bridge_with_webrtc(nursery, token="tok") as setup:
        screen = Screen()
        _, lines_receive = trio.open_memory_channel[str](1)
        options = ListenOptions(url=f"ws://127.0.0.1:{setup.port}/", token="wrong", webrtc=True)
        assert await run_listener(options, lines_receive, screen) == 1
        line = await screen.wait_for("refused WebRTC", timeout=10)
        assert "401" in line.text and line.kind == "error"


def test_cli_webrtc_voice_leaves_speak_queries_to_the_bridge() -> None:
    args = build_parser().parse_args(["listen", "--webrtc", "--voice", "--player", "cat {rate}"])
    assert args.webrtc and args.voice
    from companion.app.listen import track_player

    assert track_player(args.player) == ("cat", "{rate}")
