"""A reply prepared while the leader decides, end to end: ``companion run --ws`` in its own
process, its model the fake OpenAI-compatible server streaming at a hosted model's pace (first
token after 0.4 s, 60 tokens a second), a WebSocket client that answers ``speak`` queries.

The companion addressed alone is the likely speaker: its speak request starts beside the
leader's states request. Confirmed by the array, the line is voiced once and published once.
When the array gives the turn to nobody, the prepared request is cancelled and nothing of it
reaches anyone (no ``speak`` query, no ``message.send``), although its whole line was written
before the array came."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.app.lines import parse_sees
from companion.conversation.rules.leader import plan_leaders
from companion.lines.sentences import split_sentences
from companion.protocol import STATES, Message, State, encode_states
from support.fake_llm_server import FakeLLMServer
from support.live import stdout_line
from support.live_bridge import blocking, message_frame
from support.voice import LINES, VoiceModel, ask_over_ws, frames_until, juniper_home, speak_queries

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
ZED = "companion_zed"


def _kind(body: Mapping[str, Any]) -> str:
    names = {t["function"]["name"] for t in body.get("tools") or []}
    return "states" if "set_states" in names else "params" if "set_params" in names else "speak"


async def test_a_confirmed_prepared_reply_is_voiced_once(tmp_path: Path, hosted: FakeLLMServer) -> None:
    hosted.push(*([VoiceModel()] * 12))
    async with juniper_home(tmp_path, hosted) as (_net, home, url):
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
            frames = await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)
            with trio.move_on_after(1):  # anything after the line would be a second voicing
                frames.append(json.loads(await ws.get_message()))
        assert home.count("reply_prepared_adopted", message_id="m-1") == 1
    said = [q["params"]["body"]["message"] for q in speak_queries(frames)]
    assert said == split_sentences(LINES[0])  # each sentence once, in order
    published = [f for f in frames if f.get("method") == "message.send" and f["params"]["from"] == JUNIPER]
    assert [f["params"]["message"] for f in published] == [LINES[0]]
    requests = hosted.model_requests()
    kinds = [_kind(r.body) for r in requests]
    assert sorted(kinds) == ["speak", "states"]  # the card's condition reads no parameter
    states, speak = requests[kinds.index("states")], requests[kinds.index("speak")]
    assert states.answered is not None and speak.at < states.answered  # side by side


def _led_by(leader: str, to: list[str], text: str) -> str:
    """A message id for which aikyo's md5 rule makes ``leader`` the leader among ``to``."""
    for n in range(1000):
        message = Message.create("user_mika", to, text, id=f"m-{n}")
        if plan_leaders(message, to).leader == leader:
            return f"m-{n}"
    raise AssertionError("no id found")


async def test_a_prepared_reply_is_cancelled_when_another_companion_is_chosen(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """Juniper is named, so it prepares its reply; but the leader is ``companion_zed`` (a raw
    peer that behaves as an aikyo leader: it ignores the preference), whose array selects
    itself. Juniper's prepared reply is cancelled: no sentence of it is heard, no line of it
    published, although the whole line was written (and held) before the array came."""
    hosted.push(*([VoiceModel()] * 12))
    to, text = [JUNIPER, ZED], "Juniper, how is the sea?"
    message_id = _led_by(ZED, to, text)
    async with juniper_home(tmp_path, hosted) as (net, home, url):
        addr = home.wait_for(lambda e: e.get("event") == "started" and e.get("companion_id") == JUNIPER, 5)
        zed, _ = await blocking(net.raw, "zed")
        zed.send({"op": "connect", "addr": addr["addrs"][0]})
        await blocking(zed.event, "connected", 15)
        await blocking(stdout_line, home, lambda s: ZED in (parse_sees(s) or ("", set()))[1], 30)
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            for _attempt in range(10):  # the clients' node joins the gossip mesh on a heartbeat
                await ws.send_message(message_frame("user_mika", to, text, message_id))
                with contextlib.suppress(AssertionError):  # not within 3 s: sent again
                    await blocking(home.event, "reply_prepared", 3, message_id=message_id)
                    break
            frames: list[Any] = []
            assert home.count("leader_chosen", message_id=message_id, leader=ZED) == 1
            with trio.fail_after(10):  # the whole line written (and held) before the array comes
                while not any(_kind(r.body) == "speak" and r.answered for r in hosted.model_requests()):
                    await trio.sleep(0.05)
            array = [
                State.create(ZED, "speak", 9, True),
                State.create(JUNIPER, "listen", 1, False),
            ]
            zed.send(
                {"op": "publish", "topic": STATES, "b64": base64.b64encode(encode_states(array)).decode()}
            )
            await blocking(home.event, "reply_prepared_dropped", 30, message_id=message_id)
            with trio.move_on_after(2):  # the whole line would be out by now
                while True:
                    frames.append(json.loads(await ws.get_message()))
        assert home.count("speaker_chosen", message_id=message_id, speaker=ZED) == 1
        assert home.count("reply_prepared_adopted") == 0 and home.count("replied") == 0
    assert [f for f in frames if f.get("method") == "query.send"] == []
    assert [f for f in frames if f.get("method") == "message.send" and f["params"]["from"] == JUNIPER] == []
    assert len([r for r in hosted.model_requests() if _kind(r.body) == "speak"]) == 1
