"""Each real server's quirks, reproduced on the wire by the fake server's profiles: every call
ends in an answer or a prompt ModelError with a reason, never a stall, and no request form a
server refused or ignored is sent to it again.

The profiles (tests/support/fake_llm_server.py) refuse and ignore what the real servers do: llama.cpp
without --jinja answers HTTP 500 to any tools; llama-cpp-python ignores ``"required"`` and
``"auto"`` and answers ``json_schema`` with HTTP 500; its chatml-function-calling format answers
``"required"`` with HTTP 500; Ollama reads no ``tool_choice``; vLLM refuses ``"auto"``.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import trio

from companion.models.base import ModelError, ToolInstruction
from companion.models.providers import PROPS_TIMEOUT, ProviderModel, resolve_config
from companion.models.servers import (
    SLOTS_HINT,
    SLOTS_LIMIT,
    EndpointMemory,
    ListedModel,
    identify_server,
    props_url,
    slots_of,
)
from support.fake_llm_server import (
    PROFILES,
    CooperativeModel,
    FakeLLMServer,
    Recorded,
    http_error,
    running_server,
    text,
    tool_call,
)
from support.logs import captured_logs
from support.models import (
    AYA,
    BEN,
    KAI,
    SPEAK,
    WAVE,
    ToolRecorder,
    params_request,
    speak_request,
    states_request,
)


@pytest.fixture
def memory() -> EndpointMemory:
    return EndpointMemory()


def model_of(srv: FakeLLMServer, memory: EndpointMemory) -> ProviderModel:
    config = resolve_config("openai", "fake-1", base_url=srv.openai_base_url, environ={})
    return ProviderModel(config, memory)


def form_of(request: Recorded) -> str:
    """The request form a recorded body used (see companion/models/servers.py)."""
    body = request.body
    fmt = body.get("response_format")
    if body.get("tools"):
        choice = body.get("tool_choice")
        return "named_tool" if isinstance(choice, dict) else f"tools_{choice}"
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_object":
            return "json_object_schema" if "schema" in fmt else "json_object"
        return str(fmt.get("type"))
    return "plain"


def forms(srv: FakeLLMServer) -> list[str]:
    return [form_of(r) for r in srv.model_requests()]


# --- structured output, per server ----------------------------------------------------------------

# (profile, forms sent on the first call without a start-up check, with one)
STRUCTURED = [
    ("openai", ["named_tool"], ["named_tool"]),
    ("llama.cpp", ["named_tool", "json_schema"], ["json_schema"]),
    ("llama.cpp-jinja", ["named_tool"], ["json_schema"]),
    ("llama-cpp-python", ["named_tool"], ["named_tool"]),
    ("llama-cpp-python-fc", ["named_tool"], ["named_tool"]),
    ("ollama", ["named_tool"], ["json_schema"]),
    ("vllm", ["named_tool"], ["named_tool"]),
    ("lmstudio", ["named_tool"], ["named_tool"]),
]


@pytest.mark.parametrize(("profile", "unchecked", "checked"), STRUCTURED)
@pytest.mark.parametrize("check", [False, True], ids=["unchecked", "checked"])
async def test_states_and_params_work_on_every_server(
    profile: str, unchecked: list[str], checked: list[str], check: bool, memory: EndpointMemory
) -> None:
    with running_server(profile=PROFILES[profile]) as srv:
        srv.push(*[CooperativeModel()] * 8)
        model = model_of(srv, memory)
        if check:
            await model.check()
        with trio.fail_after(10):
            decisions = await model.decide_states(states_request())
        assert [d.companion_id for d in decisions] == [AYA.id, BEN.id, KAI.id]
        assert forms(srv) == (checked if check else unchecked)
        first = len(srv.model_requests())
        with trio.fail_after(10):
            values = await model.fill_params(params_request())
            await model.decide_states(states_request())
        assert values == {"mood": "happy", "interest": 0}
        # Later calls go straight to the form that worked: one request each.
        assert len(srv.model_requests()) == first + 2
        assert forms(srv)[first:] == [forms(srv)[first - 1]] * 2


async def test_llama_cpp_python_ignoring_required_is_never_sent_required(memory: EndpointMemory) -> None:
    """The issue's case: llama-cpp-python ignores "required"; the named choice it honours is used."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(*[CooperativeModel()] * 4)
        model = model_of(srv, memory)
        await model.decide_states(states_request())
        await model.fill_params(params_request())
    assert all(r.body.get("tool_choice") != "required" for r in srv.model_requests())
    assert srv.refusals() == []


