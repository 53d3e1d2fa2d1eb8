"""What a small model gets wrong in the leader's seat, and the deadlines a local server gets.

Measured with SmolLM2-135M behind llama-cpp-python: the leader's model proposes ``pre-closing``
at random from the first turn, which ended the demo after two to four replies; it said that
everybody listens, and the conversation fell silent for good; and one request
took 19-41 s on two loaded cores, so the 20 s budget for states was cut on most turns while the
server computed on. Here the eager closer is the fake server (llama-cpp-python's profile, real
HTTP on 127.0.0.1), and the deadlines come from the server the start-up check identified.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing

from companion.app.group import MemoryGroup
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES, counted_proposal
from companion.conversation.state import ClosingSettings
from companion.engine.driver import EngineTimings
from companion.models.factory import engine_timings
from companion.models.providers import (
    DEFAULT_REQUEST_TIMEOUT,
    LOCAL_REQUEST_TIMEOUT,
    ProviderModel,
    resolve_config,
)
from companion.models.scripted import ScriptedModel
from companion.models.servers import EndpointMemory
from support.engines import HookedModel, converse_over_http, make_card
from support.fake_llm_server import PROFILES, CooperativeModel, Reply, running_server

# Real time: the model answers over real sockets.
TIMINGS = EngineTimings(
    states_timeout=5, publish_timeout=2, takeover_after=8, speak_timeout=10, reply_timeout=15
)


class EagerCloser(CooperativeModel):
    """Proposes ``pre-closing`` in every states answer, as SmolLM2-135M did from the first turn."""

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        reply = super().__call__(body)
        calls = tuple(
            (name, _closing(args) if name == "set_states" and isinstance(args, dict) else args)
            for name, args in reply.calls
        )
        text = reply.text
        if text is not None and text.startswith('{"speak"'):
            text = json.dumps(_closing(json.loads(text)))
        return dataclasses.replace(reply, calls=calls, text=text)


def _closing(args: dict[str, Any]) -> dict[str, Any]:
    return {**args, "closing": "pre-closing"}


class Silent(CooperativeModel):
    """Says that everybody listens (0 each), as SmolLM2-135M did on its second turn."""

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        reply = super().__call__(body)
        calls = tuple(
            (name, {"speak": [0 for _ in args["speak"]]} if name == "set_states" else args)
            for name, args in reply.calls
        )
        return dataclasses.replace(reply, calls=calls)


async def _converse(model: CooperativeModel, max_turns: int | None) -> list[Any]:
    """Three companions of one llama-cpp-python endpoint (the fake server), to ``terminal``."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(*([model] * 80))
        group, _ = await converse_over_http(srv.openai_base_url, TIMINGS, max_turns, 90)
    replies = [e for e in group.transcript.events if e.kind == "message" and e.in_reply_to]
    return replies


def test_a_proposal_counts_from_the_minimum_number_of_replies() -> None:
    held = [counted_proposal("pre-closing", floor="none", replies=r, min_replies=4) for r in range(6)]
    assert held == ["none"] * 4 + ["pre-closing"] * 2
    # the floor (turn limit, repetition, closing under way) is never held back
    assert counted_proposal("closing", floor="pre-closing", replies=0, min_replies=4) == "pre-closing"
    assert counted_proposal("none", floor="none", replies=0, min_replies=4) == "none"
    # from then on a model may begin closing, never skip a stage (pre-closing -> terminal)
    assert counted_proposal("terminal", floor="none", replies=0, min_replies=0) == "pre-closing"
    assert counted_proposal("terminal", floor="closing", replies=9, min_replies=4) == "closing"
    assert counted_proposal("terminal", floor="terminal", replies=9, min_replies=4) == "terminal"
    with pytest.raises(ValueError, match="min_replies"):
        ClosingSettings(min_replies=-1)


