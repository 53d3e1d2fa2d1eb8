"""The built-ins on an in-memory network with a fake client, and resolving tool references."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from companion.actions import (
    BUILTINS,
    ActionDef,
    ActionRuntime,
    KnowledgeDef,
    ToolNotFound,
    ToolResult,
    resolve_tool,
)
from companion.actions.builtins import (
    LIVE_LINE,
    PREVIEW,
    VOICE_PUBLISH_MARGIN,
    companions,
    sentence_wait,
    speak,
    speak_with_voice,
)
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult
from support.actions import ME, OTHER, answer, make_runtime, pump_results, run_client

SAY = {"message": "Good morning!", "to": ["user", OTHER.id], "emotion": "happy"}


def _expected_wire(message_id: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "message.send",
        "params": {
            "id": message_id,
            "from": ME.id,
            "to": ["user", OTHER.id],
            "message": "Good morning!",
            "metadata": {"emotion": "happy"},
        },
    }


async def _next(endpoint: MemoryEndpoint, topic: str) -> tuple[object, bytes]:
    with trio.fail_after(5):
        while True:
            inbound = await endpoint.receive_channel.receive()
            if inbound.topic == topic:
                return inbound.payload, inbound.raw


def _nothing_on(endpoint: MemoryEndpoint, topic: str) -> bool:
    while True:
        try:
            inbound = endpoint.receive_channel.receive_nowait()
        except trio.WouldBlock:
            return True
        if inbound.topic == topic:
            return False


async def test_speak_publishes_an_aikyo_message_with_the_emotion() -> None:
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak, publisher=node)
    result = await runtime.call("speak", SAY)
    assert result.ok
    payload, raw = await _next(client, MESSAGES)
    assert isinstance(payload, Message)
    assert json.loads(raw) == _expected_wire(payload.params.id)


async def test_speak_refuses_an_unknown_emotion_and_an_empty_message() -> None:
    runtime, recorder = make_runtime(speak)
    result = await runtime.call("speak", {"message": "", "to": ["user"], "emotion": "bored"})
    assert result.status == "invalid_input"
    assert {i.path for i in result.issues} == {"message", "emotion"}
    assert recorder.sent == []


async def _voice_call(
    runtime: ActionRuntime,
    node: MemoryEndpoint,
    client: MemoryEndpoint,
    reply: Callable[[Query], QueryResult] | None,
    *,
    budget: float = math.inf,
) -> tuple[ToolResult, Query]:
    """Run speak_with_voice, as a caller with ``budget`` seconds would (the engine's turn); the
    client sees the speak query and (unless reply is None) answers."""
    results: list[ToolResult] = []
    async with trio.open_nursery() as outer:
        outer.start_soon(pump_results, node, runtime)
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                with trio.move_on_after(budget):
                    results.append(await runtime.call("speak_with_voice", SAY))

            nursery.start_soon(run)
            query, _ = await _next(client, QUERIES)
            assert isinstance(query, Query)
            assert _nothing_on(client, MESSAGES), "the message must wait for the voice"
            if reply is not None:
                await client.publish(QUERIES, reply(query))
        outer.cancel_scope.cancel()
    assert results, f"the caller's budget of {budget} s cancelled the call"
    return results[0], query


async def test_speak_with_voice_waits_for_playback_then_speaks() -> None:
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    result, query = await _voice_call(runtime, node, client, lambda q: answer(q, body={"played": True}))
    assert result.ok
    assert query.params.type == "speak" and query.params.from_ == ME.id
    assert query.params.body == {"message": "Good morning!", "emotion": "happy"}  # aikyo's shape
    payload, raw = await _next(client, MESSAGES)
    assert isinstance(payload, Message)
    assert json.loads(raw) == _expected_wire(payload.params.id)
    assert runtime.pending_queries == 0


async def test_speak_with_voice_still_speaks_when_the_client_fails() -> None:
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    result, _ = await _voice_call(runtime, node, client, lambda q: QueryResult(id=q.id, error="no voice"))
    assert result.ok
    payload, _ = await _next(client, MESSAGES)
    assert isinstance(payload, Message) and payload.params.message == "Good morning!"


async def test_speak_with_voice_without_clients_speaks_after_the_voice_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    start = trio.current_time()
    result, _ = await _voice_call(runtime, node, client, None)
    assert result.ok
    # One sentence: its own wait, not the whole line's voice deadline.
    assert trio.current_time() - start == pytest.approx(sentence_wait("Good morning!"))
    payload, _ = await _next(client, MESSAGES)
    assert isinstance(payload, Message)


async def test_speak_with_voice_under_a_short_turn_budget_speaks_before_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The engine gives an offline speaker a few seconds for its whole turn; a voice slower than that
    (a page voicing a long line on a loaded machine) cost the companion its words: the turn's
    deadline cancelled the call while it waited 100 s for the voice."""
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    start = trio.current_time()
    result, _ = await _voice_call(runtime, node, client, None, budget=5.0)
    assert result.ok
    assert trio.current_time() - start == pytest.approx(5.0 - VOICE_PUBLISH_MARGIN)
    payload, _ = await _next(client, MESSAGES)
    assert isinstance(payload, Message) and payload.params.message == "Good morning!"


async def test_companions_lists_who_is_on_the_network() -> None:
    directory = {ME.id: ME}
    runtime, recorder = make_runtime(companions, directory=directory)
    directory[OTHER.id] = OTHER
    result = await runtime.call("companions", {"ignored": 1})
    assert result.for_model() == {
        "status": "ok",
        "output": {ME.id: ME.model_dump(by_alias=True), OTHER.id: OTHER.model_dump(by_alias=True)},
    }
    assert recorder.sent == []


def test_builtins_and_their_kinds() -> None:
    assert list(BUILTINS) == ["speak", "speak_with_voice", "companions"]
    assert isinstance(BUILTINS["speak"], ActionDef) and BUILTINS["speak"].topic == "messages"
    assert isinstance(BUILTINS["companions"], KnowledgeDef)
    assert speak_with_voice.timeout > 100  # the voice wait fits inside the action's own deadline


# --- resolve_tool -------------------------------------------------------------------------------------


def test_resolve_builtins_and_module_references() -> None:
    assert resolve_tool("speak") is speak
    assert resolve_tool(" companions ") is companions
    assert resolve_tool("companion.actions.builtins:speak_with_voice") is speak_with_voice


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("speek", "did you mean 'speak'"),
        ("dance", "no built-in tool"),
        ("no_such_pkg.tools:wave", "cannot import 'no_such_pkg.tools'"),
        ("companion.actions.builtins:wave", "has no attribute 'wave'"),
        ("companion.actions.builtins:SpeakInput", "not a tool"),
        (":wave", "expected 'package.module:attribute'"),
    ],
)
def test_unresolvable_references_say_why(ref: str, words: str) -> None:
    with pytest.raises(ToolNotFound, match=words) as info:
        resolve_tool(ref)
    assert "speak, speak_with_voice, companions" in str(info.value)
    assert info.value.ref == ref.strip()