async def test_a_refused_form_is_not_sent_again(memory: EndpointMemory) -> None:
    """llama.cpp without --jinja refuses tools with HTTP 500 once; never again in this process."""
    with running_server(profile=PROFILES["llama.cpp"]) as srv:
        srv.push(*[CooperativeModel()] * 6)
        model = model_of(srv, memory)
        for _ in range(3):
            await model.decide_states(states_request())
        again = model_of(srv, memory)  # another model on the same endpoint shares the memory
        await again.fill_params(params_request())
    assert len(srv.refusals()) == 1
    assert forms(srv) == ["named_tool", "json_schema", "json_schema", "json_schema", "json_schema"]


async def test_an_ignored_forced_tool_falls_back_to_a_grammar(memory: EndpointMemory) -> None:
    """llama.cpp --jinja reads a named tool_choice as "auto"; a model that answers in prose there
    is asked again in the JSON-schema form, which the server enforces."""
    with running_server(profile=PROFILES["llama.cpp-jinja"]) as srv:
        srv.push(text("Sounds like fun, everyone!"), CooperativeModel(), CooperativeModel())
        model = model_of(srv, memory)
        decisions = await model.decide_states(states_request())
        await model.decide_states(states_request())
    assert len(decisions) == 3
    assert forms(srv) == ["named_tool", "json_schema", "json_schema"]


async def test_an_answer_that_loops_to_the_token_limit_is_asked_again_in_its_form(
    memory: EndpointMemory,
) -> None:
    """SmolLM2 behind llama.cpp's server (no repetition penalty) listed one food in an array of
    strings until the 600 tokens of a structured answer ran out, under the JSON-schema grammar.
    That is the model's answer cut at the limit, not the server ignoring the form: the form is
    kept (before, it was dropped for the process, and then the next), and the same request is
    sent again afresh, without the looping answer read back."""
    looping = '{"mood": "happy", "interest": 0.5, "foods": ["cake", ' + '"cake", ' * 400
    with running_server(profile=PROFILES["llama.cpp"]) as srv:
        srv.push(tool_call("set_params", looping), CooperativeModel(), CooperativeModel())
        model = model_of(srv, memory)
        await model.check()
        with captured_logs("INFO") as logs, trio.fail_after(10):
            values = await model.fill_params(params_request())
            again = await model.fill_params(params_request())
        bodies = [r.body for r in srv.model_requests()]
    assert values["mood"] in ("happy", "bored", "curious") and again.keys() == values.keys()
    assert forms(srv) == ["json_schema", "json_schema", "json_schema"]
    assert bodies[1]["messages"] == bodies[0]["messages"]  # afresh: the loop is not sent back
    cut = [json.loads(line) for line in logs.getvalue().splitlines() if "model_answer_cut" in line]
    assert [(c["purpose"], c["form"]) for c in cut] == [("params", "json_schema")]
    assert "model_form_ignored" not in logs.getvalue()


