"""The terminal client against a real bridge on loopback (the network is a MemoryHub)."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from companion.bridge import Bridge, BridgeConfig
from companion.listen import (
    DirectEspeakVoice,
    DirectoryError,
    ListenOptions,
    PlayerVoice,
    Show,
    VoiceError,
    fetch_companions,
    run_listener,
)
from companion.listen.core import END_MARKER
from companion.memory import Inbound, MemoryEndpoint, MemoryHub
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Message,
    Query,
    QueryResult,
    State,
)
from companion.voice import EspeakSynthesizer
from support.bridges import bridge_on_hub, serve_until_cancelled
from support.cards import metadata as md
from support.clients import Screen, needs_espeak

AYA = md("aya", name="Aya")
PIM = md("pim", name="Pim")


@dataclass
class Setup:
    bridge: Bridge
    companion: MemoryEndpoint
    url: str
    screen: Screen
    lines: trio.MemorySendChannel[str]
    done: trio.Event
    exit_code: list[int]

    async def next_from_client(self, topic: str) -> Inbound:
        with trio.fail_after(10):
            while True:
                item = await self.companion.receive_channel.receive()
                if item.sender_peer != "companion" and item.topic == topic:
                    return item


@asynccontextmanager
async def listener(
    nursery: trio.Nursery, *, token: str | None = None, token_in_url: bool = False, **options: Any
) -> AsyncIterator[Setup]:
    """A bridge with the client connected; ``token_in_url``: the client is given the token only
    in its URL (``--ws "ws://...?token=X"``), not as ``--token``."""
    net = bridge_on_hub(nursery, {AYA.id: AYA, PIM.id: PIM}, token=token)
    bridge, companion = net.bridge, net.companion
    port = await nursery.start(bridge.serve)
    url = f"ws://127.0.0.1:{port}/"
    screen = Screen()
    send, receive = trio.open_memory_channel[str](10)
    done = trio.Event()
    exit_code: list[int] = []
    if token_in_url and token is not None:
        opts = ListenOptions(url=f"{url}?token={token}", user_id="user_yamada", **options)
    else:
        opts = ListenOptions(url=url, user_id="user_yamada", token=token, **options)

    async def run() -> None:
        exit_code.append(await run_listener(opts, receive, screen))
        done.set()

    nursery.start_soon(run)
    yield Setup(bridge, companion, url, screen, send, done, exit_code)


async def test_conversation_in_both_directions(nursery: trio.Nursery) -> None:
    async with listener(nursery, token="tok") as s:
        await s.screen.wait_for("connected to")
        with trio.fail_after(5):
            await s.bridge.wait_for_clients(1)
        reply = Message.create("companion_aya", ["user_yamada", "companion_pim"], "hi!", {"emotion": "happy"})
        await s.companion.publish(MESSAGES, reply)
        line = await s.screen.wait_for("hi!")
        assert line.text == "Aya → you, Pim (happy): hi!"
        await s.lines.send("hello everyone")
        got = await s.next_from_client(MESSAGES)
        assert isinstance(got.payload, Message)
        assert got.payload.params.to == ["companion_aya", "companion_pim"]  # from the bridge's directory
        await s.lines.send("/next pim your turn")
        got = await s.next_from_client(MESSAGES)
        assert isinstance(got.payload, Message)
        assert got.payload.params.metadata == {"next_speaker": "companion_pim"}
        await s.lines.send("/quit")
        with trio.fail_after(5):
            await s.done.wait()
        assert s.exit_code == [0]


async def test_speak_and_approval_queries_are_answered(nursery: trio.Nursery) -> None:
    async with listener(nursery) as s:
        with trio.fail_after(5):
            await s.bridge.wait_for_clients(1)
        await s.companion.publish(
            QUERIES, Query.create("companion_aya", "speak", {"message": "la la"}, id="q1")
        )
        await s.screen.wait_for("♪ Aya: la la")
        got = await s.next_from_client(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.id == "q1"
        body = {"action": "buy", "preview": "buy tea"}
        await s.companion.publish(QUERIES, Query.create("companion_pim", "approval", body, id="a1"))
        await s.screen.wait_for("approve? [y/n]")
        await s.lines.send("y")
        got = await s.next_from_client(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.id == "a1"
        assert got.payload.result is not None and got.payload.result.body["approved"] is True


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@needs_espeak
async def test_voice_reports_done_only_after_the_audio_finished(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    out = tmp_path / "played.raw"
    # A player that consumes the audio and only then marks it played (as a real player exits
    # when its audio has finished).
    player = script(tmp_path, "player", f'cat > "{out}.part" && mv "{out}.part" "{out}"')
    voice = PlayerVoice(EspeakSynthesizer(), (player,))
    async with listener(nursery, voice=voice) as s:
        with trio.fail_after(5):
            await s.bridge.wait_for_clients(1)
        query = Query.create(
            "companion_aya", "speak", {"message": "Hello there", "emotion": "happy"}, id="v1"
        )
        await s.companion.publish(QUERIES, query)
        got = await s.next_from_client(QUERIES)
        assert out.exists(), "the result came before the audio had finished"
        assert out.stat().st_size > 10_000  # about a second of 22 kHz 16-bit audio
        assert isinstance(got.payload, QueryResult) and got.payload.result is not None
        assert got.payload.result.success is True
        assert got.payload.result.body == {"spoken": True, "engine": f"{voice.synthesizer.name}+{player}"}


@needs_espeak
async def test_voice_failure_is_reported_as_unsuccessful(nursery: trio.Nursery, tmp_path: Path) -> None:
    player = script(tmp_path, "broken", "cat >/dev/null; echo 'no audio device' >&2; exit 3")
    async with listener(nursery, voice=PlayerVoice(EspeakSynthesizer(), (player,))) as s:
        with trio.fail_after(5):
            await s.bridge.wait_for_clients(1)
        await s.companion.publish(QUERIES, Query.create("companion_aya", "speak", {"message": "hi"}, id="v2"))
        got = await s.next_from_client(QUERIES)
        assert isinstance(got.payload, QueryResult) and got.payload.result is not None
        assert got.payload.result.success is False
        assert "no audio device" in got.payload.result.body["error"]
        await s.screen.wait_for("voice failed")


@needs_espeak
async def test_stuck_player_hits_its_deadline(tmp_path: Path) -> None:
    player = script(tmp_path, "stuck", "cat >/dev/null; exec sleep 30")
    voice = PlayerVoice(EspeakSynthesizer(), (player,), slack=0.2)
    with pytest.raises(VoiceError, match="did not finish"), trio.fail_after(10):
        await voice.say("hi")


async def test_direct_espeak_errors(tmp_path: Path) -> None:
    with pytest.raises(VoiceError, match="not installed"):
        await DirectEspeakVoice(executable=str(tmp_path / "missing")).say("hi")
    slow = script(tmp_path, "slow-espeak", "exec sleep 30")
    with pytest.raises(VoiceError, match="did not finish"), trio.fail_after(10):
        await DirectEspeakVoice(executable=slow, timeout=0.2).say("hi")
    failing = script(tmp_path, "bad-espeak", "echo broken >&2; exit 1")
    with pytest.raises(VoiceError, match="broken"):
        await DirectEspeakVoice(executable=failing).say("hi")


async def test_refused_and_unreachable_bridges() -> None:
    _send, receive = trio.open_memory_channel[str](1)
    screen = Screen()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    for listener_ in listeners:
        await listener_.aclose()
    code = await run_listener(ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a"), receive, screen)
    assert code == 1 and "could not connect" in screen.lines[-1].text


async def test_wrong_token_is_explained(nursery: trio.Nursery) -> None:
    bridge = Bridge(MemoryHub().endpoint("b"), config=BridgeConfig(port=0, token="right"))
    port = await nursery.start(bridge.serve)
    _send, receive = trio.open_memory_channel[str](1)
    screen = Screen()
    options = ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a", token="wrong")
    assert await run_listener(options, receive, screen) == 1
    assert "refused (401)" in screen.lines[-1].text and "wrong token" in screen.lines[-1].text


async def test_silent_server_hits_the_connect_deadline() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")  # never accepted, never answers
    port = listeners[0].socket.getsockname()[1]
    _send, receive = trio.open_memory_channel[str](1)
    screen = Screen()
    options = ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a", connect_timeout=0.3)
    with trio.fail_after(5):
        assert await run_listener(options, receive, screen) == 1
    assert "within 0.3s" in screen.lines[-1].text
    for listener_ in listeners:
        await listener_.aclose()


async def test_a_bridge_that_stays_away_is_retried_then_given_up(nursery: trio.Nursery) -> None:
    bridge = Bridge(MemoryHub().endpoint("b"), config=BridgeConfig(port=0))
    port, scope = await serve_until_cancelled(nursery, bridge)
    _send, receive = trio.open_memory_channel[str](1)
    screen = Screen()
    result: list[int] = []
    options = ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a", reconnect_for=1.0)

    async def run() -> None:
        result.append(await run_listener(options, receive, screen))

    async with trio.open_nursery() as inner:
        inner.start_soon(run)
        with trio.fail_after(5):
            await bridge.wait_for_clients(1)
        scope.cancel()
    assert result == [1]
    assert "1001" in (await screen.wait_for("closed the connection")).text
    texts = [s.text for s in screen.lines]
    waits = [t for t in texts if t.startswith("reconnecting to ")]
    assert waits[:2] == [f"reconnecting to ws://127.0.0.1:{port}/ in {w} s…" for w in ("0.5", "1")], texts
    assert texts[-1].startswith("gave up: no answer from")


async def test_the_client_reconnects_when_the_bridge_comes_back(nursery: trio.Nursery) -> None:
    """A bridge restarted on the same port: the client connects again by itself, and what the
    person types next reaches the new bridge."""
    net = bridge_on_hub(nursery, {AYA.id: AYA})
    port, scope = await serve_until_cancelled(nursery, net.bridge)
    send, receive = trio.open_memory_channel[str](4)
    screen = Screen()
    options = ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a", reconnect_for=30.0)
    nursery.start_soon(run_listener, options, receive, screen)
    await screen.wait_for("connected to")
    scope.cancel()
    await screen.wait_for("reconnecting to")
    again = bridge_on_hub(nursery, {AYA.id: AYA}, port=port)
    await nursery.start(again.bridge.serve)
    await screen.wait_for("reconnected to", timeout=10)
    await send.send("@aya hello again")
    with trio.fail_after(10):
        while True:
            item = await again.companion.receive_channel.receive()
            if item.topic == MESSAGES and isinstance(item.payload, Message):
                assert item.payload.params.message == "hello again"
                break
    await send.send("/quit")


async def test_end_of_input_leaves(nursery: trio.Nursery) -> None:
    async with listener(nursery) as s:
        await s.screen.wait_for("connected to")
        await s.lines.aclose()
        with trio.fail_after(5):
            await s.done.wait()
        assert s.exit_code == [0]


async def test_fetch_companions_and_its_errors(nursery: trio.Nursery) -> None:
    bridge = Bridge(
        MemoryHub().endpoint("b"), directory={AYA.id: AYA}, config=BridgeConfig(port=0, token="t")
    )
    port = await nursery.start(bridge.serve)
    assert await fetch_companions(f"http://127.0.0.1:{port}/companions?token=t") == [AYA]
    with pytest.raises(DirectoryError, match="401"):
        await fetch_companions(f"http://127.0.0.1:{port}/companions")
    with pytest.raises(DirectoryError, match="unexpected companion list"):
        await fetch_companions(f"http://127.0.0.1:{port}/app.js")
    with pytest.raises(DirectoryError, match="only http"):
        await fetch_companions("ftp://127.0.0.1/companions")


async def test_fetch_companions_deadline() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(DirectoryError, match=r"within 0\.2s"):
        await fetch_companions(f"http://127.0.0.1:{port}/companions", timeout=0.2)
    for listener_ in listeners:
        await listener_.aclose()


async def test_the_token_in_the_url_is_passed_on(nursery: trio.Nursery) -> None:
    """``companion listen --ws "ws://...?token=X"``: the WebSocket and ``/companions`` both get
    it, so a line to everyone goes to the bridge's companions."""
    async with listener(nursery, token="tok", token_in_url=True) as s:
        connected = await s.screen.wait_for("connected to")
        assert "tok" not in connected.text  # the token is not shown
        await s.screen.wait_for("Type a line")  # the start hint
        await s.lines.send("hello everyone")
        got = await s.next_from_client(MESSAGES)
        assert isinstance(got.payload, Message)
        assert got.payload.params.to == ["companion_aya", "companion_pim"]  # the directory was read
        assert not [line for line in s.screen.lines if "no companions known" in line.text]
        await s.lines.send("/quit")


