"""Streamed replies voiced a sentence at a time, end to end: ``companion run --ws`` in its own
process, its model a fake OpenAI-compatible server on 127.0.0.1 that streams at a hosted
model's pace (first token after 0.4 s, 60 tokens a second), and a WebSocket client that
answers ``speak`` queries as aikyo's clients do (it reads the body, ignores the extension)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from companion.lines.sentences import split_sentences
from support.cards import speaking_card, write_card
from support.fake_llm_server import CooperativeModel, FakeLLMServer, Reply, running_server, tool_call
from support.live import bridge_url, start_run
from support.live_bridge import blocking, message_frame
from support.network import network

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
PIM = "companion_pim"
LINES = (
    "The sea is calm tonight. I saw three boats, Dr. Ahn said 2.5 knots! Shall we sail?",
    "Fog rolls in slowly now. Mr. Vale logged 4.2 metres of swell off the point! Hear the bell?",
    "My lamp burns late again. Mrs. Ode counted 7.5 hours of rain! Will it clear by dawn?",
    "Gulls circle the pier. St. Anne's tower chimed at 6.15 sharp! Can you see it?",
    "Waves break on black rocks. Capt. Rook sailed 12.5 miles before noon! Was he brave?",
    "Stars fill the northern sky. Prof. Lin measured 0.3 degrees of drift! Does it matter?",
    "The tide turns at midnight. Dr. Saito swam 1.5 laps in the cove! Who goes next?",
    "Salt dries on my coat. Mr. Ibsen painted 3.5 metres of hull blue! Is it finished?",
)
"""Every line the model says, one per ``speak`` call in turn: each its own, since a companion
never says a line twice (``companion.lines.check``); each with an abbreviation and a decimal that must
not end a sentence."""
LINE = LINES[0]
CUT = 14
"""Tokens after which the cut answer breaks off: inside the line's second sentence."""


class VoiceModel(CooperativeModel):
    """States and parameters as :class:`CooperativeModel`; the ``n``-th line is ``LINES[n - 1]``
    through ``speak_with_voice``, and the answers listed in ``cut`` (by speak request, from 1)
    break off."""

    def __init__(self, cut: set[int] | None = None) -> None:
        super().__init__()
        self.cut = cut or set()
        self.speaks = 0

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        if "speak_with_voice" not in tools:
            return super().__call__(body)
        self.speaks += 1
        user = next((str(m.get("content")) for m in body["messages"] if m.get("role") == "user"), "")
        address = re.search(r"Address: (.*?)\.(?:\n|$)", user)
        to = [a.strip() for a in address.group(1).split(",")] if address else []
        line = LINES[(self.speaks - 1) % len(LINES)]
        reply = tool_call("speak_with_voice", {"message": line, "to": to, "emotion": "happy"})
        if self.speaks in self.cut:
            return Reply(calls=reply.calls, cut_after=CUT)
        return reply


@pytest.fixture
def hosted() -> Iterator[FakeLLMServer]:
    with running_server(ttft=0.4, token_rate=60) as server:
        yield server


async def _frames(
    ws: WebSocketConnection,
    answer: bool,
    until: str | None,
    timeout: float,
    first: str | None = None,
    speaking: float = 0.0,
) -> list[Any]:
    """Every frame until a ``message.send`` from ``until`` (any companion: ``None``); ``speak``
    queries answered after ``speaking`` seconds (the time to say the sentence) when ``answer``,
    never otherwise. ``first``: a frame already read. Each frame gets ``_at`` (when it came) and
    each answer is recorded as a frame ``{"_answered": id, "_at"}``."""
    frames: list[Any] = []

    async def say(query: Any) -> None:
        await trio.sleep(speaking)  # an aikyo client says the sentence, then answers
        result = {"jsonrpc": "2.0", "id": query["id"], "result": {"success": True, "body": {}}}
        await ws.send_message(json.dumps({"topic": "queries", "body": result}))
        frames.append({"_answered": query["id"], "_at": trio.current_time()})

    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:  # reading goes on while a sentence is said
            while True:
                frame = json.loads(first if first is not None else await ws.get_message())
                first = None
                frame["_at"] = trio.current_time()
                frames.append(frame)
                if frame.get("method") == "query.send" and answer:
                    nursery.start_soon(say, frame)
                sender = (
                    frame.get("params", {}).get("from", "") if frame.get("method") == "message.send" else ""
                )
                if sender.startswith("companion_") and until in (None, sender):
                    return frames
    raise AssertionError("unreachable")


def _queries(frames: list[Any]) -> list[Any]:
    return [f for f in frames if f.get("method") == "query.send" and f["params"]["type"] == "speak"]


