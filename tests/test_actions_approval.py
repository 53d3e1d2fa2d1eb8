"""Approval: the action runs only on an explicit yes; a denial, silence or a deadline stop it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from pydantic import BaseModel

from companion.actions import APPROVAL_QUERY, ActionContext, ActionDef, ToolResult, action
from companion.actions.approval import approval_body, read_approval
from companion.protocol import ACTIONS, Action, Query, QueryResult
from support.actions import answer, make_runtime
from support.recorders import Sink


class Light(BaseModel):
    room: str
    on: bool


def _light(ran: list[Light], preview: Any = None) -> ActionDef:
    @action(
        id="light",
        description="Switch a light.",
        input=Light,
        requires_approval=True,
        preview=preview,
    )
    def light(ctx: ActionContext[Light]) -> Action:
        ran.append(ctx.input)
        return Action.create(ctx.companion_id, "light", ctx.input.model_dump())

    return light


async def _call_and_answer(
    runtime: Any, recorder: Sink, reply: Any, raw: dict[str, Any] | None = None
) -> tuple[ToolResult, Query]:
    results: list[ToolResult] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("light", raw or {"room": "kitchen", "on": True}, call_id="c1"))

        nursery.start_soon(run)
        query = await recorder.next_query()
        if reply is not None:
            runtime.deliver_query_result(reply(query))
    return results[0], query


async def test_approved_runs_and_the_question_describes_only_the_input() -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran))
    result, query = await _call_and_answer(runtime, recorder, lambda q: answer(q, body={"approved": True}))
    assert result.ok and ran == [Light(room="kitchen", on=True)]
    assert query.params.type == APPROVAL_QUERY == "approval"
    assert query.params.body == {
        "call_id": "c1",
        "action": "light",
        "description": "Switch a light.",
        "side_effects": "write",
        "input": {"room": "kitchen", "on": True},
        "preview": 'light {"on": true, "room": "kitchen"}',
    }
    assert [a.params.name for a in recorder.on(ACTIONS)] == ["light"]
    assert runtime.pending_queries == 0


async def test_a_custom_preview_sees_the_input() -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(
        _light(ran, preview=lambda v: f"turn the {v.room} light {'on' if v.on else 'off'}")
    )
    _, query = await _call_and_answer(runtime, recorder, lambda q: answer(q, body={"approved": True}))
    assert query.params.body is not None
    assert query.params.body["preview"] == "turn the kitchen light on"


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (lambda q: answer(q, body={"approved": False, "reason": "it is night"}), "denied: it is night"),
        (lambda q: answer(q, body={"approved": "yes"}), "denied"),
        (lambda q: answer(q, body={}), "denied"),
        (lambda q: answer(q, success=False, body={"approved": True}), "denied"),
        (lambda q: QueryResult(id=q.id, error="no screen"), "error: no screen"),
    ],
)
async def test_anything_but_an_explicit_yes_is_a_denial(reply: Any, words: str) -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran))
    result, _ = await _call_and_answer(runtime, recorder, reply)
    assert result.status == "refused" and result.code == -32005
    assert words in result.message and "did not run" in result.message
    assert ran == [] and recorder.on(ACTIONS) == []


async def test_no_answer_times_out_and_nothing_runs(autojump_clock: trio.testing.MockClock) -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran), approval_timeout=30)
    start = trio.current_time()
    result, query = await _call_and_answer(runtime, recorder, None)
    assert result.status == "timeout" and result.code == -32002
    assert "no client answered" in result.message and "did not run" in result.message
    assert trio.current_time() - start == pytest.approx(30)
    assert ran == [] and recorder.on(ACTIONS) == []
    assert not runtime.deliver_query_result(answer(query, body={"approved": True}))  # too late


async def test_cancel_while_waiting_for_approval() -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran))
    results: list[ToolResult] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("light", {"room": "hall", "on": False}, call_id="c2"))

        nursery.start_soon(run)
        await recorder.next_query()
        runtime.cancel("c2")
    assert results[0].status == "cancelled" and ran == [] and runtime.pending_queries == 0


async def test_a_preview_that_raises_is_an_internal_error() -> None:
    def broken(value: Light) -> str:
        raise ZeroDivisionError

    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran, preview=broken))
    result = await runtime.call("light", {"room": "hall", "on": True})
    assert result.status == "internal_error" and ran == [] and recorder.sent == []


async def test_invalid_input_is_refused_before_anyone_is_asked() -> None:
    ran: list[Light] = []
    runtime, recorder = make_runtime(_light(ran))
    result = await runtime.call("light", {"room": "hall"})
    assert result.status == "invalid_input" and recorder.sent == []


def test_long_previews_are_cut() -> None:
    light = _light([], preview=lambda v: "x" * 2000)
    body = approval_body(light, Light(room="a", on=True), "c")
    assert len(body["preview"]) == 500


def test_read_approval_without_result() -> None:
    decision = read_approval(QueryResult(id="q"))
    assert not decision.approved and "no result" in decision.reason
