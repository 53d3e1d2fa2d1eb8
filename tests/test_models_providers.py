"""Real providers over real HTTP: a fake OpenAI-compatible (and Anthropic) server on 127.0.0.1.

Covers structured output (states, params) with the one retry, the speak tool-call round trip
and its request budget, deadlines, cancellation reaching the HTTP request, error messages, the
start-up check, and that an open trio-asyncio loop is reused rather than a second one started.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
import trio
import trio_asyncio

from companion.lines.check import NOT_SAID
from companion.models import aio
from companion.models.base import (
    ModelError,
    ToolInstruction,
    ToolSpec,
)
from companion.models.errors import ModelSetupError
from companion.models.providers import ProviderModel, resolve_config
from companion.protocol import Message
from support.fake_llm_server import (
    FakeLLMServer,
    free_port,
    hang,
    http_error,
    running_server,
    text,
    tool_call,
    tool_calls,
)
from support.models import (
    AYA,
    BEN,
    COMPANIONS,
    KAI,
    SPEAK,
    WAVE,
    ToolRecorder,
    anthropic_model,
    openai_model,
    params_request,
    speak_request,
    states_request,
)

ALL_STATES = {"speak": [5, 9, 0], "selected": [BEN.id]}
"""The leader's answer (``companion.models.structured.states_schema``): Aya and Ben want to
speak (Ben more, and asked to), Kai listens."""


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with running_server(api_key="sk-test") as srv:
        yield srv


def tool_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# --- structured output: states -------------------------------------------------------------------


async def test_states_come_from_one_structured_request(server: FakeLLMServer) -> None:
    server.push(tool_call("set_states", ALL_STATES))
    decisions = await openai_model(server).decide_states(states_request())

    assert [(d.companion_id, d.state, d.importance, d.selected) for d in decisions] == [
        (AYA.id, "speak", 5.0, False),
        (BEN.id, "speak", 9.0, True),
        (KAI.id, "listen", 0.0, False),
    ]
    [sent] = server.model_requests()
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "fake-1"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "set_states"}}
    [tool] = body["tools"]
    assert tool["function"]["name"] == "set_states"
    schema = tool["function"]["parameters"]
    assert schema["properties"]["speak"]["minItems"] == 3
    assert schema["properties"]["selected"]["items"]["enum"] == [AYA.id, BEN.id, KAI.id]
    system, user = body["messages"]
    # the rules stay in the system message; the tool to call comes with the task, last
    assert system["role"] == "system" and "turn-taking" in system["content"]
    assert user["content"].endswith("Call the set_states tool exactly once.")
    assert "Ben, what did you see at sea?" in user["content"] and "Kai" in user["content"]


async def test_states_respect_closing_floor_and_nomination(server: FakeLLMServer) -> None:
    server.push(
        tool_call(
            "set_states",
            {"speak": [0, 4, 0], "closing": "terminal"},
        )
    )
    decisions = await openai_model(server).decide_states(
        states_request(closing_floor="closing", nominated=BEN.id)
    )

    # the model's "terminal" is held at the floor: a model may begin closing, never move it on
    # (turns.closing.proposal_ceiling), one stage a turn
    assert [d.closing for d in decisions] == ["closing", "closing", "closing"]
    assert [d.selected for d in decisions] == [False, True, False]
    assert "mark it selected" in server.model_requests()[0].body["messages"][1]["content"]


async def test_invalid_states_are_sent_back_once_with_the_problems(server: FakeLLMServer) -> None:
    server.push(
        tool_call("set_states", {"speak": [3, 0, 42], "selected": ["companion_zed"]}),
        tool_call("set_states", ALL_STATES),
    )
    decisions = await openai_model(server).decide_states(states_request())

    assert [d.companion_id for d in decisions] == [AYA.id, BEN.id, KAI.id]
    _, second = server.model_requests()
    assistant = second.body["messages"][-2]
    [feedback] = tool_messages(second.body)
    assert feedback["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert "speak.2: Input should be less than or equal to 10" in feedback["content"]


async def test_states_fail_after_one_retry(server: FakeLLMServer) -> None:
    server.push(
        tool_call("set_states", {"speak": [], "selected": ["companion_zed"]}),
        tool_call("set_states", {"speak": []}),
    )
    with pytest.raises(ModelError, match=r"invalid answer after a retry.*no number for"):
        await openai_model(server).decide_states(states_request())
    assert len(server.model_requests()) == 2


async def test_no_companions_means_no_request(server: FakeLLMServer) -> None:
    assert await openai_model(server).decide_states(states_request(companions=[])) == []
    assert server.model_requests() == []


# --- structured output: params -------------------------------------------------------------------


async def test_params_are_validated_against_the_card_schema_and_retried_once(server: FakeLLMServer) -> None:
    server.push(
        tool_call("set_params", {"mood": "ecstatic", "interest": 3}),
        tool_call("set_params", {"mood": "curious", "interest": 0.8}),
    )
    values = await openai_model(server).fill_params(params_request())

    assert values == {"mood": "curious", "interest": 0.8}
    first, second = server.model_requests()
    [tool] = first.body["tools"]
    assert tool["function"]["name"] == "set_params"
    assert tool["function"]["parameters"]["properties"]["mood"]["enum"] == ["happy", "bored", "curious"]
    [feedback] = tool_messages(second.body)
    assert "'ecstatic' is not one of" in feedback["content"]
    # an out-of-range number is clamped by the speaker, not argued about: only the enum goes back
    assert "interest" not in feedback["content"]


async def test_params_written_as_json_text_are_accepted(server: FakeLLMServer) -> None:
    server.push(text('```json\n{"mood": "happy", "interest": 0.5}\n```'))
    assert await openai_model(server).fill_params(params_request()) == {"mood": "happy", "interest": 0.5}


async def test_params_broken_json_arguments_get_one_retry(server: FakeLLMServer) -> None:
    server.push(
        tool_call("set_params", '{"mood": "happy", '),
        tool_call("set_params", {"mood": "bored", "interest": 0}),
    )
    assert await openai_model(server).fill_params(params_request()) == {"mood": "bored", "interest": 0}
    [feedback] = tool_messages(server.model_requests()[1].body)
    assert "not a JSON object" in feedback["content"]


async def test_unusable_params_schema_is_refused_before_any_request(server: FakeLLMServer) -> None:
    with pytest.raises(ModelError, match="type 'object'"):
        await openai_model(server).fill_params(params_request({"type": "string"}))
    assert server.model_requests() == []


# --- the speaker's conversation as chat turns ---------------------------------------------------


def _said() -> list[Message]:
    """Ben answered once; the person asks again and Aya adds a line."""
    return [
        Message.create("user_1", [BEN.id], "Ben, what did you see at sea?"),
        Message.create(BEN.id, ["user_1"], "Whales, mostly."),
        Message.create("user_1", [BEN.id], "And birds?"),
        Message.create(AYA.id, [BEN.id], "Tell him about the gulls."),
    ]


async def test_the_speakers_history_goes_as_chat_turns_in_both_calls(server: FakeLLMServer) -> None:
    said = _said()
    server.push(tool_call("set_params", {"mood": "curious", "interest": 0.8}))
    server.push(tool_call("speak", {"message": "Gulls, loud ones.", "to": ["user_1"]}))
    model = openai_model(server)
    request = params_request()
    await model.fill_params(replace(request, message=said[-1], history=said))
    await model.speak(speak_request(message=said[-1], history=said), ToolRecorder())
    for sent in server.model_requests():
        messages = sent.body["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert messages[1]["content"] == "user_1: Ben, what did you see at sea?"
        assert messages[2]["content"] == "Whales, mostly."  # his own line, as his own turn
        last, heard = messages[3]["content"], f"user_1: And birds?\n{AYA.id}: Tell him about the gulls."
        assert last == heard or last.startswith(f"{heard}\n\n")  # the forced parameters call: no task
        assert "->" not in json.dumps(messages)  # no record for a small model to write on


async def test_a_long_conversations_prompts_keep_their_start_from_turn_to_turn(server: FakeLLMServer) -> None:
    """Past the history limit, each prompt still begins as the one before it: a window cut from
    the end slid by two messages a turn, and a server's prompt cache kept none of the
    conversation (SmolLM2-135M: 320-385 prompt tokens a turn instead of about 95, measured)."""
    said = [
        Message.create("user_1", [BEN.id], f"Question {n}?")
        if n % 2 == 0
        else Message.create(BEN.id, ["user_1"], f"Answer {n}.")
        for n in range(24)
    ]
    model = openai_model(server)
    sent = []
    for length in range(13, 24, 2):  # a person's question each time, Ben's answers between
        server.push(tool_call("speak", {"message": f"Answer {length}.", "to": ["user_1"]}))
        await model.speak(speak_request(message=said[length - 1], history=said[:length]), ToolRecorder())
        sent.append(server.model_requests()[-1].body["messages"])
    kept = [later[: len(earlier) - 1] == earlier[:-1] for earlier, later in itertools.pairwise(sent)]
    assert kept.count(False) <= 2, kept  # the window starts again at most every third turn
    assert all(len(messages) <= 2 + 11 for messages in sent)  # never more than the limit quoted


async def test_the_next_prompt_extends_the_last_one_and_its_line(server: FakeLLMServer) -> None:
    """The speaker's past turn is quoted as it was asked, task and all, then its line: the next
    prompt begins with the whole request before it, which a server's cache holds evaluated.
    Quoted without the task, the server evaluated the speaker's own line again every turn."""
    first = Message.create("user_1", [BEN.id], "Ben, what did you see at sea?")
    line = Message.create(BEN.id, ["user_1"], "Whales, mostly.")
    second = Message.create("user_1", [BEN.id], "And birds?")
    model = openai_model(server)
    server.push(text("Whales, mostly."))
    await model.speak(speak_request(message=first, history=[first]), ToolRecorder())
    server.push(text("Gulls, loud ones."))
    await model.speak(speak_request(message=second, history=[first, line, second]), ToolRecorder())
    [asked, then] = [sent.body["messages"] for sent in server.model_requests()]
    assert then[: len(asked)] == asked  # the whole first request, its task included
    assert then[len(asked)] == {"role": "assistant", "content": "Whales, mostly."}
    assert then[-1]["content"].startswith("user_1: And birds?\n\n")


