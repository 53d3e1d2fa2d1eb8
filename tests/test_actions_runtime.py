"""The one execution path: every status and code, first-wins settlement, registration at runtime."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal

import pytest
import trio
import trio.testing
from pydantic import BaseModel

from companion.actions import ActionContext, ActionDef, ActionRefused, ErrorCode, action, knowledge
from companion.protocol import ACTIONS, MESSAGES, QUERIES, Action, Message, Metadata, Query
from companion.store.history import InMemoryHistory
from support.actions import ME, OTHER, answer, make_runtime
from support.recorders import Sink


class Say(BaseModel):
    text: str
    to: list[str] = ["user"]


class Empty(BaseModel):
    pass


@action(id="say", description="Say a thing.", input=Say, topic="messages", timeout=5)
def say(ctx: ActionContext[Say]) -> Message:
    return Message.create(ctx.companion_id, ctx.input.to, ctx.input.text)


def _action(
    publish: Any, *, topic: Literal["messages", "actions"] = "actions", timeout: float = 5
) -> ActionDef:
    """An action named ``act`` with no input around ``publish``."""
    return action(id="act", description="Does it.", input=Empty, topic=topic, timeout=timeout)(publish)


# --- success --------------------------------------------------------------------------------------


async def test_ok_publishes_on_the_topic_and_records_the_history() -> None:
    history = InMemoryHistory()
    runtime, recorder = make_runtime(say, history=history)
    result = await runtime.call("say", {"text": "hello", "to": ["user", "companion_b"]}, call_id="c1")
    assert result.ok and result.status == "ok" and result.code is None
    assert result.call_id == "c1"
    [(topic, message)] = recorder.sent
    assert topic == MESSAGES
    assert isinstance(message, Message)
    assert message.params.from_ == ME.id and message.params.message == "hello"
    assert result.published == (message,)
    assert result.for_model() == {
        "status": "ok",
        "output": {
            "published": [{"topic": "messages", "id": message.params.id, "to": ["user", "companion_b"]}]
        },
    }
    assert history.recent(5) == [message]


async def test_async_publish_returning_a_list_publishes_in_order() -> None:
    async def publish(ctx: ActionContext[Empty]) -> list[Action]:
        await trio.lowlevel.checkpoint()
        return [Action.create(ctx.companion_id, "one", {}), Action.create(ctx.companion_id, "two", {})]

    runtime, recorder = make_runtime(_action(publish))
    result = await runtime.call("act", {})
    assert result.ok
    assert [a.params.name for a in recorder.on(ACTIONS)] == ["one", "two"]
    assert result.for_model()["output"] == {
        "published": [{"topic": "actions", "name": "one"}, {"topic": "actions", "name": "two"}]
    }


async def test_a_dict_is_validated_and_a_missing_message_id_is_filled() -> None:
    def publish(ctx: ActionContext[Empty]) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "method": "message.send",
            "params": {"from": ctx.companion_id, "to": ["user"], "message": "hi"},
        }

    runtime, recorder = make_runtime(_action(publish, topic="messages"))
    result = await runtime.call("act", {})
    assert result.ok
    [message] = recorder.on(MESSAGES)
    assert isinstance(message, Message) and len(message.params.id) == 36


async def test_unknown_input_keys_are_dropped() -> None:
    runtime, _ = make_runtime(say)
    result = await runtime.call("say", {"text": "hi", "volume": 11})
    assert result.ok


# --- failures, each with its code ------------------------------------------------------------------


async def test_not_found() -> None:
    runtime, recorder = make_runtime(say)
    result = await runtime.call("dance", {})
    assert result.status == "not_found" and result.code == ErrorCode.NOT_FOUND
    assert result.for_model()["code"] == -32003
    assert "dance" in result.message and "say" in result.message
    assert recorder.sent == []


async def test_invalid_input_lists_every_issue_and_the_handler_never_runs() -> None:
    ran = []

    class Two(BaseModel):
        a: int
        b: list[str]

    @action(id="two", description="d", input=Two)
    def two(ctx: ActionContext[Two]) -> list[Action]:
        ran.append(ctx.input)
        return []

    runtime, recorder = make_runtime(two)
    result = await runtime.call("two", {"a": "x", "b": ["ok", 3]})
    assert result.status == "invalid_input" and result.code == -32004
    assert [i.path for i in result.issues] == ["a", "b.1"]
    assert "2 problems" in result.message
    assert [i["path"] for i in result.for_model()["issues"]] == ["a", "b.1"]
    assert ran == [] and recorder.sent == []


async def test_refused_tells_the_model_why() -> None:
    def publish(ctx: ActionContext[Empty]) -> Action:
        raise ActionRefused("the light is already on; ask for another colour instead")

    runtime, recorder = make_runtime(_action(publish))
    result = await runtime.call("act", {})
    assert result.status == "refused" and result.code == -32005
    assert result.for_model()["message"] == "the light is already on; ask for another colour instead"
    assert recorder.sent == []


async def test_refusal_inside_the_handlers_own_nursery_is_still_a_refusal() -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        async def fail() -> None:
            raise ActionRefused("no")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
        raise AssertionError("unreachable")

    runtime, _ = make_runtime(_action(publish))
    result = await runtime.call("act", {})
    assert result.status == "refused" and result.message == "no"


async def test_a_raising_handler_is_an_internal_error_logged_with_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def publish(ctx: ActionContext[Empty]) -> Action:
        raise KeyError("secret detail")

    runtime, recorder = make_runtime(_action(publish))
    with caplog.at_level(logging.ERROR, logger="companion.actions"):
        result = await runtime.call("act", {})
    assert result.status == "internal_error" and result.code == -32603
    assert "secret detail" not in result.message and "KeyError" in result.message
    [record] = [r for r in caplog.records if getattr(r, "companion_event", "") == "tool_call_failed"]
    fields = record.companion_fields  # type: ignore[attr-defined]
    assert "secret detail" in fields["error"] and "Traceback" in fields["traceback"]
    assert recorder.sent == []


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        (None, "did publish forget to return"),
        (42, "int, not a Message"),
        (Message.create("companion_b", ["user"], "hi"), "must be from 'companion_a'"),
        (Message.create(ME.id, ["user"], "hi"), "carries Action"),
        ({"jsonrpc": "2.0", "method": "action.send", "params": {"from": ME.id}}, "malformed Action"),
    ],
)
async def test_a_bad_return_is_an_internal_error_naming_the_action(returned: Any, words: str) -> None:
    runtime, recorder = make_runtime(_action(lambda ctx: returned))
    result = await runtime.call("act", {})
    assert result.status == "internal_error"
    assert "'act'" in result.message
    assert recorder.sent == []


async def test_bad_return_reason_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    runtime, _ = make_runtime(
        _action(lambda ctx: Message.create("companion_b", ["u"], "x"), topic="messages")
    )
    with caplog.at_level(logging.ERROR, logger="companion.actions"):
        await runtime.call("act", {})
    errors = [r.companion_fields["error"] for r in caplog.records if hasattr(r, "companion_fields")]
    assert any("must be from 'companion_a'" in e for e in errors)


async def test_an_empty_list_publishes_nothing() -> None:
    runtime, recorder = make_runtime(_action(lambda ctx: []))
    result = await runtime.call("act", {})
    assert result.ok and result.output == {"published": []} and recorder.sent == []


async def test_publisher_failure_is_an_internal_error() -> None:
    runtime, _ = make_runtime(say, publisher=Sink(fail=ConnectionError("no peers")))
    result = await runtime.call("say", {"text": "hi"})
    assert result.status == "internal_error" and "could not publish" in result.message


async def test_a_hanging_publisher_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    runtime, _ = make_runtime(say, publisher=Sink(hang=True), publish_timeout=3)
    start = trio.current_time()
    result = await runtime.call("say", {"text": "hi"})
    assert result.status == "internal_error" and "could not publish" in result.message
    assert trio.current_time() - start == pytest.approx(3)


async def test_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    runtime, recorder = make_runtime(_action(publish, timeout=7))
    start = trio.current_time()
    result = await runtime.call("act", {})
    assert result.status == "timeout" and result.code == -32002
    assert trio.current_time() - start == pytest.approx(7)
    assert recorder.sent == [] and runtime.running == frozenset()


async def test_a_result_after_the_deadline_is_ignored(autojump_clock: trio.testing.MockClock) -> None:
    """The handler swallows the cancellation and returns anyway: the timeout came first."""

    async def publish(ctx: ActionContext[Empty]) -> Action:
        with contextlib.suppress(trio.Cancelled):  # a badly behaved handler
            await trio.sleep_forever()
        return Action.create(ctx.companion_id, "late", {})

    runtime, recorder = make_runtime(_action(publish, timeout=2))
    result = await runtime.call("act", {})
    assert result.status == "timeout"
    assert recorder.sent == []


async def test_an_error_raised_after_the_deadline_is_still_a_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("cleanup failed")

    runtime, _ = make_runtime(_action(publish, timeout=2))
    assert (await runtime.call("act", {})).status == "timeout"


async def test_cancel_a_running_call() -> None:
    entered = trio.Event()
    cleaned = []

    async def publish(ctx: ActionContext[Empty]) -> Action:
        entered.set()
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append(ctx.call_id)
        raise AssertionError("unreachable")

    runtime, recorder = make_runtime(_action(publish))
    results = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("act", {}, call_id="c9"))

        nursery.start_soon(run)
        await entered.wait()
        assert runtime.running == {"c9"}
        assert runtime.cancel("c9", "the user changed the subject")
    [result] = results
    assert result.status == "cancelled" and result.code == -32001
    assert "the user changed the subject" in result.message
    assert cleaned == ["c9"] and recorder.sent == []
    assert runtime.cancel("c9") is False


async def test_cancellation_during_a_query_cleans_up_and_drops_the_late_answer() -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await ctx.send_query("vision", {"what": "look"}, timeout=30)
        return Action.create(ctx.companion_id, "seen", {})

    runtime, recorder = make_runtime(_action(publish))
    results = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("act", {}, call_id="c1"))

        nursery.start_soon(run)
        query = await recorder.next_query()
        assert runtime.pending_queries == 1
        runtime.cancel("c1")
    assert results[0].status == "cancelled"
    assert runtime.pending_queries == 0
    assert runtime.deliver_query_result(answer(query)) is False
    assert recorder.on(ACTIONS) == []


async def test_the_callers_own_cancellation_propagates_and_leaves_nothing_pending() -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await ctx.send_query("vision", None, timeout=30)
        return Action.create(ctx.companion_id, "seen", {})

    runtime, recorder = make_runtime(_action(publish))
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as caller:

            async def cancel_when_asked() -> None:
                await recorder.next_query()
                caller.cancel()

            nursery.start_soon(cancel_when_asked)
            await runtime.call("act", {})
            raise AssertionError("the caller's cancellation must propagate")
    assert caller.cancelled_caught
    assert runtime.pending_queries == 0 and runtime.running == frozenset()
    assert recorder.on(ACTIONS) == []


async def test_duplicate_call_ids_are_a_bug() -> None:
    entered = trio.Event()

    async def publish(ctx: ActionContext[Empty]) -> Action:
        entered.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    runtime, _ = make_runtime(_action(publish))
    async with trio.open_nursery() as nursery:

        async def first() -> None:
            await runtime.call("act", {}, call_id="same")

        nursery.start_soon(first)
        await entered.wait()
        with pytest.raises(ValueError, match="already running"):
            await runtime.call("act", {}, call_id="same")
        nursery.cancel_scope.cancel()


# --- queries racing deadlines ---------------------------------------------------------------------


async def test_a_query_answered_in_time_wins(autojump_clock: trio.testing.MockClock) -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        reply = await ctx.send_query("vision", None, timeout=10)
        assert reply.result is not None
        return Action.create(ctx.companion_id, "saw", reply.result.body)

    runtime, recorder = make_runtime(_action(publish, timeout=5))
    async with trio.open_nursery() as nursery:

        async def client() -> None:
            query = await recorder.next_query()
            await trio.sleep(4.9)
            assert runtime.deliver_query_result(answer(query, body={"cat": 1}))
            assert not runtime.deliver_query_result(answer(query, body={"dog": 1}))  # duplicate

        nursery.start_soon(client)
        result = await runtime.call("act", {})
    assert result.ok
    [saw] = recorder.on(ACTIONS)
    assert saw.params.params == {"cat": 1}


async def test_a_query_answered_after_the_call_deadline_loses(autojump_clock: trio.testing.MockClock) -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await ctx.send_query("vision", None, timeout=10)
        return Action.create(ctx.companion_id, "saw", {})

    runtime, recorder = make_runtime(_action(publish, timeout=5))
    delivered = []
    async with trio.open_nursery() as nursery:

        async def client() -> None:
            query = await recorder.next_query()
            await trio.sleep(5.1)
            delivered.append(runtime.deliver_query_result(answer(query)))

        nursery.start_soon(client)
        result = await runtime.call("act", {})
    assert result.status == "timeout"
    assert delivered == [False] and recorder.on(ACTIONS) == []


async def test_an_unanswered_query_is_a_timeout_result(autojump_clock: trio.testing.MockClock) -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await ctx.send_query("vision", None, timeout=2)
        return Action.create(ctx.companion_id, "saw", {})

    runtime, recorder = make_runtime(_action(publish, timeout=5))
    start = trio.current_time()
    result = await runtime.call("act", {})
    assert result.status == "timeout" and result.code == -32002
    assert "'vision'" in result.message
    assert trio.current_time() - start == pytest.approx(2)
    [query] = recorder.on(QUERIES)
    assert isinstance(query, Query) and query.params.from_ == ME.id and query.params.type == "vision"
    assert runtime.pending_queries == 0


# --- the context --------------------------------------------------------------------------------------


async def test_the_context_carries_identity_network_history_and_call() -> None:
    history = InMemoryHistory()
    earlier = Message.create("user", [ME.id], "hi there")
    history.append(earlier)
    directory: dict[str, Metadata] = {ME.id: ME}
    seen: list[ActionContext[Any]] = []

    def publish(ctx: ActionContext[Empty]) -> list[Action]:
        seen.append(ctx)
        return []

    runtime, _ = make_runtime(_action(publish), directory=directory, history=history)
    directory[OTHER.id] = OTHER  # the view is live
    await runtime.call("act", {}, call_id="call-7")
    [ctx] = seen
    assert ctx.companion_id == ME.id and ctx.metadata == ME
    assert ctx.call_id == "call-7" and ctx.tool_id == "act"
    assert set(ctx.companions) == {ME.id, OTHER.id}
    assert list(ctx.history) == [earlier]
    with pytest.raises(TypeError):
        ctx.companions[OTHER.id] = ME  # type: ignore[index]


async def test_a_bad_query_timeout_is_a_handler_bug() -> None:
    async def publish(ctx: ActionContext[Empty]) -> Action:
        await ctx.send_query("x", None, timeout=-1)
        raise AssertionError("unreachable")

    runtime, _ = make_runtime(_action(publish))
    assert (await runtime.call("act", {})).status == "internal_error"


# --- knowledge ----------------------------------------------------------------------------------------


class City(BaseModel):
    city: str


async def test_knowledge_returns_its_output_to_the_model() -> None:
    @knowledge(id="weather", description="Weather.", input=City, output=dict[str, float])
    async def weather(ctx: ActionContext[City]) -> dict[str, float]:
        return {ctx.input.city: 21}

    runtime, recorder = make_runtime(weather)
    result = await runtime.call("weather", {"city": "Kyoto"})
    assert result.for_model() == {"status": "ok", "output": {"Kyoto": 21.0}}
    assert recorder.sent == []


async def test_knowledge_of_the_wrong_shape_is_an_internal_error() -> None:
    @knowledge(id="weather", description="Weather.", input=City, output=dict[str, float])
    def weather(ctx: ActionContext[City]) -> Any:
        return "sunny"

    runtime, _ = make_runtime(weather)
    result = await runtime.call("weather", {"city": "Kyoto"})
    assert result.status == "internal_error" and "wrong shape" in result.message


# --- registration while running -------------------------------------------------------------------------


async def test_register_and_unregister_while_running() -> None:
    entered, release = trio.Event(), trio.Event()

    async def slow(ctx: ActionContext[Empty]) -> Action:
        entered.set()
        await release.wait()
        return Action.create(ctx.companion_id, "done", {})

    runtime, recorder = make_runtime(say, _action(slow))
    assert [s.id for s in runtime.tool_specs()] == ["say", "act"]
    results = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await runtime.call("act", {}))

        nursery.start_soon(run)
        await entered.wait()
        assert runtime.unregister("act") is True
        assert runtime.unregister("act") is False
        assert [s.id for s in runtime.tool_specs()] == ["say"]
        assert (await runtime.call("act", {})).status == "not_found"
        release.set()
    assert results[0].ok  # the running call kept its handler
    assert [a.params.name for a in recorder.on(ACTIONS)] == ["done"]


async def test_register_refuses_duplicates_unless_replacing() -> None:
    runtime, _ = make_runtime(say)
    runtime.register(say)  # the same definition again is harmless
    other = action(id="say", description="Another.", input=Empty)(lambda ctx: [])
    with pytest.raises(ValueError, match="already registered"):
        runtime.register(other)
    runtime.register(other, replace=True)
    assert runtime.tools["say"] is other
    assert runtime.tool_specs()[0].description == "Another."
    with pytest.raises(TypeError):
        runtime.register("say")  # type: ignore[arg-type]


async def test_call_for_model_is_a_tool_caller() -> None:
    runtime, _ = make_runtime(say)
    assert (await runtime.call_for_model("say", {"text": "hi"}))["status"] == "ok"
    assert (await runtime.call_for_model("nope", {}))["code"] == -32003


async def test_a_failing_history_is_an_internal_error_not_a_crash() -> None:
    class BrokenHistory(InMemoryHistory):
        def recent(self, limit: int) -> list[Message]:
            raise OSError("disk gone")

    runtime, recorder = make_runtime(say, history=BrokenHistory())
    result = await runtime.call("say", {"text": "hi"})
    assert result.status == "internal_error" and "could not run" in result.message
    assert recorder.sent == [] and runtime.running == frozenset()


async def test_an_approval_query_that_cannot_be_sent_is_an_internal_error() -> None:
    guarded = action(id="guarded", description="d", input=Empty, requires_approval=True)(lambda ctx: [])
    runtime, _ = make_runtime(guarded, publisher=Sink(fail=ConnectionError("no peers")))
    result = await runtime.call("guarded", {})
    assert result.status == "internal_error" and runtime.pending_queries == 0
