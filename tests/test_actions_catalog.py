"""Registry changes are announced with the full tool list; the suggested wire form stays aikyo-safe."""

from __future__ import annotations

import json
import logging

import pytest
import trio
from pydantic import BaseModel

from companion.actions import (
    TOOLS_ACTION,
    ActionContext,
    ToolInfo,
    ToolsChanged,
    action,
    knowledge,
    tools_action,
)
from companion.actions.builtins import companions, speak
from companion.actions.catalog import MAX_ANNOUNCED_TOOLS
from companion.memory import MemoryHub
from companion.protocol import ACTIONS, MAX_PAYLOAD_BYTES, Action, Metadata, encode, parse_payload
from support.actions import ME, make_runtime


class Empty(BaseModel):
    pass


@action(id="wave", description="Wave.", input=Empty, timeout=5)
def wave(ctx: ActionContext[Empty]) -> Action:
    return Action.create(ctx.companion_id, "wave", {})


@action(id="wave", description="Wave twice.", input=Empty, timeout=5)
def wave_twice(ctx: ActionContext[Empty]) -> list[Action]:
    return [Action.create(ctx.companion_id, "wave", {})] * 2


def test_register_replace_and_remove_each_announce_the_full_list() -> None:
    runtime, _ = make_runtime(speak, companions)
    assert runtime.tool_list() == (
        ToolInfo("speak", speak.description, "action"),
        ToolInfo("companions", companions.description, "knowledge"),
    )
    events: list[ToolsChanged] = []
    unsubscribe = runtime.on_tools_changed(events.append)
    start = runtime.tools_revision

    runtime.register(wave)
    runtime.register(wave)  # the same definition again changes nothing
    runtime.register(wave_twice, replace=True)
    assert runtime.remove("wave") and not runtime.remove("wave")

    assert [(e.change, e.tool_id, e.revision - start) for e in events] == [
        ("registered", "wave", 1),
        ("replaced", "wave", 2),
        ("removed", "wave", 3),
    ]
    assert [t.id for t in events[0].tools] == ["speak", "companions", "wave"]
    assert events[1].tools[-1] == ToolInfo("wave", "Wave twice.", "action")
    assert [t.id for t in events[2].tools] == ["speak", "companions"]
    unsubscribe()
    runtime.register(wave)
    assert len(events) == 3
    assert runtime.unregister("wave")  # the earlier name still works, and announces too
    assert runtime.tools_revision == start + 5


def test_a_failing_listener_neither_blocks_the_change_nor_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime, _ = make_runtime()
    seen: list[int] = []

    def broken(event: ToolsChanged) -> None:
        raise RuntimeError("listener bug")

    runtime.on_tools_changed(broken)
    runtime.on_tools_changed(lambda e: seen.append(e.revision))
    with caplog.at_level(logging.ERROR, logger="companion.actions"):
        runtime.register(wave)
    assert "wave" in runtime.tools and seen == [1]
    [record] = [r for r in caplog.records if getattr(r, "companion_event", "") == "tools_listener_failed"]
    assert "listener bug" in record.companion_fields["error"]  # type: ignore[attr-defined]


async def test_the_announcement_reaches_a_client_on_the_actions_topic_as_bytes() -> None:
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak)
    sent: list[ToolsChanged] = []
    runtime.on_tools_changed(sent.append)
    runtime.register(wave)
    await node.publish(ACTIONS, tools_action(ME.id, sent[0]))
    with trio.fail_after(5):
        inbound = await client.receive_channel.receive()
    assert inbound.topic == ACTIONS and isinstance(inbound.payload, Action)
    params = inbound.payload.params
    assert params.name == TOOLS_ACTION == "companion.tools" and params.from_ == ME.id
    assert params.params == {
        "revision": 2,  # speak was the first change
        "tools": [
            {"id": "speak", "description": speak.description, "kind": "action"},
            {"id": "wave", "description": "Wave.", "kind": "action"},
        ],
        "change": {"kind": "registered", "tool": "wave"},
    }


def test_the_announcement_is_bounded_however_many_tools() -> None:
    many = tuple(ToolInfo(f"t{i}", "d" * 5_000, "action") for i in range(500))
    envelope = tools_action(ME.id, ToolsChanged(7, "registered", "t499", many))
    data = encode(envelope)
    assert len(data) < MAX_PAYLOAD_BYTES / 2
    assert isinstance(parse_payload(ACTIONS, data), Action)
    params = json.loads(data)["params"]["params"]
    assert len(params["tools"]) == MAX_ANNOUNCED_TOOLS and params["truncated"] is True
    assert len(params["tools"][0]["description"]) == 300


def test_the_companions_aikyo_metadata_is_untouched() -> None:
    runtime, _ = make_runtime(speak, wave)
    assert set(Metadata.model_fields) == {"id", "name", "personality", "story", "sample"}
    assert ME.model_dump() == {
        "id": ME.id,
        "name": ME.name,
        "personality": ME.personality,
        "story": ME.story,
        "sample": ME.sample,
    }
    assert runtime.tool_list()[-1].id == "wave"


@knowledge(id="k", description="K.", input=Empty, output=str)
def k(ctx: ActionContext[Empty]) -> str:
    return "k"


def test_a_knowledge_tool_is_listed_by_kind() -> None:
    runtime, _ = make_runtime(k)
    assert runtime.tool_list() == (ToolInfo("k", "K.", "knowledge"),)
