"""The documented examples run, and docs/actions.md shows them exactly as they are."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio
from actions_support import ME, answer, make_runtime

from companion.actions import ActionDef, ToolResult, resolve_tool
from companion.protocol import ACTIONS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "actions.md"


def _load(relative: str) -> ModuleType:
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("relative", ["examples/custom_action.py", "examples/lamp_action.py"])
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
        with trio.fail_after(5):
            while len(recorder.queries()) < 2:
                await recorder.sent.wait()
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