def test_a_module_that_fails_to_import_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_tools_mod.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "nested_tools_mod.py").write_text(
        "from types import SimpleNamespace\n"
        "from companion.actions.builtins import speak\n"
        "ns = SimpleNamespace(tool=speak)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolNotFound, match="RuntimeError: boom at import"):
        resolve_tool("broken_tools_mod:anything")
    assert resolve_tool("nested_tools_mod:ns.tool") is speak


async def test_speak_with_voice_says_a_line_a_sentence_at_a_time_and_stops_when_interrupted() -> None:
    """One query per sentence, in order; a client that cuts one short (as the WebRTC voice
    answers a person's stop) gets no more of the line, and the message holds what was said."""
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    seen: list[Query] = []

    def respond(query: Query) -> QueryResult:
        cut = (query.params.metadata or {}).get("part") == 1
        return answer(query, success=not cut, body={"interrupted": True} if cut else {"spoken": True})

    line = {**SAY, "message": "Good morning! The tide is out. See you later."}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_results, node, runtime)
        nursery.start_soon(run_client, client, respond, seen)
        with trio.fail_after(10):
            result = await runtime.call("speak_with_voice", line)
        nursery.cancel_scope.cancel()
    assert result.ok
    assert [q.params.body for q in seen] == [
        {"message": "Good morning!", "emotion": "happy"},
        {"message": "The tide is out.", "emotion": "happy"},
    ]
    metas = [q.params.metadata or {} for q in seen]
    assert [m["part"] for m in metas] == [0, 1] and metas[0]["line"] == metas[1]["line"]
    [published] = [p for p in result.published if isinstance(p, Message)]
    assert published.params.message == "Good morning!"


