"""SIGTERM while a streamed line is being voiced: ``companion run --ws`` on the fake streaming
model server at a hosted model's pace, and a WebSocket client that says each sentence in its own
time before it answers, as a voice client does. The stop lands the moment the first sentence
reaches the client.

A client that says the line within the stop's grace hears it whole, and the message says it
whole. One that speaks slower (a long line, a slow voice) is past the grace with the line half
said: the line says no more and the message says what the client was given to say, sentence for
sentence; before, the reply was withdrawn, and what the person heard was in no message and no
store. With ``COMPANION_LOCAL_MODEL`` set, the slow client is tried on a real model server too.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.store.sqlite import Store
from support.fake_llm_server import FakeLLMServer
from support.live_bridge import blocking
from support.local_model import LOCAL_MODEL, local_model_name, needs_local_model
from support.network import Proc
from support.voice import CLOSED, LINE, VoiceModel, ask_over_ws, frames_until, juniper_home, speak_queries

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
EXIT_WITHIN = 15.0
"""The stop's deadlines: 3 s of grace, the reply's publish, the nodes' close."""


async def _stopped_while_voiced(ws: Any, home: Proc, speaking: float, *, written: bool = False) -> list[Any]:
    """Juniper asked; SIGTERM once its first sentence arrives (``written``: once the model has
    written the whole line too, so its preview went out before the stop); every sentence
    answered after ``speaking`` seconds until the bridge closes: the frames the client got."""

    async def stop_once_written() -> None:
        await blocking(home.event, "model_request", 30, purpose="speak")
        await trio.sleep(0.2)  # the preview goes out as the line ends
        home.signal(signal.SIGTERM)

    def stop_at_the_first(frames: list[Any]) -> None:
        if len(speak_queries(frames)) == 1:
            if written:
                nursery.start_soon(stop_once_written)
            else:
                home.signal(signal.SIGTERM)

    first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
    async with trio.open_nursery() as nursery:
        frames = await frames_until(
            ws, True, CLOSED, EXIT_WITHIN + 15, first, speaking=speaking, on_query=stop_at_the_first
        )
    return frames


def _the_stop(home: Proc, frames: list[Any]) -> str:
    """What a failure needs to be read: the client's frames, and what the companion logged of
    its reply and of its stop (the bridge's clients, the publishes, the nodes)."""
    words = ("voice_line", "replied", "withdrawn", "publish", "stop", "client", "caught", "speak")
    logged = [line for line in home.lines if any(word in line for word in words)]
    got = [(f.get("method") or f.get("_answered"), round(f["_at"], 2)) for f in frames]
    return "frames: " + repr(got) + "\nlogged:\n" + "\n".join(logged[-40:])


def _stored_reply(data: Path) -> list[str]:
    with Store.in_directory(data / JUNIPER) as store:
        return [m.params.message for m in store.recent(100) if m.params.from_ == JUNIPER]


@pytest.mark.parametrize(
    ("speaking", "whole", "written"),
    [(0.3, True, False), (4.0, False, False), (4.0, False, True)],
    ids=["said-within-the-grace", "past-the-grace", "past-the-grace-line-written"],
)
async def test_sigterm_while_a_line_is_voiced_stores_what_was_heard(
    tmp_path: Path, hosted: FakeLLMServer, speaking: float, whole: bool, written: bool
) -> None:
    """``line-written``: the stop lands after the model wrote the whole line, so the reply's
    preview (the id the reply will have) went out before it; the stop took the reply for one
    sent before the stop and closed the client without waiting for it to read the reply."""
    hosted.push(*([VoiceModel()] * 6))
    async with (
        juniper_home(tmp_path, hosted) as (_net, home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        frames = await _stopped_while_voiced(ws, home, speaking, written=written)
        assert await blocking(home.reap, EXIT_WITHIN) == 0
    bad = [line for line in home.lines if "Traceback" in line or '"level": "error"' in line]
    assert bad == [], "\n".join(bad[:5])
    heard = [q["params"]["body"]["message"] for q in speak_queries(frames)]
    assert _stored_reply(tmp_path / "data-home") == [" ".join(heard)]
    # and the client read that message before the bridge closed
    sent = [f for f in frames if f.get("method") == "message.send" and f["params"]["from"] == JUNIPER]
    assert [f["params"]["message"] for f in sent] == [" ".join(heard)], _the_stop(home, frames)
    assert home.count("replied", message_id="m-1") == 1 and home.count("withdrawn") == 0
    if whole:
        assert " ".join(heard) == LINE and home.count("voice_line_cut_short") == 0
    else:
        assert 1 <= len(heard) < 3 and LINE.startswith(" ".join(heard))
        assert home.count("voice_line_cut_short", reason="stopping") == 1


@needs_local_model
@pytest.mark.timeout(300)
async def test_sigterm_while_a_real_models_line_is_voiced_stores_what_was_heard(tmp_path: Path) -> None:
    """Opt-in (``support.local_model``): the same with a real model server, its line whatever
    the model says, the client taking 4 s a sentence: the message and the history say what the
    client was given to say, and nothing else."""
    model = (f"openai:{local_model_name()}", LOCAL_MODEL)
    async with (
        juniper_home(tmp_path, None, model=model) as (_net, home, url),
        open_websocket_url(f"{url}?topics=messages,queries") as ws,
    ):
        frames = await _stopped_while_voiced(ws, home, 4.0)
        assert await blocking(home.reap, EXIT_WITHIN) == 0
    heard = " ".join(q["params"]["body"]["message"] for q in speak_queries(frames))
    print("heard:", heard)
    assert heard and _stored_reply(tmp_path / "data-home") == [heard]
    sent = [f for f in frames if f.get("method") == "message.send" and f["params"]["from"] == JUNIPER]
    assert [f["params"]["message"] for f in sent] == [heard]
