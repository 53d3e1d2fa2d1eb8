"""The next turn starts while a line is still voiced, end to end: ``companion run --ws`` with two
companions in its own process, their model the fake OpenAI-compatible server streaming at a
hosted model's pace, and a WebSocket client that takes its time to say each sentence.

A speaker's line goes out as a ``message.send`` only once its last sentence was answered, so the
client holds that answer until the next turn's first model request (the next leader's states, or
the next speaker's prepared reply: both ask about the line) has reached the server, or for at
most a few seconds. Every line another companion answered must have seen that request first; and
never is one companion's sentence asked for while another's line is still unpublished.

The same holds on a server that answers one request at a time (llama-cpp-python), where the
only time the next turn's work can be done early is while the line before is heard: there it is
the next speaker's reply, prepared from the line's preview, its parameters and then its speech,
and never a request sent while another one is still being answered. With three companions a
line addresses two, so the next leader's states call goes out beside that reply's parameters:
two requests may wait there together, but a stream being written is never cut by another."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from support.fake_llm_server import PROFILES, FakeLLMServer, running_server
from support.voice import TRIO, VoiceModel, ask_over_ws, assert_one_voice, pair_home, voice_home

pytestmark = pytest.mark.integration

JUNIPER, PIM, OSTRA = "companion_juniper", "companion_pim", "companion_ostra"
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


def _assert_the_next_turn_began_while_each_line_was_voiced(
    frames: list[Any], companions: tuple[str, ...] = (JUNIPER, PIM)
) -> list[Any]:
    """Each line answered by another companion had the next turn's request at the server before
    its last sentence was answered, so before its ``message.send`` went out; and never were two
    companions voiced at once. The first two lines are two of ``companions``'. Returns the
    companions' lines."""
    lines = _lines(frames)
    speakers = [f["params"]["from"] for f in lines]
    assert len(set(speakers[:2])) == 2 and set(speakers[:2]) <= set(companions), speakers
    last_answers = [f for f in frames if f.get("_ahead") is not None]
    for line, answer in zip(lines[:-1], last_answers, strict=False):
        assert frames.index(answer) < frames.index(line)
        assert answer["_ahead"], f"nothing of the next turn started before {line['params']['id']} went out"
    assert_one_voice(frames)
    return lines


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
    _assert_the_next_turn_began_while_each_line_was_voiced(frames)


@pytest.fixture
def llama_cpp_python() -> Iterator[FakeLLMServer]:
    """The fake model server as llama-cpp-python: identified as it from its model list, one
    request at a time, nothing after a stream's finish chunk but ``[DONE]``. At the hosted pace
    (a real one on this machine's CPU takes seconds): what is tested is the order of events."""
    with running_server(profile=PROFILES["llama-cpp-python"], ttft=0.4, token_rate=60) as server:
        yield server


async def test_on_a_one_request_at_a_time_server_the_next_reply_is_prepared_while_a_line_is_voiced(
    tmp_path: Path, llama_cpp_python: FakeLLMServer
) -> None:
    """llama-cpp-python: each line's next speaker holds the line's preview and prepares its reply
    from it, parameters then speech, while the line is heard; its slot adopts that reply. Its
    requests wait for nobody: none reaches the server while another is answered (there one
    would cut the line being written short), and none is sent beside a message's states call."""
    server = llama_cpp_python
    server.push(*([VoiceModel()] * 40))
    async with pair_home(tmp_path, server, reads_param=True) as (_net, home, url):
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER, PIM])
            with trio.fail_after(60):
                frames = await _converse(ws, server, first, lines=3)
            # What the conversation sent; the stop that follows cancels requests (the server goes
            # on writing a cancelled answer until it notices), so what it sends is not counted.
            in_flight, asked = server.most_in_flight, server.model_requests()
        assert home.count("model_server", server="llama-cpp-python") >= 1
    lines = _assert_the_next_turn_began_while_each_line_was_voiced(frames)

    for line, reply in itertools.pairwise(lines):
        held = {"message_id": line["params"]["id"], "companion": reply["params"]["from"]}
        assert home.count("preview_held", **held) == 1
        assert home.count("reply_prepared", **held) == 1
        assert home.count("reply_prepared_adopted", **held) == 1
    assert home.count("reply_prepared", message_id="m-1") == 0  # not beside the states call
    assert home.count("reply_prepared_again") == 0  # the speech waited for the parameters

    assert in_flight == 1
    kinds = [
        {t["function"]["name"] for t in r.body.get("tools") or []} & {"set_params", "speak_with_voice"}
        for r in asked
    ]
    assert kinds.count({"set_params"}) >= 3 and kinds.count({"speak_with_voice"}) >= 3


async def test_three_companions_on_a_one_request_at_a_time_server_never_cut_each_others_lines(
    tmp_path: Path, llama_cpp_python: FakeLLMServer
) -> None:
    """llama-cpp-python with three companions in one process: every line addresses two others,
    so while it is heard the next leader's states call and (when one is likely: a line owes one
    of them a turn) the next speaker's prepared reply, its parameters then its speech, are both
    started from its preview. The server ends the
    stream in progress as soon as another request waits for its turn; a companion's line must
    never be cut so by its own neighbours (it would lose its last sentences:
    ``line_cut_stream_ended``), and the work ahead must still happen. Two requests may wait at
    the server together (the states call and the parameters, neither streamed): only a stream
    can be cut, so how many were in flight is not what is asserted."""
    server = llama_cpp_python
    # Four lines keep it short; twelve pass too (a line refused as a repeat closes its own
    # stream before its next try, and the server does not count a stream its client left as cut).
    server.push(*([VoiceModel()] * 40))
    async with voice_home(tmp_path, server, TRIO, reads_param=True) as (_net, home, url):
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER, PIM, OSTRA])
            with trio.fail_after(40):
                frames = await _converse(ws, server, first, lines=4)
            # Before the stop: it cancels requests, and a cancelled stream a queued request
            # follows is marked interrupted by the server although nobody reads it any more.
            interrupted = [r.body for r in server.model_requests() if r.interrupted]
        # the premise: each line's next leader asked for the states from its preview
        assert home.count("states_ahead_adopted") >= 3
        assert home.count("line_cut_stream_ended") == 0
    assert not interrupted, f"{len(interrupted)} answer(s) cut by another request"
    _assert_the_next_turn_began_while_each_line_was_voiced(frames, (JUNIPER, PIM, OSTRA))