async def test_anthropic_gets_the_speakers_history_as_chat_turns(server: FakeLLMServer) -> None:
    server.models = ("claude-fake",)
    said = _said()
    server.push(tool_call("speak", {"message": "Gulls, loud ones.", "to": ["user_1"]}))
    await anthropic_model(server).speak(speak_request(message=said[-1], history=said), ToolRecorder())
    [sent] = server.model_requests()
    assert [m["role"] for m in sent.body["messages"]] == ["user", "assistant", "user"]
    assert "Whales, mostly." in json.dumps(sent.body["messages"][1])


# --- speak: tool-call round trips ------------------------------------------------------------------


async def test_speak_action_call_ends_the_run_in_one_request(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": "Whales, mostly.", "to": ["user_1"], "emotion": "happy"}))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(), tools)

    assert tools.calls == [("speak", {"message": "Whales, mostly.", "to": ["user_1"], "emotion": "happy"})]
    [sent] = server.model_requests()
    assert [t["function"]["name"] for t in sent.body["tools"]] == ["speak", "companions"]
    assert sent.body["tools"][0]["function"]["parameters"] == SPEAK.input_schema
    system = sent.body["messages"][0]["content"]
    assert "You are Ben" in system and "a sailor" in system and "Hm. Fair." in system
    assert "Address: user_1" in sent.body["messages"][1]["content"]


async def test_speak_knowledge_round_trip_feeds_the_result_back(server: FakeLLMServer) -> None:
    def speak_from_result(body: Any) -> Any:
        [result] = tool_messages(body)
        names = json.loads(result["content"])["output"]
        return tool_call("speak", {"message": f"Hello {' and '.join(names)}!", "to": ["user_1"]})

    server.push(tool_call("companions", {}), speak_from_result)
    tools = ToolRecorder({"companions": {"status": "ok", "output": ["Aya", "Kai"]}})
    await openai_model(server).speak(speak_request(), tools)

    assert tools.calls == [("companions", {}), ("speak", {"message": "Hello Aya and Kai!", "to": ["user_1"]})]
    _, second = server.model_requests()
    assistant = second.body["messages"][-2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["function"]["name"] == "companions"
    [result] = tool_messages(second.body)
    assert result["tool_call_id"] == assistant["tool_calls"][0]["id"]


async def test_speak_follows_up_until_instructed_tools_are_used(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": "Hi!", "to": ["user_1"]}), tool_call("wave", {}))
    tools = ToolRecorder()
    request = speak_request(
        tools=[SPEAK, WAVE],
        instructions=[ToolInstruction("speak", "greet warmly"), ToolInstruction("wave", "wave at them")],
    )
    await openai_model(server).speak(request, tools)

    assert [c[0] for c in tools.calls] == ["speak", "wave"]
    assert "- wave: wave at them" in server.model_requests()[0].body["messages"][1]["content"]


async def test_an_action_runs_at_most_once_per_turn(server: FakeLLMServer) -> None:
    server.push(
        tool_calls(("speak", {"message": "One.", "to": []}), ("speak", {"message": "Two.", "to": []})),
    )
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(), tools)
    assert tools.calls == [("speak", {"message": "One.", "to": []})]
    assert len(server.model_requests()) == 1


async def test_a_follow_up_cannot_speak_twice(server: FakeLLMServer) -> None:
    server.push(
        tool_call("speak", {"message": "Hi!", "to": []}),
        tool_calls(("speak", {"message": "Hi again!", "to": []}), ("wave", {})),
    )
    tools = ToolRecorder()
    request = speak_request(
        tools=[SPEAK, WAVE],
        instructions=[ToolInstruction("speak", "greet"), ToolInstruction("wave", "wave")],
    )
    await openai_model(server).speak(request, tools)
    assert [c[0] for c in tools.calls] == ["speak", "wave"]
    assert len(server.model_requests()) == 2


async def test_an_unused_instructed_lookup_does_not_reopen_the_turn(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": "Hi!", "to": []}))
    tools = ToolRecorder()
    request = speak_request(
        instructions=[ToolInstruction("companions", "check who is here"), ToolInstruction("speak", "greet")]
    )
    await openai_model(server).speak(request, tools)
    assert [c[0] for c in tools.calls] == ["speak"]
    assert len(server.model_requests()) == 1


async def test_speak_parallel_calls_run_in_order_in_one_request(server: FakeLLMServer) -> None:
    server.push(tool_calls(("speak", {"message": "Hi!", "to": ["user_1"]}), ("wave", {})))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(tools=[SPEAK, WAVE]), tools)
    assert [c[0] for c in tools.calls] == ["speak", "wave"]
    assert len(server.model_requests()) == 1


async def test_speak_failed_action_is_shown_to_the_model_which_fixes_it(server: FakeLLMServer) -> None:
    refused: dict[str, Any] = {
        "status": "invalid_input",
        "code": -32004,
        "message": "to: must name a present companion",
    }
    server.push(
        tool_call("speak", {"message": "Hi!", "to": ["nobody"]}),
        tool_call("speak", {"message": "Hi!", "to": ["user_1"]}),
    )

    answers = iter([refused, {"status": "ok", "output": {}}])
    called: list[dict[str, Any]] = []

    async def runtime(tool_id: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
        called.append(dict(args))
        return next(answers)

    await openai_model(server).speak(speak_request(), runtime)
    assert [c["to"] for c in called] == [["nobody"], ["user_1"]]
    [result] = tool_messages(server.model_requests()[1].body)
    assert "must name a present companion" in result["content"]


async def test_speak_plain_text_is_said_through_the_speak_tool(server: FakeLLMServer) -> None:
    """A model that answers in prose instead of calling speak still reaches the runtime."""
    server.push(text("Ben: Whales!"))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(), tools)
    assert tools.calls == [("speak", {"message": "Whales!", "to": ["user_1"]})]
    assert len(server.model_requests()) == 1


class LineChecker:
    """The engine's line check as the model sees it: the first ``refusals`` lines are refused
    (as :meth:`companion.engine.speech.Speaker.refused_line` does), the rest said."""

    def __init__(
        self, refusals: int, reason: str = f"{NOT_SAID} repeats what was already said (“Hi”)."
    ) -> None:
        self.refusals, self.reason = refusals, reason
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, tool_id: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append((tool_id, dict(args)))
        if len(self.calls) <= self.refusals:
            return {"status": "refused", "message": self.reason}
        return {"status": "ok", "output": {"published": True}}


async def test_a_refused_line_is_asked_for_again_in_a_fresh_request(server: FakeLLMServer) -> None:
    """Never a follow-up (SmolLM2 read the retry's framing aloud): the same prompt, the refusal
    folded into its task without quoting anything, another sampling seed."""
    server.push(
        tool_call("speak", {"message": "Hi all!", "to": ["user_1"]}),
        tool_call("speak", {"message": "Whales, mostly.", "to": ["user_1"]}),
    )
    tools = LineChecker(refusals=1)
    await openai_model(server).speak(speak_request(), tools)
    assert [args["message"] for _, args in tools.calls] == ["Hi all!", "Whales, mostly."]
    first, second = (r.body for r in server.model_requests())
    assert [m["role"] for m in second["messages"]] == [m["role"] for m in first["messages"]]
    assert not tool_messages(second) and "seed" in second and "seed" not in first
    task = second["messages"][-1]["content"]
    assert task.startswith(first["messages"][-1]["content"])
    added = task[len(first["messages"][-1]["content"]) :]
    assert "repeated a line that was already said" in added and "Hi all!" not in added
    assert NOT_SAID not in added


async def test_after_two_refused_lines_a_line_of_the_card_is_said(server: FakeLLMServer) -> None:
    server.push(
        tool_call("speak", {"message": "Hi all!", "to": ["user_1"]}),
        tool_call("speak", {"message": "Hi all!", "to": ["user_1"]}),
    )
    tools = LineChecker(refusals=2, reason=f"{NOT_SAID} reads a heading of your instructions aloud.")
    await openai_model(server).speak(speak_request(), tools)
    assert len(server.model_requests()) == 2
    (_, said) = tools.calls[-1]
    assert len(tools.calls) == 3 and said["message"] not in ("Hi all!", "")
    assert said["to"] == ["user_1"]  # the offline model's line, to the same people
    assert "not words that you say out loud" in server.model_requests()[1].body["messages"][-1]["content"]


async def test_words_with_no_line_in_them_are_asked_for_again_fresh(server: FakeLLMServer) -> None:
    """The prompt's record continued (measured) is no line: a fresh request, not the follow-up
    whose framing SmolLM2 read aloud as its next line."""
    server.push(text("1. user_1 -> Ben: Hi all!\n2. Ben -> user_1: hello"), text("Whales, mostly."))
    tools = LineChecker(refusals=0)
    await openai_model(server).speak(speak_request(), tools)
    assert [args["message"] for _, args in tools.calls] == ["Whales, mostly."]
    second = server.model_requests()[1].body
    assert [m["role"] for m in second["messages"]] == ["system", "user"]
    assert "not words that you say out loud" in second["messages"][-1]["content"]


async def test_a_tool_refused_for_another_reason_is_still_a_follow_up(server: FakeLLMServer) -> None:
    server.push(
        tool_call("speak", {"message": "Hi!", "to": ["nobody"]}), tool_call("speak", {"message": "Hi!"})
    )
    tools = LineChecker(refusals=1, reason="to: names nobody of the conversation")
    await openai_model(server).speak(speak_request(), tools)
    assert len(tool_messages(server.model_requests()[1].body)) == 1


async def test_speak_unknown_tools_are_answered_and_the_model_fixes_it(server: FakeLLMServer) -> None:
    server.push(tool_call("shout", {"x": 1}), tool_call("speak", {"message": "Whales!", "to": []}))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(), tools)

    assert tools.calls == [("speak", {"message": "Whales!", "to": []})]
    [unknown] = tool_messages(server.model_requests()[1].body)
    assert "there is no tool 'shout'" in unknown["content"]


async def test_speak_stops_at_its_request_budget(server: FakeLLMServer) -> None:
    server.push(*[tool_call("companions", {}) for _ in range(5)])
    tools = ToolRecorder()
    with pytest.raises(ModelError) as caught:
        await openai_model(server, max_speak_requests=3).speak(speak_request(), tools)
    assert caught.value.reason == "the model did not speak (it only looked things up)"
    assert len(server.model_requests()) == 3
    assert [c[0] for c in tools.calls] == ["companions"] * 3
    assert server.unused_replies() == 2


async def test_speak_without_action_tools_sends_nothing(server: FakeLLMServer) -> None:
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(tools=[COMPANIONS]), tools)
    assert server.model_requests() == [] and tools.calls == []