async def _ask(ws: WebSocketConnection, text: str, msg_id: str, to: list[str]) -> str:
    """Send the message (again, same id, until something comes back: the clients' node joins the
    gossip mesh on a heartbeat); returns the first frame received."""
    for _attempt in range(10):
        await ws.send_message(message_frame("user_mika", to, text, msg_id))
        with trio.move_on_after(3):
            return str(await ws.get_message())
    raise AssertionError("nothing came back to the client's message")


async def test_a_streamed_line_is_voiced_a_sentence_at_a_time_then_published_whole(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    model = VoiceModel(cut={2})
    hosted.push(*([model] * 12))
    card = write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice"))
    args = ("--ws", "127.0.0.1:0", "--no-webrtc", "--model", "openai:fake-1", "--base-url")
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", [card], extra=(*args, hosted.openai_base_url))
        url = await blocking(bridge_url, home)
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            # 1. Sentences in order, each its own query with aikyo's body; the line last, whole.
            first = await _ask(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
            frames = await _frames(ws, answer=True, until=JUNIPER, timeout=30, first=first, speaking=0.5)
            queries = _queries(frames)
            answered = {f["_answered"]: f["_at"] for f in frames if "_answered" in f}
            for before, after in itertools.pairwise(queries):
                assert after["_at"] >= answered[before["id"]], "a sentence came while one was spoken"
            assert [q["params"]["body"]["message"] for q in queries] == split_sentences(LINE)
            assert all(set(q["params"]["body"]) == {"message", "emotion"} for q in queries)
            meta = [q["params"]["metadata"] for q in queries]
            assert [m["part"] for m in meta] == list(range(len(queries)))
            assert len({m["line"] for m in meta}) == 1
            assert meta[-1]["last"] is True and not any(m["last"] for m in meta[:-1])
            assert frames[-1]["params"]["message"] == LINE
            assert frames.index(queries[-1]) < len(frames) - 1

            # 2. The stream breaks off inside the second sentence: the first is said and is all
            # that is published; nothing half-formed is heard.
            first = await _ask(ws, "And the wind?", "m-2", [JUNIPER])
            frames = await _frames(ws, answer=True, until=JUNIPER, timeout=30, first=first)
            said = [q["params"]["body"]["message"] for q in _queries(frames)]
            assert said == split_sentences(LINES[1])[:1]
            assert frames[-1]["params"]["message"] == said[0]

            # 3. A client that never answers: the line still goes out, after one sentence's wait
            # and short waits for the others (never the whole voice deadline).
            started = trio.current_time()
            first = await _ask(ws, "Tell me again?", "m-3", [JUNIPER])
            frames = await _frames(ws, answer=False, until=JUNIPER, timeout=40, first=first)
            assert [q["params"]["body"]["message"] for q in _queries(frames)] == split_sentences(LINES[2])
            assert frames[-1]["params"]["message"] == LINES[2]
            assert trio.current_time() - started < 20
    assert hosted.model_requests() and all(
        r.body.get("stream") for r in hosted.model_requests() if "speak_with_voice" in json.dumps(r.body)
    )


async def test_two_companions_are_never_voiced_at_once(tmp_path: Path, hosted: FakeLLMServer) -> None:
    hosted.push(*([VoiceModel()] * 30))
    cards = [
        write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice")),
        write_card(tmp_path, "pim", speaking_card("pim", "Pim", "speak_with_voice")),
    ]
    args = ("--ws", "127.0.0.1:0", "--no-webrtc", "--model", "openai:fake-1")
    with network(tmp_path) as net:
        home = await blocking(
            start_run, net, "home", cards, extra=(*args, "--base-url", hosted.openai_base_url)
        )
        url = await blocking(bridge_url, home)
        async with open_websocket_url(f"{url}?topics=messages,queries") as ws:
            first: str | None = await _ask(ws, "Juniper and Pim, how is the sea?", "m-1", [JUNIPER, PIM])
            frames: list[Any] = []
            with trio.move_on_after(60):
                while sum(f.get("method") == "message.send" for f in frames) < 3:
                    frames += await _frames(ws, answer=True, until=None, timeout=60, first=first)
                    first = None
    speaking: str | None = None  # whose line is being voiced
    for frame in frames:
        if frame.get("method") == "query.send":
            assert speaking in (None, frame["params"]["from"]), "two companions voiced at once"
            speaking = frame["params"]["from"]
        elif frame.get("method") == "message.send" and frame["params"]["from"] == speaking:
            speaking = None
    assert len(_queries(frames)) >= 2 * len(split_sentences(LINE))
