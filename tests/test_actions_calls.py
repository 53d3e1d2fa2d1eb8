"""ActionContext.call: one tool running another through the same runtime, nested inside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from pydantic import BaseModel

from companion.actions import (
    MAX_CALL_DEPTH,
    ActionContext,
    ActionDef,
    ErrorCode,
    KnowledgeDef,
    ToolResult,
    action,
    knowledge,
)
from companion.memory import MemoryHub
from companion.protocol import ACTIONS, MESSAGES, QUERIES, Action, Message, Query, QueryResult
from companion.store.history import ConversationHistory, HistoryReader, InMemoryHistory
from support.actions import OTHER, answer, make_runtime, pump_results, run_client


class Empty(BaseModel):
    pass


class Name(BaseModel):
    name: str


class Next(BaseModel):
    tool: str


@knowledge(id="upper", description="Upper-case a name.", input=Name, output=str, timeout=5)
def upper(ctx: ActionContext[Name]) -> str:
    return ctx.input.name.upper()


def _caller(body: Any, *, id: str = "caller", timeout: float = 5, **kw: Any) -> ActionDef:
    """An action whose handler is ``body(ctx)`` (async), returning what it returns."""
    return action(id=id, description="Calls another tool.", input=Empty, timeout=timeout, **kw)(body)


# --- the callee runs through the same path ---------------------------------------------------------


async def test_a_call_returns_the_callees_typed_result() -> None:
    seen: list[ToolResult] = []

    async def body(ctx: ActionContext[Empty]) -> Action:
        seen.append(await ctx.call("upper", Name(name="ben")))
        seen.append(await ctx.call("upper", {"name": 3}))  # validated like any call
        seen.append(await ctx.call("nope"))
        return Action.create(ctx.companion_id, "shout", {"name": seen[0].output})

    runtime, recorder = make_runtime(_caller(body), upper)
    result = await runtime.call("caller", {})
    assert result.ok
    ok, bad, missing = seen
    assert ok.ok and ok.output == "BEN" and ok.tool_id == "upper" and ok.call_id != result.call_id
    assert bad.status == "invalid_input" and bad.issues[0].path == "name"
    assert missing.status == "not_found"
    assert [a.params.params for a in recorder.on(ACTIONS)] == [{"name": "BEN"}]
    assert runtime.running == frozenset()


async def test_what_a_callee_publishes_is_published_and_recorded() -> None:
    @action(id="say", description="Say.", input=Name, topic="messages", timeout=5)
    def say(ctx: ActionContext[Name]) -> Message:
        return Message.create(ctx.companion_id, [OTHER.id], f"hello {ctx.input.name}")

    async def body(ctx: ActionContext[Empty]) -> Action:
        said = await ctx.call("say", {"name": "Ben"})
        assert said.ok
        return Action.create(ctx.companion_id, "wave", {})

    history = InMemoryHistory()
    runtime, recorder = make_runtime(_caller(body), say, history=history)
    result = await runtime.call("caller", {})
    assert result.ok
    [message] = recorder.on(MESSAGES)
    assert history.recent(5) == [message]
    assert [type(e) for e in result.published] == [Action]  # the caller's own output only


# --- deadlines ------------------------------------------------------------------------------------


async def test_the_callee_never_outlives_its_caller(autojump_clock: trio.testing.MockClock) -> None:
    callee_deadline: list[float] = []
    cleaned: list[str] = []

    @action(id="slow", description="Slow.", input=Empty, timeout=60)
    async def slow(ctx: ActionContext[Empty]) -> Action:
        callee_deadline.append(ctx.deadline)
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append("slow")
        raise AssertionError("unreachable")

    async def body(ctx: ActionContext[Empty]) -> Action:
        await ctx.call("slow")
        return Action.create(ctx.companion_id, "never", {})

    runtime, recorder = make_runtime(_caller(body, timeout=5), slow)
    start = trio.current_time()
    result = await runtime.call("caller", {})
    assert result.status == "timeout" and result.code == ErrorCode.TIMEOUT
    assert trio.current_time() - start == pytest.approx(5)
    assert callee_deadline == [pytest.approx(start + 5)]  # the caller's, not its own 60 s
    assert cleaned == ["slow"]
    assert recorder.sent == [] and runtime.running == frozenset()


async def test_the_callees_own_shorter_limit_applies(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[ToolResult] = []

    @action(id="quick", description="Quick.", input=Empty, timeout=1)
    async def quick(ctx: ActionContext[Empty]) -> Action:
        await trio.sleep(30)
        raise AssertionError("unreachable")

    async def body(ctx: ActionContext[Empty]) -> Action:
        seen.append(await ctx.call("quick"))
        return Action.create(ctx.companion_id, "went_on", {})

    runtime, recorder = make_runtime(_caller(body, timeout=5), quick)
    start = trio.current_time()
    result = await runtime.call("caller", {})
    assert result.ok
    [timed_out] = seen
    assert timed_out.status == "timeout" and "idle limit 1 s" in timed_out.message
    assert trio.current_time() - start == pytest.approx(1)
    assert [a.params.name for a in recorder.on(ACTIONS)] == ["went_on"]


async def test_callee_progress_keeps_the_caller_alive_up_to_its_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @action(id="steady", description="Steady.", input=Empty, timeout=2, max_duration=100)
    async def steady(ctx: ActionContext[Empty]) -> Action:
        for step in range(1, 100):
            await trio.sleep(1)
            await ctx.progress(step)
        return Action.create(ctx.companion_id, "done", {})

    async def body(ctx: ActionContext[Empty]) -> Action:
        done = await ctx.call("steady")
        return Action.create(ctx.companion_id, "after", {"callee": done.status})

    # The caller's idle limit is 2 s, its cap 10 s: the callee's progress carries it to 10 s.
    runtime, _ = make_runtime(_caller(body, timeout=2, max_duration=10), steady)
    start = trio.current_time()
    result = await runtime.call("caller", {})
    assert result.status == "timeout"
    assert trio.current_time() - start == pytest.approx(10)


# --- cancellation ---------------------------------------------------------------------------------


@dataclass
class _Waiting:
    """A caller (``top``) whose callee ``waits`` blocks until cancelled."""

    runtime: Any
    recorder: Any
    entered: trio.Event = field(default_factory=trio.Event)
    cleaned: list[str] = field(default_factory=list)
    seen: list[ToolResult] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)


def _waiting() -> _Waiting:
    state: _Waiting

    @action(id="waits", description="Waits.", input=Empty, timeout=60)
    async def waits(ctx: ActionContext[Empty]) -> Action:
        state.entered.set()
        try:
            await trio.sleep_forever()
        finally:
            state.cleaned.append(ctx.call_id)
        raise AssertionError("unreachable")

    async def body(ctx: ActionContext[Empty]) -> Action:
        state.seen.append(await ctx.call("waits"))
        return Action.create(ctx.companion_id, "carried_on", {})

    state = _Waiting(*make_runtime(_caller(body, timeout=60), waits))
    return state


async def _cancel_while_waiting(state: _Waiting, which: str) -> None:
    async def run() -> None:
        state.results.append(await state.runtime.call("caller", {}, call_id="top"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(5):
            await state.entered.wait()
        assert len(state.runtime.running) == 2
        [callee_id] = state.runtime.running - {"top"}
        target = "top" if which == "caller" else callee_id
        assert state.runtime.cancel(target, f"{which} not needed")


async def test_cancelling_the_caller_reaches_the_callee() -> None:
    state = _waiting()
    await _cancel_while_waiting(state, "caller")
    [result] = state.results
    assert result.status == "cancelled" and "caller not needed" in result.message
    assert len(state.cleaned) == 1 and state.seen == []  # cancelled inside, never settled
    assert state.runtime.running == frozenset() and state.recorder.sent == []


async def test_cancelling_only_the_callee_gives_the_caller_a_result() -> None:
    state = _waiting()
    await _cancel_while_waiting(state, "callee")
    assert state.results[0].ok
    [seen] = state.seen
    assert seen.status == "cancelled" and seen.call_id == state.cleaned[0]
    assert [a.params.name for a in state.recorder.on(ACTIONS)] == ["carried_on"]


# --- cycles and depth -----------------------------------------------------------------------------


async def test_a_cycle_is_refused_with_a_stable_code() -> None:
    seen: dict[str, ToolResult] = {}

    def calling(me: str, other: str) -> ActionDef:
        async def body(ctx: ActionContext[Empty]) -> list[Action]:
            seen[me] = await ctx.call(other)
            return []

        return action(id=me, description=f"{me} calls {other}.", input=Empty, timeout=5)(body)

    runtime, _ = make_runtime(calling("ping", "pong"), calling("pong", "ping"), calling("self", "self"))
    assert (await runtime.call("ping", {})).ok
    refused = seen["pong"]
    assert (
        refused.status == "call_cycle"
        and refused.code == ErrorCode.CALL_CYCLE
        and ErrorCode.CALL_CYCLE.value == -32006
    )
    assert "ping -> pong -> ping" in refused.message
    assert refused.for_model()["code"] == -32006
    assert seen["ping"].ok  # pong itself finished: it got a result, not an exception
    assert (await runtime.call("self", {})).ok
    assert seen["self"].status == "call_cycle"


async def test_a_chain_deeper_than_the_limit_is_refused() -> None:
    reached: list[int] = []

    def link(index: int) -> ActionDef:
        async def body(ctx: ActionContext[Empty]) -> list[Action]:
            reached.append(index)
            below = await ctx.call(f"t{index + 1}")
            ctx.note(f"t{index + 1}: {below.status}")
            if below.status == "call_too_deep":
                ctx.note(below.message)
            return []

        return action(id=f"t{index}", description="A link.", input=Empty, timeout=5)(body)

    tools = [link(i) for i in range(MAX_CALL_DEPTH + 3)]
    runtime, _ = make_runtime(*tools)
    result = await runtime.call("t0", {})
    assert result.ok
    assert reached == list(range(MAX_CALL_DEPTH + 1))  # the first call and MAX_CALL_DEPTH below it

    small, _ = make_runtime(*tools, max_call_depth=1)
    reached.clear()
    await small.call("t0", {})
    assert reached == [0, 1]


async def test_the_depth_refusal_names_the_chain() -> None:
    seen: list[ToolResult] = []

    async def body(ctx: ActionContext[Empty]) -> list[Action]:
        seen.append(await ctx.call("upper", {"name": "x"}))
        return []

    runtime, _ = make_runtime(_caller(body), upper, max_call_depth=0)
    assert (await runtime.call("caller", {})).ok
    assert (
        seen[0].status == "call_too_deep"
        and seen[0].code == ErrorCode.CALL_TOO_DEEP
        and ErrorCode.CALL_TOO_DEEP.value == -32007
    )
    assert "at most 0 deep (caller)" in seen[0].message


async def test_a_leaked_context_cannot_call_after_its_call_ended() -> None:
    leaked: list[ActionContext[Empty]] = []

    def body(ctx: ActionContext[Empty]) -> list[Action]:
        leaked.append(ctx)
        return []

    runtime, _ = make_runtime(_caller(body), upper)
    assert (await runtime.call("caller", {})).ok
    with pytest.raises(RuntimeError, match="after its call"):
        await leaked[0].call("upper", {"name": "x"})


# --- approval inside a nested call ----------------------------------------------------------------


class Light(BaseModel):
    room: str


@action(id="light", description="Switch a light.", input=Light, requires_approval=True, timeout=5)
def light(ctx: ActionContext[Light]) -> Action:
    return Action.create(ctx.companion_id, "light", {"room": ctx.input.room})


def _evening() -> tuple[ActionDef, list[ToolResult]]:
    seen: list[ToolResult] = []

    async def body(ctx: ActionContext[Empty]) -> Action:
        seen.append(await ctx.call("light", {"room": "porch"}))
        return Action.create(ctx.companion_id, "evening", {"light": seen[-1].status})

    return _caller(body, id="evening", timeout=30), seen


@pytest.mark.parametrize(("approved", "status"), [(True, "ok"), (False, "refused")])
async def test_approval_inside_a_nested_call_goes_to_clients_over_the_hub(
    approved: bool, status: str
) -> None:
    """A client on the hub sees the callee's approval question and answers it as bytes."""
    hub = MemoryHub()
    node, client = hub.endpoint("node"), hub.endpoint("client")
    evening, seen = _evening()
    runtime, _ = make_runtime(evening, light, publisher=node)
    asked: list[Query] = []

    def respond(query: Query) -> QueryResult | None:
        return answer(query, body={"approved": approved, "reason": "it is dark"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_client, client, respond, asked)
        nursery.start_soon(pump_results, node, runtime)
        with trio.fail_after(5):
            result = await runtime.call("evening", {})
        nursery.cancel_scope.cancel()
    assert result.ok
    assert [q.params.body["action"] for q in asked if q.params.body] == ["light"]
    assert asked[0].params.body is not None and asked[0].params.body["input"] == {"room": "porch"}
    assert seen[0].status == status
    assert runtime.pending_queries == 0


async def test_waiting_for_approval_never_passes_the_callers_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    evening, seen = _evening()
    evening = _caller(evening.publish, id="evening", timeout=3)
    runtime, recorder = make_runtime(evening, light, approval_timeout=120)
    start = trio.current_time()
    result = await runtime.call("evening", {})
    assert result.status == "timeout"
    assert trio.current_time() - start == pytest.approx(3)
    assert [q.params.type for q in recorder.queries()] == ["approval"]
    assert runtime.pending_queries == 0 and seen == []
    assert recorder.on(ACTIONS) == []
    assert all(topic == QUERIES for topic, _ in recorder.sent)


async def test_a_nested_knowledge_tool_is_typed_output() -> None:
    @knowledge(id="count", description="Count.", input=Empty, output=dict[str, int], timeout=5)
    def count(ctx: ActionContext[Empty]) -> dict[str, int]:
        return {"n": 3}

    got: list[Any] = []

    async def body(ctx: ActionContext[Empty]) -> list[Action]:
        got.append((await ctx.call("count")).output)
        return []

    assert isinstance(count, KnowledgeDef)
    runtime, _ = make_runtime(_caller(body), count)
    assert (await runtime.call("caller", {})).ok
    assert got == [{"n": 3}]


async def test_a_history_lent_read_only_is_read_and_never_written() -> None:
    """The engine records every message on arrival and lends the runtime a reader of it: what
    an action publishes reaches the publisher, and the history stays as its keeper left it."""

    @action(id="say", description="Say.", input=Name, topic="messages", timeout=5)
    def say(ctx: ActionContext[Name]) -> Message:
        assert [m.params.id for m in ctx.history] == ["kept"]
        return Message.create(ctx.companion_id, [OTHER.id], f"hello {ctx.input.name}")

    kept = InMemoryHistory()
    kept.append(Message.create(OTHER.id, ["companion_a"], "hi", id="kept"))
    reader = HistoryReader(kept)
    assert not isinstance(reader, ConversationHistory)
    runtime, recorder = make_runtime(say, history=reader)
    result = await runtime.call("say", {"name": "Ben"})
    assert result.ok and len(recorder.on(MESSAGES)) == 1
    assert [m.params.id for m in kept.recent(5)] == ["kept"]
