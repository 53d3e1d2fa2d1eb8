"""The documented examples run, and docs/actions.md shows them exactly as they are."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

from companion.actions import ActionDef, ActionRuntime, KeyValueStore, ToolResult, resolve_tool
from companion.card.model import load_card
from companion.card.routines import CompanionJoined, CompanionLeft, RoutineFinished, RoutineScheduler
from companion.memory import MemoryHub
from companion.protocol import ACTIONS, MESSAGES, Message
from companion.store.history import InMemoryHistory
from support.actions import ME, OTHER, answer, make_runtime

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "actions.md"


def _load(relative: str) -> ModuleType:
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "relative", ["examples/custom_action.py", "examples/lamp_action.py", "examples/greeter_action.py"]
)
def test_the_doc_shows_each_example_verbatim(relative: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- file: {re.escape(relative)} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"docs/actions.md has no block for {relative}"
    assert match.group(1) == (ROOT / relative).read_text(encoding="utf-8")


def test_the_ten_line_example_is_about_ten_lines() -> None:
    source = (ROOT / "examples/custom_action.py").read_text(encoding="utf-8")
    code = [line for line in source.splitlines() if line.strip() and not line.startswith('"""')]
    assert len(code) <= 10


async def test_the_ten_line_example_runs() -> None:
    wave = _load("examples/custom_action.py").wave
    assert isinstance(wave, ActionDef)
    runtime, recorder = make_runtime(wave)
    result = await runtime.call("wave", {"times": 2})
    assert result.ok
    [sent] = recorder.on(ACTIONS)
    assert sent.params.name == "wave" and sent.params.params == {"times": 2}
    assert sent.params.from_ == ME.id
    assert (await runtime.call("wave", {"times": 9})).status == "invalid_input"


def test_a_card_reference_resolves_to_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # as PYTHONPATH=examples does
    monkeypatch.delitem(sys.modules, "custom_action", raising=False)
    tool = resolve_tool("custom_action:wave")
    assert isinstance(tool, ActionDef) and tool.id == "wave"


async def _lamp(reply_to_lamps: bool) -> tuple[ToolResult, list[str]]:
    set_lamp = _load("examples/lamp_action.py").set_lamp
    runtime, recorder = make_runtime(set_lamp)
    results: list[ToolResult] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("set_lamp", {"room": "kitchen", "level": 30}))

        nursery.start_soon(run)
        approval = await recorder.next_query()
        assert approval.params.body is not None
        assert approval.params.body["preview"] == "set the kitchen lamp to 30%"
        runtime.deliver_query_result(answer(approval, body={"approved": True}))
        await recorder.until(lambda: len(recorder.queries()) >= 2, 5)
        lamps = recorder.queries()[-1]
        assert lamps.params.type == "lamps" and lamps.params.body == {"room": "kitchen"}
        runtime.deliver_query_result(answer(lamps, success=reply_to_lamps))
    return results[0], [a.params.name for a in recorder.on(ACTIONS)]


async def test_the_lamp_example_runs_after_approval() -> None:
    result, names = await _lamp(reply_to_lamps=True)
    assert result.ok and names == ["progress", "lamp"]


async def test_the_lamp_example_refuses_an_unknown_room() -> None:
    result, names = await _lamp(reply_to_lamps=False)
    assert result.status == "refused" and "no lamp in the kitchen" in result.message
    assert names == []


# --- the greeter: call, store, note and a routine -------------------------------------------------


async def _greet_on_join(kv: KeyValueStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One node's run: load the example card, let Ben join (and leave), do what the routine says.

    The greeting goes out over the in-memory hub; what Ben's endpoint receives is returned.
    """
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.delitem(sys.modules, "greeter_action", raising=False)
    loaded = load_card(ROOT / "examples" / "greeter.yaml")
    me = loaded.card.metadata
    hub = MemoryHub()
    node, ben = hub.endpoint(me.id), hub.endpoint(OTHER.id)
    directory = {me.id: me}
    runtime = ActionRuntime(
        metadata=me, publisher=node, directory=directory, history=InMemoryHistory(), kv=kv
    )
    for tool in loaded.tools.values():
        runtime.register(tool)
    now = trio.current_time()
    routines = RoutineScheduler(loaded.routines, me=me.id, now=now)
    directory[OTHER.id] = OTHER
    routines.observe(CompanionJoined(OTHER.id, OTHER.name), now)
    results: list[ToolResult] = []
    for firing in routines.due(now):
        results.append(await runtime.call(firing.tool, firing.input))
        routines.observe(RoutineFinished(firing.routine), now)
    routines.observe(CompanionLeft(OTHER.id, OTHER.name), now)
    [result] = results
    assert result.ok and result.notes and "visited" in result.notes[0]
    heard: list[str] = []
    with trio.fail_after(5):
        while len(heard) < 1:
            inbound = await ben.receive_channel.receive()
            if inbound.topic == MESSAGES and isinstance(inbound.payload, Message):
                assert inbound.payload.params.to == [OTHER.id]
                heard.append(inbound.payload.params.message)
    assert not any(result.notes[0] in text for text in heard)
    return heard


async def test_the_greeter_welcomes_a_newcomer_and_remembers_them_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "companion.sqlite3"
    with KeyValueStore.open(path) as kv:
        assert await _greet_on_join(kv, monkeypatch) == [f"Welcome, {OTHER.name}!"]
    with KeyValueStore.open(path) as kv:  # the node restarted: a new runtime on the same file
        assert await _greet_on_join(kv, monkeypatch) == [f"Good to see you again, {OTHER.name}."]
        assert kv.namespace("companion_wren", "welcome").get(OTHER.id) == 2
