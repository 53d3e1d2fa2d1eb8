"""Streamed replies voiced a sentence at a time, end to end: ``companion run --ws`` in its own
process, its model a fake OpenAI-compatible server on 127.0.0.1 that streams at a hosted
model's pace (first token after 0.4 s, 60 tokens a second), and a WebSocket client that
answers ``speak`` queries as aikyo's clients do (it reads the body, ignores the extension)."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.lines.sentences import split_sentences
from support.fake_llm_server import FakeLLMServer
from support.network import Proc
from support.voice import (
    LINE,
    LINES,
    VoiceModel,
    ask_over_ws,
    assert_one_voice,
    frames_until,
    juniper_home,
    pair_home,
    speak_queries,
)

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
PIM = "companion_pim"


@asynccontextmanager
async def second_answer(
    tmp_path: Path, hosted: FakeLLMServer, question: str = "And now?"
) -> AsyncIterator[tuple[Proc, list[Any]]]:
    """Juniper asked twice over its bridge (``question`` the second time): its process, and the
    frames of its second answer."""
    async with (
        juniper_home(tmp_path, hosted) as (_net, home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
        await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)
        first = await ask_over_ws(ws, question, "m-2", [JUNIPER])
        yield home, await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)


async def test_a_streamed_line_is_voiced_a_sentence_at_a_time_then_published_whole(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    model = VoiceModel(cut={2})
    hosted.push(*([model] * 12))
    async with (
        juniper_home(tmp_path, hosted) as (_net, _home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        # 1. Sentences in order, each its own query with aikyo's body; the line last, whole.
        first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
        frames = await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first, speaking=0.5)
        queries = speak_queries(frames)
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
        first = await ask_over_ws(ws, "And the wind?", "m-2", [JUNIPER])
        frames = await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)
        said = [q["params"]["body"]["message"] for q in speak_queries(frames)]
        assert said == split_sentences(LINES[1])[:1]
        assert frames[-1]["params"]["message"] == said[0]

        # 3. A client that never answers: the line still goes out, after one sentence's wait
        # and short waits for the others (never the whole voice deadline).
        started = trio.current_time()
        first = await ask_over_ws(ws, "Tell me again?", "m-3", [JUNIPER])
        frames = await frames_until(ws, answer=False, until=JUNIPER, timeout=40, first=first)
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == split_sentences(LINES[2])
        assert frames[-1]["params"]["message"] == LINES[2]
        assert trio.current_time() - started < 20
    assert hosted.model_requests() and all(
        r.body.get("stream") for r in hosted.model_requests() if "speak_with_voice" in json.dumps(r.body)
    )


async def test_two_companions_are_never_voiced_at_once(tmp_path: Path, hosted: FakeLLMServer) -> None:
    hosted.push(*([VoiceModel()] * 30))
    async with (
        pair_home(tmp_path, hosted) as (_net, _home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        asked = "Juniper and Pim, how is the sea?"
        first: str | None = await ask_over_ws(ws, asked, "m-1", [JUNIPER, PIM])
        frames: list[Any] = []
        with trio.move_on_after(60):
            while sum(f.get("method") == "message.send" for f in frames) < 3:
                frames += await frames_until(ws, answer=True, until=None, timeout=60, first=first)
                first = None
    assert_one_voice(frames)
    assert len(speak_queries(frames)) >= 2 * len(split_sentences(LINE))


async def test_stage_directions_are_neither_voiced_nor_published(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """SmolLM2-135M opens most lines with "(Slightly)", puts "(Sighs in relief)" between
    sentences and opened five lines running with its own name, "Juniper, I am ..." (measured): a
    voice would read them out, and the model, reading its lines back, would write the next one
    the same way."""

    def directed(n: int) -> str:
        first, *rest = split_sentences(LINES[n - 1])
        return " ".join(["(Slightly) Juniper,", first, "(Sighs in relief)", *rest])

    hosted.push(*([VoiceModel(say=directed)] * 4))
    async with (
        juniper_home(tmp_path, hosted) as (_net, home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
        frames = await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == split_sentences(LINE)
        assert frames[-1]["params"]["message"] == LINE
        assert home.count("stage_direction_dropped") == 1


async def test_a_line_refused_at_its_first_sentence_stops_its_stream_and_is_never_heard(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """The second line begins with the first line's first sentence (a copy): nothing of it is
    voiced, its stream is closed at once rather than written on, and the model's next try is
    what the client hears and the message says."""
    hosted.push(*([VoiceModel(say=lambda n: LINE if n <= 2 else LINES[n - 1])] * 6))
    async with second_answer(tmp_path, hosted) as (home, frames):
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == split_sentences(LINES[2])
        assert frames[-1]["params"]["message"] == LINES[2]
        stopped = home.event("speak_stream_stopped", 10)
        assert LINE.startswith(stopped["written"]) and stopped["written"] != LINE  # before its end


HEARD = "The harbour bell rang twice at noon."
"""A sentence of the person's, which Juniper's line then says again."""


async def test_a_line_refused_at_a_later_sentence_is_published_as_heard_without_a_second_try(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """Its first sentence was heard, its second says the person's again: nothing more of it can
    be voiced, so its stream is closed there and the message says what was heard, with no
    second request (SmolLM2-135M wrote on to its token limit, then a second try nobody heard:
    the message came 1.8 s after the line was voiced, measured). (One's own earlier sentence
    there is one's to retell, as in a line written whole.)"""
    new = "Fog rolls in slowly now."
    copy = f"{new} {HEARD} {' '.join(f'More fog, hour {i}.' for i in range(20))}"
    model = VoiceModel(say=lambda n: LINE if n == 1 else copy if n == 2 else LINES[n - 1])
    hosted.push(*([model] * 6))
    async with second_answer(tmp_path, hosted, f"{HEARD} And now?") as (home, frames):
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == [new]
        assert frames[-1]["params"]["message"] == new
        stopped = home.event("speak_stream_stopped", 10)
        assert stopped["settled"] is True and copy.startswith(stopped["written"])
        assert len(stopped["written"]) < len(copy) // 2  # closed there, not written on
        assert home.count("line_refused") == 0
    assert model.speaks == 2


async def test_a_line_whose_last_sentence_is_refused_is_published_as_heard(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """Its last sentence says the person's again: the call is complete before that sentence is
    checked (it ends the line), so the check comes when the line is finished, after its first
    sentence was heard. The message says what was heard, and the model is not asked again."""
    new = "Fog rolls in slowly now."
    model = VoiceModel(say=lambda n: LINE if n == 1 else f"{new} {HEARD}" if n == 2 else LINES[n - 1])
    hosted.push(*([model] * 6))
    async with second_answer(tmp_path, hosted, f"{HEARD} And now?") as (home, frames):
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == [new]
        assert frames[-1]["params"]["message"] == new
        assert home.count("line_refused") == 0
    assert model.speaks == 2


async def test_a_line_refused_whole_after_some_was_heard_is_published_as_heard(
    tmp_path: Path, hosted: FakeLLMServer
) -> None:
    """Each sentence passes, but the whole line splices the person's own question back to them
    (a rule only a whole line can break), and its first sentences were heard already: what was
    heard is the line, at once, with no second try (one nobody could hear, and what was heard
    was published after it anyway: a request and a second lost)."""
    question = (
        "Tell me about the old lighthouse keeper who rowed out to the boats that came back late last winter."
    )
    splice = (
        "Ah, the old lighthouse keeper who rowed out. He met the boats that came back late. "
        "That was last winter, I think."
    )
    heard = split_sentences(splice)[:2]
    model = VoiceModel(say=lambda n: LINE if n == 1 else splice if n == 2 else LINES[n - 1])
    hosted.push(*([model] * 6))
    async with second_answer(tmp_path, hosted, question) as (home, frames):
        assert [q["params"]["body"]["message"] for q in speak_queries(frames)] == heard
        assert frames[-1]["params"]["message"] == " ".join(heard)
        settled = home.event("line_refused_after_heard", 10)
        assert settled["verdict"] == "copy" and settled["said"] == " ".join(heard)
        assert home.count("line_refused") == 0
    assert model.speaks == 2
