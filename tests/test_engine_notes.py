"""A tool's note reaches the model's next request of that turn, and nothing else: not a later
turn's requests, not the network, not the stored history. A real provider model over real HTTP
to the fake OpenAI-compatible server, which records every request as the server received it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import trio

from companion.app.group import MemoryGroup
from companion.engine.driver import EngineTimings
from companion.models.endpoints import ProviderConfig
from companion.models.providers import ProviderModel
from companion.protocol import encode
from support.engines import make_card
from support.fake_llm_server import CooperativeModel, Reply, running_server, tool_call
from support.routines import SECRET

TIMINGS = EngineTimings(
    states_timeout=5, publish_timeout=2, takeover_after=8, speak_timeout=10, reply_timeout=15
)


class RecallOnce(CooperativeModel):
    """Cooperative, but it looks something up first in each speaking request until one gets
    the answer (a prepared speech that is cancelled, held before its tool ran, gets none)."""

    def __init__(self) -> None:
        super().__init__()
        self.recalled = False
        self.answered = False

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        if "recall" in tools and "speak" in tools and not self.answered:
            if any(m.get("role") == "tool" for m in body.get("messages") or []):
                self.answered = True
            else:
                self.recalled = True
                return tool_call("recall", {})
        return super().__call__(body)


async def test_a_note_reaches_the_next_request_of_its_turn_only() -> None:
    card = make_card(0, max_turns=None, knowledge=("companions", "support.routines:recall"))
    with running_server(api_key="sk-test") as server:
        script = RecallOnce()
        server.push(*([script] * 30))
        model = ProviderModel(
            ProviderConfig(
                kind="openai", model_name="fake-1", api_key="sk-test", base_url=server.openai_base_url
            )
        )
        async with trio.open_nursery() as nursery, MemoryGroup(timings=TIMINGS) as group:
            member = await group.add(card, model)
            spy = group.hub.endpoint("spy")
            wire: list[bytes] = []

            async def watch() -> None:
                async for inbound in spy.receive_channel:
                    wire.append(encode(inbound.payload) if not isinstance(inbound.payload, list) else b"")

            nursery.start_soon(watch)
            for line in ("Hello there!", "And how was your day?"):
                before = len(group.transcript.events)
                await group.say(line)
                with trio.fail_after(30):
                    while not any(
                        e.kind == "message" and e.in_reply_to for e in group.transcript.events[before:]
                    ):
                        await trio.sleep(0.05)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        requests = [json.dumps(r.body) for r in server.model_requests()]
    assert script.recalled
    holding = [i for i, text in enumerate(requests) if SECRET in text]
    # The request right after the recall call carries the note (in the tool's answer) ...
    asked = next(i for i, text in enumerate(requests) if '"recall"' in text and '"tool_calls"' in text)
    assert holding and holding[0] == asked, (holding, asked)
    assert SECRET not in requests[asked - 1]
    # ... and no request of a later turn: its states, parameters and speech never see it.
    later = [i for i, text in enumerate(requests) if "And how was your day?" in text]
    assert len(later) >= 3 and not set(later) & set(holding), (later, holding)
    assert all(SECRET.encode() not in payload for payload in wire)
    assert all(SECRET not in m.params.message for m in member.engine.store.recent(50))