async def test_every_form_refused_is_one_prompt_model_error(memory: EndpointMemory) -> None:
    """A server that refuses every form (e.g. it is broken) fails the call after one request per
    form, with the server's words, and its refusals are forgiven for the next call."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        model = model_of(srv, memory)
        await model.check()  # identified: named tool, json_object with a schema, plain text
        srv.push(*[http_error(500, "meltdown")] * 3)
        started = trio.current_time()
        with pytest.raises(ModelError) as caught:
            await model.decide_states(states_request())
        assert trio.current_time() - started < 5
    assert caught.value.reason == "the server answered HTTP 500 to every request form: meltdown"
    assert forms(srv) == ["named_tool", "json_object_schema", "plain"]
    assert memory.structured_forms(model.config) == ["named_tool", "json_object_schema", "prompted"]


# --- malformed, unknown, empty ---------------------------------------------------------------------


async def test_malformed_json_twice_is_a_prompt_model_error(memory: EndpointMemory) -> None:
    with running_server() as srv:
        srv.push(tool_call("set_states", '{"states": [{"comp'), tool_call("set_states", "not json"))
        with pytest.raises(ModelError) as caught:
            await model_of(srv, memory).decide_states(states_request())
    assert "invalid twice" in caught.value.reason and "not a JSON object" in caught.value.reason
    assert len(srv.model_requests()) == 2


async def test_malformed_json_text_on_a_plain_server_is_a_prompt_model_error(memory: EndpointMemory) -> None:
    """A server with no forced forms left (plain text) and a model that writes broken JSON."""
    with running_server(profile=PROFILES["llama.cpp"]) as srv:
        srv.push(text('{"mood": "happy", "interest": '), text("I think I'm happy!"))
        model = model_of(srv, memory)
        memory.refused(model.config, "json_schema", "test: pretend refused")
        memory.refused(model.config, "json_object_schema", "test: pretend refused")
        await model.check()
        with pytest.raises(ModelError) as caught:
            await model.fill_params(params_request())
    assert "held no JSON object" in caught.value.reason
    assert forms(srv) == ["plain", "plain"]


async def test_an_empty_structured_answer_is_retried_once_then_an_error(memory: EndpointMemory) -> None:
    with running_server() as srv:
        srv.push(text(""), text(""))
        with pytest.raises(ModelError, match="invalid answer after a retry"):
            await model_of(srv, memory).decide_states(states_request())
    assert len(srv.model_requests()) == 2


async def test_unknown_tools_end_in_a_model_error_with_the_reason(memory: EndpointMemory) -> None:
    with running_server() as srv:
        srv.push(*[tool_call("shout", {"x": 1})] * 3)
        with pytest.raises(ModelError) as caught:
            await model_of(srv, memory).speak(speak_request(), ToolRecorder())
    assert caught.value.reason == "the model did not speak (it called an unknown tool 'shout')"
    assert len(srv.model_requests()) == 3


async def test_empty_speech_ends_in_a_model_error_within_the_budget(memory: EndpointMemory) -> None:
    with running_server(profile=PROFILES["llama-cpp-python-fc"]) as srv:
        srv.push(*[text("")] * 5)
        model = model_of(srv, memory)
        await model.check()
        tools = ToolRecorder()
        with pytest.raises(ModelError) as caught:
            await model.speak(speak_request(), tools)
    assert caught.value.reason == "the model did not speak (an empty answer)"
    assert tools.calls == []
    # auto (empty) -> the text form for the rest of the budget: 3 answers in all.
    assert forms(srv) == ["tools_auto", "plain", "plain"]


# --- speaking, per server ---------------------------------------------------------------------------

SPEAKING = [
    ("openai", ["tools_required"]),
    ("llama.cpp", ["tools_auto", "plain"]),
    ("llama.cpp-jinja", ["tools_auto"]),
    ("llama-cpp-python", ["tools_auto"]),
    ("llama-cpp-python-fc", ["tools_auto"]),
    ("ollama", ["tools_auto"]),
    ("ollama-no-tools", ["tools_auto", "plain"]),
    ("vllm", ["tools_required"]),
    ("lmstudio", ["tools_required"]),
]


@pytest.mark.parametrize(("profile", "sent"), SPEAKING)
async def test_speaking_reaches_the_speak_tool_on_every_server(
    profile: str, sent: list[str], memory: EndpointMemory
) -> None:
    with running_server(profile=PROFILES[profile]) as srv:
        srv.push(*[CooperativeModel()] * 6)
        model = model_of(srv, memory)
        await model.check()
        tools = ToolRecorder()
        with trio.fail_after(10):
            await model.speak(speak_request(), tools)
            await model.speak(speak_request(), tools)
    [(first_tool, first), (second_tool, _)] = tools.calls
    assert first_tool == second_tool == "speak"
    assert first["to"] == ["user_1"]
    assert forms(srv) == [*sent, sent[-1]]
    if PROFILES[profile].choices.get("auto") == "ignore":
        # The server never let the tools through: the model's prose is the line, said to the
        # recipients through the speak tool.
        assert first == {"message": "Reply number 1.", "to": ["user_1"]}


async def test_an_unidentified_server_that_ignores_required_gets_auto_next(memory: EndpointMemory) -> None:
    """No start-up check: "required" is tried once, ignored, and never sent again."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(*[CooperativeModel()] * 3)
        model = model_of(srv, memory)
        tools = ToolRecorder()
        for _ in range(3):
            await model.speak(speak_request(), tools)
    assert forms(srv) == ["tools_required", "tools_auto", "tools_auto"]
    assert [c[0] for c in tools.calls] == ["speak"] * 3


async def test_chatml_function_calling_refusing_required_is_asked_with_auto(memory: EndpointMemory) -> None:
    """HTTP 500 for "required" (empty message): the next request of the same call uses "auto",
    and "required" is never repeated."""
    with running_server(profile=PROFILES["llama-cpp-python-fc"]) as srv:
        srv.push(*[CooperativeModel()] * 2)
        model = model_of(srv, memory)
        tools = ToolRecorder()
        await model.speak(speak_request(), tools)
        await model.speak(speak_request(), tools)
    assert forms(srv) == ["tools_required", "tools_auto", "tools_auto"]
    assert len(srv.refusals()) == 1 and [c[0] for c in tools.calls] == ["speak"] * 2


