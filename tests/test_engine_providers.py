"""The engine with a real provider model (OpenAI-compatible, over real HTTP on 127.0.0.1 to the
fake server): states by structured output, parameters, and the speak tool call round trip
through the action runtime, one HTTP request per model call, to ``terminal``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import trio

from companion.app.group import MemoryGroup
from companion.engine.driver import EngineTimings
from companion.engine.work import EngineEvent
from companion.models.endpoints import ProviderConfig
from companion.models.providers import ProviderModel
from support.engines import converse_over_http, make_card
from support.fake_llm_server import PROFILES, CooperativeModel, FakeLLMServer, Recorded, running_server

# Real time here: the model answers over real sockets, so a mock clock would jump past them.
TIMINGS = EngineTimings(
    states_timeout=5, publish_timeout=2, takeover_after=8, speak_timeout=10, reply_timeout=15
)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with running_server(api_key="sk-test") as srv:
        yield srv


def provider(srv: FakeLLMServer) -> ProviderModel:
    return ProviderModel(
        ProviderConfig(kind="openai", model_name="fake-1", api_key="sk-test", base_url=srv.openai_base_url)
    )


async def test_a_provider_conversation_reaches_terminal_with_two_requests_before_each_reply(
    server: FakeLLMServer,
) -> None:
    answers = CooperativeModel()
    server.push(*([answers] * 40))
    async with MemoryGroup(timings=TIMINGS) as group:
        for index in range(3):
            await group.add(make_card(index, max_turns=3), provider(server))
        opening = await group.say("Hello, everyone!")
        with trio.fail_after(60):
            assert await group.wait_until(lambda t: t.over, 60)
    replies = [e for e in group.transcript.events if e.kind == "message" and e.in_reply_to]
    assert [e.closing for e in replies] == ["none", "pre-closing", "closing"]
    assert replies[0].in_reply_to == opening.params.id
    assert all(e.text.startswith("Reply number") and e.emotion == "happy" for e in replies)
    assert group.transcript.double_speech == {}

    # One HTTP request per model call: states and speech for each reply, and the parameters of
    # every companion the message addresses, filled while the leader decides (so the speaker's
    # slot starts with its speech: two requests one after the other before the first words);
    # the final (terminal) turn needs no model at all. The likely speaker's speech starts with
    # the leader's states (prepared, held): once more when its parameters choose other
    # instructions than its guess, so at most two speak requests a reply.
    def tools(r: Recorded) -> set[str]:
        return {t["function"]["name"] for t in r.body.get("tools") or []}

    requests = server.model_requests()
    assert sum("set_states" in tools(r) for r in requests) == len(replies)
    speak = sum("speak" in tools(r) for r in requests)
    assert len(replies) <= speak <= 2 * len(replies), speak
    params = sum("set_params" in tools(r) for r in requests)
    assert len(replies) <= params <= 3 * len(replies), params
    assert len(requests) == len(replies) + speak + params
    first_speak = next(
        r for r in server.model_requests() if any(t["function"]["name"] == "speak" for t in r.body["tools"])
    )
    assert "Address: user_demo" in first_speak.body["messages"][-1]["content"]


@pytest.mark.parametrize(
    "profile",
    ["llama.cpp", "llama.cpp-jinja", "llama-cpp-python", "llama-cpp-python-fc", "ollama", "vllm"],
)
async def test_a_conversation_reaches_terminal_on_every_server(profile: str) -> None:
    """What a user of each server gets: the start-up check, then a conversation with replies
    addressed to companions that exist, to ``terminal``, whatever the server refuses or ignores."""
    with running_server(profile=PROFILES[profile]) as srv:
        srv.push(*([CooperativeModel()] * 60))
        group, _ = await converse_over_http(srv.openai_base_url, TIMINGS, 3, 60)
    replies = [e for e in group.transcript.events if e.kind == "message" and e.in_reply_to]
    assert len(replies) == 3
    assert len(srv.refusals()) <= 1  # a refused form is sent once, then never again


async def _one_reply(model: ProviderModel, on_event: Callable[[EngineEvent], None] | None = None) -> None:
    """One companion (card 0, at most two turns) answers "Hello there!" once."""
    async with MemoryGroup(timings=TIMINGS, on_engine_event=on_event) as group:
        await group.add(make_card(0, max_turns=2), model)
        await group.say("Hello there!")
        with trio.fail_after(30):
            assert await group.wait_until(
                lambda t: any(e.kind == "message" and e.in_reply_to for e in t.events), 30
            )


def _kinds(requests: list[Recorded]) -> list[str]:
    """Each model request by what it asked: ``states``, ``params`` or ``speak`` (by the output
    tool, or the grammar, it names)."""
    asked = [json.dumps([r.body.get("tools"), r.body.get("response_format")]) for r in requests]
    return ["states" if "set_states" in a else "params" if "set_params" in a else "speak" for a in asked]


async def test_the_speakers_parameters_and_speech_start_while_the_leader_decides() -> None:
    """One request before the first words: a companion addressed alone asks for its parameters
    and starts its speech (held) at once, beside its states call. Its first speech guesses the
    instructions (no parameters yet: the card's ``already_replied == false`` cannot match), the
    parameters choose another, so a second speech starts when they come, and that one speaks."""
    # nothing is answered before the three requests that go out together have all arrived: a
    # busy machine's delays cannot order them (a ttft alone did, once in a loaded run)
    with running_server(ttft=0.3, answer_together=3) as srv:
        srv.push(*([CooperativeModel()] * 6))
        await _one_reply(provider(srv))
    requests = srv.model_requests()
    kinds = _kinds(requests)
    assert sorted(kinds) == ["params", "speak", "speak", "states"]
    states, params = (requests[kinds.index(k)] for k in ("states", "params"))
    guessed, chosen = (r for r, k in zip(requests, kinds, strict=True) if k == "speak")
    assert states.answered is not None and params.answered is not None
    assert params.at < states.answered and states.at < params.answered  # side by side
    assert guessed.at < states.answered  # the speech starts beside them too
    assert "Continue the conversation." in json.dumps(guessed.body)
    assert chosen.at >= params.answered - 0.05  # the parameters chose other instructions
    assert "Introduce yourself." in json.dumps(chosen.body)


@pytest.mark.parametrize("profile", ["llama-cpp-python", "llama.cpp-jinja"])
async def test_a_serial_server_gets_the_speakers_two_requests_one_after_the_other(profile: str) -> None:
    """llama-cpp-python answers one request at a time, and so does llama.cpp's server run with one
    slot (its ``/props`` says so), so requests sent side by side only queue there. A message
    addressed to one companion gets no states request (the rules make it the speaker), no
    parameters ahead and no prepared speech: its parameters, then its speech. (Measured with
    SmolLM2 on 2 cores, llama.cpp's server with one slot: first words p50 3.92 s when it was
    asked side by side, 1.47 s one request after the other.)"""
    with running_server(profile=PROFILES[profile], slots=1) as srv:
        srv.push(*([CooperativeModel()] * 6))
        model = provider(srv)
        await model.check()
        assert model.serial and not (model.parallel_params or model.speculates or model.states_for_one)
        events: list[EngineEvent] = []
        await _one_reply(model, events.append)
    requests = srv.model_requests()
    assert _kinds(requests) == ["params", "speak"]
    params, speak = requests
    assert params.answered is not None and speak.at >= params.answered
    published = [e.fields for e in events if e.kind == "states_published"]
    assert published[0]["source"] == "one_addressee" and published[0]["states"][0]["state"] == "speak"


async def test_a_server_that_answers_side_by_side_is_asked_ahead() -> None:
    """The same start on a hosted-like server: its states, parameters and prepared speech."""
    with running_server(profile=PROFILES["vllm"]) as srv:
        model = provider(srv)
        await model.check()
        assert not model.serial and model.parallel_params and model.speculates and model.states_for_one
