"""The next turn starts while a line is still voiced, end to end: ``companion run --ws`` with two
companions in its own process, their model the fake OpenAI-compatible server streaming at a
hosted model's pace, and a WebSocket client that takes its time to say each sentence.

A speaker's line goes out as a ``message.send`` only once its last sentence was answered, so the
client holds that answer until the next turn's first model request (the next leader's states, or
the next speaker's prepared reply: both ask about the line) has reached the server, or for at
most a few seconds. Every line another companion answered must have seen that request first; and
never is one companion's sentence asked for while another's line is still unpublished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from support.fake_llm_server import FakeLLMServer
from support.voice import VoiceModel, ask_over_ws, assert_one_voice, pair_home

pytestmark = pytest.mark.integration

JUNIPER, PIM = "companion_juniper", "companion_pim"
SAYING = 0.3
"""Seconds the client takes to say one sentence."""
HOLD = 3.0
"""Longest the client holds a line's last sentence waiting for the next turn's request (a
sentence may take 4 s at least before the voice goes on without it)."""


def _asked_about(server: FakeLLMServer, text: str) -> bool:
    return any(text in json.dumps(r.body, ensure_ascii=False) for r in server.model_requests())


def _lines(frames: list[Any]) -> list[Any]:
    return [f for f in frames if f.get("method") == "message.send" and f["params"]["from"] != "user_mika"]


async def _converse(ws: WebSocketConnection, server: FakeLLMServer, first: str, lines: int) -> list[Any]:
    """Every frame until ``lines`` companion lines came; each answer recorded as a frame
    ``{"_answered": query id, "_ahead": whether the next turn's request had started}``."""
    frames: list[Any] = []
    openings: dict[str, str] = {}  # a voiced line's id -> its first sentence

    async def say(query: Any) -> None:
        meta = query["params"].get("metadata") or {}
        body = query["params"]["body"]
        openings.setdefault(str(meta.get("line")), body["message"])
        await trio.sleep(SAYING)  # saying it
        ahead = None
        if meta.get("last"):
            opening = openings[str(meta.get("line"))]
            with trio.move_on_after(HOLD):
                while not _asked_about(server, opening):
                    await trio.sleep(0.05)
            ahead = _asked_about(server, opening)
        result = {"jsonrpc": "2.0", "id": query["id"], "result": {"success": True, "body": {}}}
        frames.append({"_answered": query["id"], "_ahead": ahead})
        await ws.send_message(json.dumps({"topic": "queries", "body": result}))

    text: str | None = first
    async with trio.open_nursery() as nursery:
        while len(_lines(frames)) < lines:
            frame = json.loads(text if text is not None else await ws.get_message())
            text = None
            frames.append(frame)
            if frame.get("method") == "query.send" and frame["params"]["type"] == "speak":
                nursery.start_soon(say, frame)
    return frames


async def test_the_next_turn_starts_while_a_line_is_voiced_and_never_over_it(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    hosted.push(*([VoiceModel()] * 40))
    async with pair_home(tmp_path, hosted) as (_net, home, url):
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER, PIM])
            with trio.fail_after(90):
                frames = await _converse(ws, hosted, first, lines=3)
        assert home.count("preview_held") >= 2 and home.count("states_ahead_adopted") >= 2
    lines = _lines(frames)
    speakers = [f["params"]["from"] for f in lines]
    assert speakers[:2] in ([JUNIPER, PIM], [PIM, JUNIPER])

    # Order of events: each line answered by another companion had the next turn's request at
    # the server before its last sentence was answered, so before its message.send went out.
    last_answers = [f for f in frames if f.get("_ahead") is not None]
    for line, answer in zip(lines[:-1], last_answers, strict=False):
        assert frames.index(answer) < frames.index(line)
        assert answer["_ahead"], f"nothing of the next turn started before {line['params']['id']} went out"

    assert_one_voice(frames)