async def test_speak_with_voice_hands_its_message_over_before_voicing_it() -> None:
    """The preview (``PREVIEW``) gets the very message, same id and text, before the first
    sentence is asked for; a line cut short keeps the id with the text said, so it differs."""
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)
    order: list[str] = []
    previews: list[Message] = []

    def preview(message: Message) -> None:
        order.append("preview")
        previews.append(message)

    def respond(query: Query) -> QueryResult:
        order.append(f"speak {(query.params.metadata or {}).get('part')}")
        cut = (query.params.metadata or {}).get("part") == 1
        return answer(query, success=not cut, body={"interrupted": True} if cut else {"spoken": True})

    lines = [SAY, {**SAY, "message": "Good morning! The tide is out. See you later."}]
    results = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_results, node, runtime)
        nursery.start_soon(run_client, client, respond, [])
        token = PREVIEW.set(preview)
        try:
            for line in lines:
                with trio.fail_after(10):
                    results.append(await runtime.call("speak_with_voice", line))
        finally:
            PREVIEW.reset(token)
        nursery.cancel_scope.cancel()
    assert order == ["preview", "speak 0", "preview", "speak 0", "speak 1"]
    whole, cut = (next(p for p in r.published if isinstance(p, Message)) for r in results)
    assert whole == previews[0]
    assert cut.params.id == previews[1].params.id and cut.params.message == "Good morning!"
    assert previews[1].params.message == lines[1]["message"]


class _SpentLine:
    """A live line that refused a line earlier in the reply and voices no more (``voices``
    false), or (``voicing``) that refuses this one at its first sentence."""

    refusal = "not said, because it repeats what you already said (\u201cGood morning!\u201d)."

    def __init__(self, voicing: bool) -> None:
        self.voicing = voicing

    def voices(self, tool_id: str) -> bool:
        return self.voicing

    async def finish(self, text: str, emotion: str, wait: float) -> str:
        return ""


@pytest.mark.parametrize("voicing", [True, False], ids=["its-refusal", "an-earlier-lines"])
async def test_speak_with_voice_refuses_with_the_live_lines_refusal_only_for_its_own_line(
    voicing: bool,
) -> None:
    """A line the live line refused is refused with that refusal (the model is asked fresh for
    another line); a line it did not voice, which the person cut short at its first sentence,
    is refused as unsaid, never with the refusal of an earlier line of the reply."""
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    runtime, _ = make_runtime(speak_with_voice, publisher=node)

    def cut(query: Query) -> QueryResult:
        return answer(query, success=False, body={"interrupted": True})

    token = LIVE_LINE.set(_SpentLine(voicing))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_results, node, runtime)
            nursery.start_soon(run_client, client, cut, [])
            with trio.fail_after(10):
                result = await runtime.call("speak_with_voice", SAY)
            nursery.cancel_scope.cancel()
    finally:
        LIVE_LINE.reset(token)
    assert result.status == "refused" and not result.published
    if voicing:
        assert result.message == _SpentLine.refusal
    else:
        assert result.message.startswith("nothing of that line was said")
