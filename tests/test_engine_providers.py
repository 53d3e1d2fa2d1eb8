"""The engine with a real provider model (OpenAI-compatible, over real HTTP on 127.0.0.1 to the
fake server): states by structured output, parameters, and the speak tool call round trip
through the action runtime, one HTTP request per model call, to ``terminal``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from engine_support import make_card
from fake_llm_server import FakeLLMServer, Reply, running_server, tool_call

from companion.demo import MemoryGroup
from companion.engine import EngineTimings
from companion.models.endpoints import ProviderConfig
from companion.models.providers import ProviderModel

# Real time here: the model answers over real sockets, so a mock clock would jump past them.
TIMINGS = EngineTimings(
    states_timeout=5, publish_timeout=2, takeover_after=8, speak_timeout=10, reply_timeout=15
)


class FakeCompanions:
    """Answers every request the way a cooperative model would, from what the request shows."""

    def __init__(self) -> None:
        self.turn = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools", [])}
        prompt = body["messages"][-1]["content"]
        if "set_states" in tools:
            item = tools["set_states"]["parameters"]["properties"]["states"]["items"]
            ids = item["properties"]["companion_id"]["enum"]
            speaker = ids[self.turn % len(ids)]
            self.turn += 1
            states = [
                {
                    "companion_id": cid,
                    "state": "speak" if cid == speaker else "listen",
                    "importance": 7 if cid == speaker else 1,
                    "selected": False,
                    "closing": "none",
                }
                for cid in ids
            ]
            return tool_call("set_states", {"states": states})
        if "set_params" in tools:
            return tool_call("set_params", _fill(tools["set_params"]["parameters"]))
        address = re.search(r"Address: (.*)\.", prompt)
        to = [a.strip() for a in address.group(1).split(",")] if address else []
        return tool_call("speak", {"message": f"Reply number {self.turn}.", "to": to, "emotion": "happy"})


def _fill(schema: dict[str, Any]) -> Any:
    """The plainest value a JSON Schema accepts (first enum value, minimum, false, empty)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {name: _fill(sub) for name, sub in schema.get("properties", {}).items()}
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "array":
        return [_fill(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    return "something"


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with running_server(api_key="sk-test") as srv:
        yield srv


def provider(srv: FakeLLMServer) -> ProviderModel:
    return ProviderModel(
        ProviderConfig(kind="openai", model_name="fake-1", api_key="sk-test", base_url=srv.openai_base_url)
    )


async def test_a_provider_conversation_reaches_terminal_with_three_requests_per_turn(
    server: FakeLLMServer,
) -> None:
    answers = FakeCompanions()
    server.push(*([answers] * 40))
    async with trio.open_nursery() as nursery:
        group = MemoryGroup(nursery, timings=TIMINGS)
        for index in range(3):
            await group.add(make_card(index, max_turns=3), provider(server))
        opening = await group.say("Hello, everyone!")
        with trio.fail_after(60):
            assert await group.wait_until(lambda t: t.over, 60)
        nursery.cancel_scope.cancel()
    replies = [e for e in group.transcript.events if e.kind == "message" and e.in_reply_to]
    assert [e.closing for e in replies] == ["none", "pre-closing", "closing"]
    assert replies[0].in_reply_to == opening.params.id
    assert all(e.text.startswith("Reply number") and e.emotion == "happy" for e in replies)
    assert group.transcript.double_speech == {}
    # One HTTP request per model call: states, params and speech for each reply; the final
    # (terminal) turn needs no model at all.
    assert len(server.model_requests()) == 3 * len(replies)
    assert sorted(group.calls_per_turn().values()) == [3, 3, 3]
    first_speak = next(
        r for r in server.model_requests() if any(t["function"]["name"] == "speak" for t in r.body["tools"])
    )
    assert "Address: user_demo" in first_speak.body["messages"][-1]["content"]
