"""A streamed line's token usage in a real ``companion run``'s own log: the numbers its server
reported, or ``null`` from a server that sends no usage in a stream (llama-cpp-python ignores
``stream_options.include_usage``), never 0. The model is the fake OpenAI-compatible server in
the server's profile; a WebSocket client asks Juniper and waits for the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from trio_websocket import open_websocket_url

from companion.models.servers import ServerKind
from support.fake_llm_server import PROFILES, running_server
from support.live_bridge import blocking
from support.voice import VoiceModel, ask_over_ws, frames_until, juniper_home

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"


@pytest.mark.parametrize(("profile", "reported"), [("openai", True), ("llama-cpp-python", False)])
async def test_a_streamed_lines_tokens_are_the_servers_count_or_null(
    tmp_path: Path, profile: ServerKind, reported: bool
) -> None:
    with running_server(profile=PROFILES[profile]) as server:
        server.push(*([VoiceModel()] * 6))
        async with (
            juniper_home(tmp_path, server) as (_net, home, url),
            open_websocket_url(f"{url}?topics=messages,queries") as ws,
        ):
            first = await ask_over_ws(ws, "Juniper, how is the sea?", "m-1", [JUNIPER])
            frames = await frames_until(ws, answer=True, until=JUNIPER, timeout=30, first=first)
            assert frames[-1]["params"]["from"] == JUNIPER
            speak = await blocking(home.event, "model_request", purpose="speak")
        streamed = [r.body for r in server.model_requests() if r.body.get("stream")]
    assert speak["streamed"] is True and streamed
    assert all(body["stream_options"]["include_usage"] is True for body in streamed)
    if reported:
        assert speak["input_tokens"] == 11 and speak["output_tokens"] > 0  # the fake server's count
    else:
        assert speak["input_tokens"] is None and speak["output_tokens"] is None