async def test_vllm_without_auto_tool_choice_never_gets_auto(memory: EndpointMemory) -> None:
    with running_server(profile=PROFILES["vllm"]) as srv:
        srv.push(*[CooperativeModel()] * 2)
        model = model_of(srv, memory)
        await model.check()
        await model.speak(speak_request(), ToolRecorder())
    assert all(r.body.get("tool_choice") != "auto" for r in srv.model_requests())


async def test_a_tool_call_written_as_text_is_run(memory: EndpointMemory) -> None:
    """SmolLM2 and Hermes-style models write <tool_call> blocks when the server parses none."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(
            text('<tool_call>{"name": "wave", "arguments": {}}</tool_call>'),
            text("Hello, Aya!"),
        )
        model = model_of(srv, memory)
        await model.check()
        tools = ToolRecorder()
        request = speak_request(
            tools=[SPEAK, WAVE],
            instructions=[ToolInstruction("wave", "wave"), ToolInstruction("speak", "greet")],
        )
        await model.speak(request, tools)
    assert [c[0] for c in tools.calls] == ["wave", "speak"]
    assert tools.calls[1][1]["message"] == "Hello, Aya!"


async def test_text_speech_is_refused_by_the_runtime_like_any_call(memory: EndpointMemory) -> None:
    """The runtime's checks apply to text turned into speech: a refusal is shown to the model."""
    refused = {"status": "invalid_input", "message": "to: must name a present companion"}
    with running_server(profile=PROFILES["llama.cpp"]) as srv:
        srv.push(text("Ben: Whales, mostly."), text("Whales, mostly."))
        model = model_of(srv, memory)
        await model.check()
        memory.refused(model.config, "tools_auto", "test")
        answers = iter([refused, {"status": "ok"}])
        said: list[dict[str, Any]] = []

        async def runtime(tool_id: str, args: Any) -> Any:
            said.append(dict(args))
            return next(answers)

        await model.speak(speak_request(), runtime)
    assert [s["message"] for s in said] == ["Whales, mostly.", "Whales, mostly."]  # "Ben:" label dropped
    assert "could not be delivered" in srv.model_requests()[1].body["messages"][-1]["content"]


# --- identification -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "base_url", "ids", "expected"),
    [
        ("llamacpp", "http://127.0.0.1:8080/v1", ["m"], "llama.cpp"),
        ("me", "http://127.0.0.1:8000/v1", ["m"], "llama-cpp-python"),
        ("library", "http://127.0.0.1:9999/v1", ["m"], "ollama"),
        ("", "http://127.0.0.1:11434/v1", ["m"], "ollama"),
        ("x", "http://127.0.0.1:9999/v1", ["llama3.2:latest"], "ollama"),
        ("vllm", "http://127.0.0.1:8000/v1", ["m"], "vllm"),
        ("organization_owner", "http://127.0.0.1:1234/v1", ["m"], "lmstudio"),
        ("someone", "http://127.0.0.1:9999/v1", ["m"], "unknown"),
    ],
)
def test_servers_are_identified_from_their_model_list(
    owner: str, base_url: str, ids: list[str], expected: str
) -> None:
    config = resolve_config("openai", "m", base_url=base_url, environ={})
    assert identify_server(config, [ListedModel(i, owner) for i in ids]) == expected


def test_hosted_endpoints_are_known_without_a_list() -> None:
    openai = resolve_config("openai", "gpt-4o-mini", environ={"OPENAI_API_KEY": "k"})
    anthropic = resolve_config("anthropic", "claude", environ={"ANTHROPIC_API_KEY": "k"})
    memory = EndpointMemory()
    assert memory.state(openai).server == "openai" and memory.state(anthropic).server == "anthropic"


@pytest.mark.parametrize(
    ("base_url", "url"),
    [
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/props"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/props"),
        ("http://127.0.0.1:8080/api/v1", "http://127.0.0.1:8080/api/props"),  # --api-prefix /api
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/props"),
    ],
)
def test_llama_cpp_props_are_beside_the_openai_routes(base_url: str, url: str) -> None:
    assert props_url(base_url) == url