@pytest.mark.timeout(120)
async def test_a_model_that_proposes_closing_at_once_still_has_six_replies() -> None:
    """The eager closer leads every turn; the conversation runs ``DEFAULT_MIN_REPLIES`` open
    replies, then one ``pre-closing`` and one ``closing`` reply, then ``terminal``."""
    replies = await _converse(EagerCloser(), max_turns=None)
    assert DEFAULT_MIN_REPLIES == 4  # the demo's goal: at least 6 replies before terminal
    assert [e.closing for e in replies] == ["none"] * 4 + ["pre-closing", "closing"]


@pytest.mark.timeout(120)
async def test_a_model_that_says_everybody_listens_does_not_silence_the_conversation() -> None:
    replies = await _converse(Silent(), max_turns=3)
    assert [e.closing for e in replies] == ["none", "pre-closing", "closing"]


@pytest.mark.timeout(60)
async def test_local_servers_get_local_deadlines_and_others_do_not() -> None:
    memory = EndpointMemory()
    chosen, deadlines = {}, {}
    for profile in ("llama-cpp-python", "llama.cpp", "ollama", "vllm", "openai"):
        with running_server(profile=PROFILES[profile]) as srv:
            config = resolve_config("openai", "fake-1", base_url=srv.openai_base_url, environ={})
            model = ProviderModel(config, memory)
            unchecked = engine_timings([model])
            await model.check()
            chosen[profile] = engine_timings([model], pace=1.0)
            deadlines[profile] = model.request_timeout
        assert unchecked == EngineTimings.local()  # on a loopback address, before the check
    local, default = EngineTimings.local(pace=1.0), EngineTimings(pace=1.0)
    assert chosen == {
        "llama-cpp-python": local,
        "llama.cpp": local,
        "ollama": local,
        "vllm": default,
        "openai": default,
    }
    # a local server computes an abandoned request to its end: its requests get longer too
    assert deadlines == {
        "llama-cpp-python": LOCAL_REQUEST_TIMEOUT,
        "llama.cpp": LOCAL_REQUEST_TIMEOUT,
        "ollama": LOCAL_REQUEST_TIMEOUT,
        "vllm": DEFAULT_REQUEST_TIMEOUT,
        "openai": DEFAULT_REQUEST_TIMEOUT,
    }
    assert engine_timings([ScriptedModel(0), ScriptedModel(1)]) == EngineTimings.offline()
    remote = ProviderModel(
        resolve_config(
            "openai", "gpt-x", base_url="https://api.example.com/v1", environ={"OPENAI_API_KEY": "k"}
        )
    )
    assert engine_timings([ScriptedModel(0), remote]) == EngineTimings()


def test_local_deadlines_are_longer_and_keep_the_orderings() -> None:
    local, default = EngineTimings.local(pace=2.0), EngineTimings(pace=2.0)
    assert local.states_timeout > default.states_timeout and local.speak_timeout > default.speak_timeout
    assert local.states_timeout + local.publish_timeout < local.takeover_after
    assert local.pace + local.speak_timeout < local.reply_timeout


async def test_with_local_deadlines_a_hung_leader_and_a_hung_speaker_hand_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every local deadline is kept: a leader whose model never answers publishes rule-based
    states after ``states_timeout``, a speaker whose model never answers yields after
    ``speak_timeout``, and the next companion speaks."""
    timings = EngineTimings.local()
    hung: list[str] = []

    async def hang_once(request: Any) -> None:
        if len(hung) < 2:
            hung.append(type(request).__name__)
            await trio.sleep_forever()

    models = [HookedModel(ScriptedModel(i), on_states=hang_once, on_speak=hang_once) for i in range(3)]
    async with MemoryGroup(timings=timings) as group:
        for index, model in enumerate(models):
            await group.add(make_card(index, max_turns=None), model)
        start = trio.current_time()
        await group.say("Anyone there?")
        assert await group.wait_until(lambda t: t.reply_count >= 1, 600)
        took = trio.current_time() - start
    assert hung == ["StatesRequest", "SpeakRequest"]
    # the states deadline, then the speaking one, then the next speaker's (instant) reply
    assert took == pytest.approx(timings.states_timeout + timings.speak_timeout, abs=1.0)
    assert took < timings.takeover_after + timings.reply_timeout