async def test_a_missing_token_says_how_to_give_one(nursery: trio.Nursery) -> None:
    bridge = Bridge(MemoryHub().endpoint("b"), config=BridgeConfig(port=0, token="right"))
    port = await nursery.start(bridge.serve)
    _send, receive = trio.open_memory_channel[str](1)
    screen = Screen()
    options = ListenOptions(url=f"ws://127.0.0.1:{port}/", user_id="user_a")
    assert await run_listener(options, receive, screen) == 1
    text = screen.lines[-1].text
    assert "refused (401)" in text and "--token" in text and "?token=" in text


async def test_thinking_counts_in_real_time_then_the_failure_and_the_end(nursery: trio.Nursery) -> None:
    """The signals as companions publish them reach the client through the bridge (``states``
    included: the client asks for it), and the status line ticks on the client's own clock."""
    async with listener(nursery) as s:
        with trio.fail_after(5):
            await s.bridge.wait_for_clients(1)
        await s.companion.publish(
            ACTIONS, Action.create("companion_aya", "companion.thinking", {"in_reply_to": "m-1"})
        )
        await s.screen.wait_for("Aya is thinking… (0 s)")
        start = trio.current_time()
        await s.screen.wait_for("Aya is thinking… (2 s)", timeout=6)
        assert trio.current_time() - start >= 1.5
        statuses = [line.text for line in s.screen.lines if line.kind == "status"]
        assert statuses == [f"Aya is thinking… ({n} s)" for n in range(3)]  # once a second, no repeats
        detail = "the server ignored the forced tool call"
        await s.companion.publish(
            ACTIONS,
            Action.create(
                "companion_aya",
                "companion.yield",
                {"in_reply_to": "m-1", "reason": "model_error", "detail": detail},
            ),
        )
        failed = await s.screen.wait_for("Aya could not answer")
        assert failed.text == (
            "Aya could not answer: the model failed (the server ignored the forced tool call); "
            "the turn passes to the next companion"
        )
        assert s.screen.lines[s.screen.lines.index(failed) - 1] == Show("", "status")
        # the stand-in thinks, replies in a closing stage; the array after it ends the conversation
        await s.companion.publish(
            ACTIONS, Action.create("companion_pim", "companion.thinking", {"in_reply_to": "m-1"})
        )
        await s.screen.wait_for("Pim is thinking… (0 s)")
        last = Message.create(
            "companion_pim", ["user_yamada"], "Good night.", {"in_reply_to": "m-1", "closing": "closing"}
        )
        await s.companion.publish(MESSAGES, last)
        await s.screen.wait_for("Pim → you: Good night.")
        end = [
            State.create("companion_aya", "speak", 6, False, "terminal"),
            State.create("companion_pim", "listen", 2, False, "terminal"),
        ]
        await s.companion.publish(STATES, end)
        marker = await s.screen.wait_for(END_MARKER)
        await s.companion.publish(STATES, end)  # another leader's array: no second marker
        await s.companion.publish(MESSAGES, Message.create("companion_aya", ["user_yamada"], "sync"))
        await s.screen.wait_for("Aya → you: sync")
        assert [line for line in s.screen.lines if line.text == END_MARKER] == [marker]
        assert [line.text for line in s.screen.lines if line.kind == "status"][-1] == ""  # nobody thinks
        await s.lines.send("/quit")