async def test_tool_ids_are_mapped_to_names_providers_accept(server: FakeLLMServer) -> None:
    dotted = ToolSpec(
        id="weather.lookup", description="Weather.", input_schema={"type": "object"}, kind="knowledge"
    )
    server.push(tool_call("weather_lookup", {}), tool_call("speak", {"message": "Sunny.", "to": []}))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(tools=[SPEAK, dotted]), tools)
    assert [c[0] for c in tools.calls] == ["weather.lookup", "speak"]


# --- deadlines, cancellation, failures -----------------------------------------------------------


async def test_a_request_past_its_deadline_fails_and_closes_the_connection(server: FakeLLMServer) -> None:
    server.push(hang())
    with pytest.raises(ModelError, match=r"no answer within 0\.3 s"):
        await openai_model(server, request_timeout=0.3).decide_states(states_request())
    assert await trio.to_thread.run_sync(server.disconnected.wait, 5.0)


async def test_cancelling_the_caller_aborts_the_http_request(server: FakeLLMServer) -> None:
    server.push(hang())
    model = openai_model(server)
    async with trio.open_nursery() as nursery:

        async def cancel_when_request_arrives() -> None:
            assert await trio.to_thread.run_sync(server.arrived.wait, 5.0)
            nursery.cancel_scope.cancel()

        nursery.start_soon(cancel_when_request_arrives)
        await model.speak(speak_request(), ToolRecorder())
        pytest.fail("speak returned although its request never got an answer")
    assert nursery.cancel_scope.cancelled_caught
    assert await trio.to_thread.run_sync(server.disconnected.wait, 5.0)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (http_error(401, "bad key"), r"refused the API key \(HTTP 401\): check OPENAI_API_KEY"),
        (http_error(404, "no such model"), r"no model 'fake-1'"),
        (http_error(500, "meltdown"), r"answered HTTP 500"),
    ],
)
async def test_http_failures_become_model_errors_that_say_what_to_fix(
    server: FakeLLMServer, reply: Any, expected: str
) -> None:
    server.push(reply)
    with pytest.raises(ModelError, match=expected):
        await openai_model(server).fill_params(params_request())