@pytest.mark.parametrize(
    ("props", "slots"),
    [
        ({"total_slots": 1}, 1),
        ({"total_slots": 4, "model_alias": "m"}, 4),
        ({"total_slots": 0}, None),
        ({"total_slots": -3}, None),
        ({"total_slots": SLOTS_LIMIT + 1}, None),
        ({"total_slots": True}, None),
        ({"total_slots": 2.0}, None),
        ({"total_slots": "4"}, None),
        ({}, None),
        ([{"total_slots": 1}], None),
        ("total_slots", None),
        (None, None),
    ],
)
def test_only_a_plausible_slot_count_is_read(props: object, slots: int | None) -> None:
    assert slots_of(props) == slots


@pytest.mark.parametrize(
    ("slots", "serial"),
    [(1, True), (4, False), (None, False)],
    ids=["one-slot", "four-slots", "untold"],
)
async def test_the_check_asks_a_llama_cpp_server_its_slots(
    memory: EndpointMemory, slots: int | None, serial: bool
) -> None:
    """llama.cpp's server with one slot (``-np 1 -kvu``) answers one request at a time, like
    llama-cpp-python; with four (its default since late 2025) side by side. The check reads
    which from ``/props``; a server that does not say is taken to answer side by side."""
    with running_server(profile=PROFILES["llama.cpp"], slots=slots) as srv:
        model = model_of(srv, memory)
        with captured_logs("INFO") as logs:
            await model.check()
        asked = [r.path for r in srv.requests if r.method == "GET"]
    assert asked == ["/v1/models", "/props"]
    assert model.server == "llama.cpp" and model.serial is serial
    assert model.speculates is not serial and model.parallel_params is not serial
    (checked,) = [json.loads(line) for line in logs.getvalue().splitlines() if "model_checked" in line]
    assert checked["slots"] == slots
    told = [json.loads(line) for line in logs.getvalue().splitlines() if "model_server_slots" in line]
    assert [(t["slots"], t["serial"], t.get("hint")) for t in told] == (
        [] if slots is None else [(slots, serial, None if serial else SLOTS_HINT)]
    )


@pytest.mark.parametrize("how", ["hangs", "refuses", "not-json"])
async def test_a_llama_cpp_server_that_does_not_tell_its_slots_passes_the_check(
    memory: EndpointMemory, how: str
) -> None:
    """``/props`` is read within :data:`PROPS_TIMEOUT` seconds; a late, refused or unreadable
    answer leaves the slots untold (logged), and the check still passes."""
    ways: dict[str, dict[str, Any]] = {
        "hangs": {"hang_props": True},
        "refuses": {"props_status": 404},
        "not-json": {"props_raw": b"<html>not here</html>"},
    }
    options = ways[how]
    with running_server(profile=PROFILES["llama.cpp"], slots=1, **options) as srv:
        model = model_of(srv, memory)
        with captured_logs("INFO") as logs, trio.fail_after(PROPS_TIMEOUT + 5):
            await model.check()
    assert model.server == "llama.cpp" and memory.state(model.config).slots is None and not model.serial
    unread = [json.loads(line) for line in logs.getvalue().splitlines() if "model_props_unread" in line]
    assert len(unread) == 1 and unread[0]["url"].endswith("/props"), logs.getvalue()[-2000:]


def test_the_memory_is_bounded() -> None:
    memory = EndpointMemory(limit=3)
    for port in range(10):
        memory.state(resolve_config("openai", "m", base_url=f"http://127.0.0.1:{port + 1}/v1", environ={}))
    assert len(memory._states) == 3


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
async def test_a_retry_reaches_llama_cpp_python_which_refuses_null_content(
    check: bool, memory: EndpointMemory
) -> None:
    """llama-cpp-python answers HTTP 500 to an assistant message with ``content: null`` (a tool
    call in the history): the retry goes out with the history written as text, at once."""
    bad = {"speak": [42, 0, 0]}
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(tool_call("set_states", bad), CooperativeModel())
        model = model_of(srv, memory)
        if check:
            await model.check()
        decisions = await model.decide_states(states_request())
        assert len(decisions) == 3
        refused = len(srv.refusals())
        assert refused == (0 if check else 1)
        srv.push(tool_call("set_states", bad), CooperativeModel())
        await model.decide_states(states_request())
    assert len(srv.refusals()) == refused  # learned: never sent with null content again
    retry = srv.model_requests()[-1].body["messages"]
    assert all(m.get("content") is not None for m in retry)
    assert "less than or equal to 10" in json.dumps(retry), json.dumps(retry)[-600:]


async def test_local_servers_get_the_token_limit_in_the_field_they_read(memory: EndpointMemory) -> None:
    """llama-cpp-python ignores ``max_completion_tokens`` (measured: a reply ran on for 3,560
    tokens and four minutes); every local server reads ``max_tokens``."""
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(*[CooperativeModel()] * 3)
        model = model_of(srv, memory)
        await model.decide_states(states_request())
        await model.fill_params(params_request())
        await model.speak(speak_request(), ToolRecorder())
    limits = [(r.body.get("max_tokens"), "max_completion_tokens" in r.body) for r in srv.model_requests()]
    assert limits == [(600, False), (600, False), (120, False)]


def test_a_request_body_cut_short_is_answered_400_and_is_no_model_request() -> None:
    """A companion process that ends while it sends a request leaves the server a body cut short
    (seen at a demo's end on a loaded machine: the fake server's handler crashed on it). A real
    server answers 400 and generates nothing; so does the fake, and it counts no model request."""
    import socket
    import urllib.parse

    with running_server() as server:
        address = urllib.parse.urlsplit(server.openai_base_url)
        assert address.hostname is not None and address.port is not None
        for body, declared in ((b'{"model": "fake-1", "mess', 100), (b"", 0), (b"[1, 2]", 6)):
            with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
                head = (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {declared}\r\nConnection: close\r\n\r\n"
                )
                sock.sendall(head.encode() + body)
                sock.shutdown(socket.SHUT_WR)  # the rest of the body never comes
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:80]
        assert server.model_requests() == []
        assert len([r for r in server.requests if r.method == "POST"]) == 3


# --- one request at a time --------------------------------------------------------------------------


def _stream_a_line(srv: FakeLLMServer) -> bytes:
    """One streamed chat completion read to its end, as a client thread beside another sends it."""
    connection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        body = {"model": "fake-1", "messages": [{"role": "user", "content": "Hello?"}], "stream": True}
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        answer = connection.getresponse()
        assert answer.status == 200
        return answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("profile", "slots", "at_once"),
    [
        ("openai", None, 2),
        ("llama-cpp-python", None, 1),
        ("llama-cpp-python-fc", None, 1),
        ("llama.cpp", 1, 1),
        ("llama.cpp", 4, 2),
    ],
)
def test_llama_cpp_python_answers_one_request_at_a_time_and_others_side_by_side(
    profile: str, slots: int | None, at_once: int
) -> None:
    """The llama-cpp-python server holds one lock around each answer: of two requests sent side
    by side, the second begins when the first is complete; so does llama.cpp's with one slot. A
    hosted server answers both at once, llama.cpp's with four slots too. Neither answer begins
    before both requests arrived (``answer_together``), so how busy the machine is cannot decide
    the order."""
    with running_server(profile=PROFILES[profile], slots=slots, ttft=0.2, answer_together=2) as srv:
        srv.push(text("The first line."), text("The second line."))
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: _stream_a_line(srv), range(2)))
    assert all(b"[DONE]" in answer for answer in answers)
    assert srv.most_answering == at_once and srv.most_in_flight == 2  # both asked at once
    first, second = sorted(srv.model_requests(), key=lambda r: r.served or math.inf)
    assert first.served is not None and first.answered is not None
    assert second.served is not None and second.answered is not None
    if at_once == 1:
        assert second.served >= first.answered
    else:
        assert second.served < first.answered


def test_a_serial_request_waits_for_what_follows_the_finish_chunk() -> None:
    """llama-cpp-python's lock is held to the end of a stream: a request that comes while the
    one before has sent its finish chunk but not yet ``[DONE]`` (it copies its cache then) waits
    for that too. It was not asked while an answer was written: the client had that answer
    whole, so the two were never in flight together."""
    held = threading.Event()
    with running_server(profile=PROFILES["llama-cpp-python"], after_finish=held) as srv:
        srv.push(text("The first line."), text("The second line."))
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(_stream_a_line, srv)
            assert srv.finish_written.wait(10)
            second = pool.submit(_stream_a_line, srv)
            deadline = time.monotonic() + 10
            while len(srv.model_requests()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # room for a wrong answer to begin: this can only pass wrongly, never fail
            waiting = srv.model_requests()[1]
            assert waiting.served is None and not first.done()
            held.set()
            assert b"[DONE]" in first.result(10) and b"[DONE]" in second.result(10)
    before, after = srv.model_requests()
    assert before.answered is not None and after.served is not None and after.served >= before.answered
    assert srv.most_answering == 1 and srv.most_in_flight == 1