async def test_a_wrong_key_is_refused_by_the_server() -> None:
    with running_server(api_key="sk-right") as srv:
        model = openai_model(srv, api_key="sk-wrong")
        with pytest.raises(ModelError, match="HTTP 401"):
            await model.decide_states(states_request())


async def test_an_unreachable_endpoint_is_a_model_error() -> None:
    config = resolve_config("openai", "m", base_url=f"http://127.0.0.1:{free_port()}/v1", environ={})
    with pytest.raises(ModelError, match="cannot reach"):
        await ProviderModel(config).decide_states(states_request())


# --- the asyncio bridge ----------------------------------------------------------------------------


async def test_an_open_trio_asyncio_loop_is_reused(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    real_open_loop = trio_asyncio.open_loop

    def counting_open_loop(*args: Any, **kwargs: Any) -> Any:
        opened.append(object())
        return real_open_loop(*args, **kwargs)

    monkeypatch.setattr(trio_asyncio, "open_loop", counting_open_loop)
    server.push(
        tool_call("set_states", ALL_STATES), tool_call("set_params", {"mood": "happy", "interest": 1})
    )
    model = openai_model(server)
    async with aio.asyncio_loop():
        assert len(opened) == 1
        await model.decide_states(states_request())
        await model.fill_params(params_request())
    assert len(opened) == 1

    server.push(tool_call("set_states", ALL_STATES))
    await model.decide_states(states_request())
    assert len(opened) == 2, "without a loop of its own, a call opens one for itself"


async def test_errors_leave_a_temporary_loop_unwrapped() -> None:
    with pytest.raises(KeyError):
        async with aio.asyncio_loop():
            raise KeyError("plain")


async def test_run_asyncio_outside_a_loop_is_a_clear_error() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(RuntimeError, match="async with asyncio_loop"):
        await aio.run_asyncio(nothing)


# --- start-up check ----------------------------------------------------------------------------------


async def test_check_passes_when_the_model_is_served(server: FakeLLMServer) -> None:
    await openai_model(server).check()
    [listing] = server.requests
    assert (listing.method, listing.path) == ("GET", "/v1/models")


async def test_check_accepts_an_ollama_style_latest_tag() -> None:
    with running_server(models=("llama3.2:latest",)) as srv:
        config = resolve_config("openai", "llama3.2", base_url=srv.openai_base_url, environ={})
        await ProviderModel(config).check()


async def test_check_names_the_models_the_endpoint_serves() -> None:
    with running_server(models=("qwen2.5:7b", "phi4")) as srv:
        config = resolve_config("openai", "llama3", base_url=srv.openai_base_url, environ={})
        with pytest.raises(ModelSetupError, match=r"does not serve 'llama3'; it serves: qwen2.5:7b, phi4"):
            await ProviderModel(config).check()


async def test_check_reports_a_refused_key(server: FakeLLMServer) -> None:
    with pytest.raises(ModelSetupError, match=r"refused the API key \(HTTP 401\)"):
        await openai_model(server, api_key="sk-wrong").check()


async def test_check_reports_a_wrong_base_url() -> None:
    with running_server(models_status=404) as srv:
        config = resolve_config("openai", "fake-1", base_url=srv.openai_base_url, environ={})
        with pytest.raises(ModelSetupError, match=r"HTTP 404.*base URL"):
            await ProviderModel(config).check()


async def test_check_reports_an_unreachable_endpoint() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    config = resolve_config("openai", "m", base_url=url, environ={})
    with pytest.raises(ModelSetupError, match=f"cannot reach {url}.*is the server running"):
        await ProviderModel(config).check()


async def test_check_has_a_deadline() -> None:
    with running_server(hang_models=True) as srv:
        config = resolve_config("openai", "fake-1", base_url=srv.openai_base_url, environ={})
        with pytest.raises(ModelSetupError, match=r"did not answer within 0\.2 s"):
            await ProviderModel(config).check(timeout=0.2)
        assert await trio.to_thread.run_sync(srv.disconnected.wait, 5.0)


# --- Anthropic ----------------------------------------------------------------------------------------


async def test_anthropic_structured_output_and_tool_round_trip(server: FakeLLMServer) -> None:
    server.models = ("claude-fake",)
    server.push(
        tool_call("set_states", ALL_STATES),
        tool_call("companions", {}),
        tool_call("speak", {"message": "Ahoy.", "to": ["user_1"]}),
    )
    model = anthropic_model(server)
    await model.check()
    decisions = await model.decide_states(states_request())
    assert [d.state for d in decisions] == ["speak", "speak", "listen"]

    tools = ToolRecorder({"companions": {"status": "ok", "output": ["Aya"]}})
    await model.speak(speak_request(), tools)
    assert tools.calls == [("companions", {}), ("speak", {"message": "Ahoy.", "to": ["user_1"]})]

    states_sent, first_speak, second_speak = server.model_requests()
    assert states_sent.path == "/v1/messages"
    auth = states_sent.headers
    assert auth.get("x-api-key") == "sk-test" or auth.get("authorization") == "Bearer sk-test"
    assert "anthropic-version" in auth
    assert [t["name"] for t in states_sent.body["tools"]] == ["set_states"]
    assert "turn-taking" in json.dumps(states_sent.body["system"])
    assert "set_states" in json.dumps(states_sent.body["messages"])
    assert [t["name"] for t in first_speak.body["tools"]] == ["speak", "companions"]
    result_block = second_speak.body["messages"][-1]["content"][0]
    assert result_block["type"] == "tool_result" and "Aya" in json.dumps(result_block["content"])
