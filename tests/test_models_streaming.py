"""Streamed speech: the line read out of partial answers, from a real (fake) server streaming
over HTTP, as real servers stream (SSE split across writes, arguments as fragments of JSON)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator

import pytest
import trio
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

from companion.models.base import ModelError
from companion.models.second_try import fresh_seed
from companion.models.servers import ServerKind
from companion.models.streaming import partial_line, whole_sentences
from support.fake_llm_server import PROFILES, FakeLLMServer, Reply, running_server, text, tool_call
from support.models import (
    COMPANIONS,
    SPEAK,
    ToolRecorder,
    anthropic_model,
    openai_model,
    speak_request,
)

TOOLS = {"speak": SPEAK, "companions": COMPANIONS}
LINE = "Whales, mostly. One of them sang! Then fog."


class GrowingLine:
    """Records what a streaming model shows of the line (the speaker's live line in the engine)."""

    abandoned = False
    refusal: str | None = None
    settled: str | None = None

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def grow(self, tool_id: str, text: str) -> None:
        self.seen.append((tool_id, text))


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with running_server(api_key="sk-test") as srv:
        yield srv


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([ToolCallPart("speak", '{"message": "Whales, mo')], ("speak", "Whales, mo")),
        ([ToolCallPart("speak", '{"to": ["user_1"], "message": "Hi. Th')], ("speak", "Hi. Th")),
        ([ToolCallPart("speak", '{"message": "caf\\u00')], ("speak", "caf")),
        ([ToolCallPart("speak", '{"mess')], None),
        ([ToolCallPart("companions", '{"message": "x"}')], None),  # a look-up says nothing
        ([ToolCallPart("nope", '{"message": "x"}')], None),
        ([TextPart("Ben: Whales, mostly.")], ("speak", "Whales, mostly.")),
        ([TextPart("Benn: Whales, mostly.")], ("speak", "Whales, mostly.")),  # mangled, still its own
        ([TextPart('"Whales')], ("speak", "Whales")),
        ([TextPart('{"message": "Whales"}')], None),  # JSON written as text is not read out early
        ([TextPart("Whales.\nAya: and more")], ("speak", "Whales.")),
        ([TextPart("Whales"), ToolCallPart("speak", '{"message": "Hi')], ("speak", "Hi")),
        # a stage direction before the first word is not shown (nor said), nor while it is open
        ([ToolCallPart("speak", '{"message": "(Slightly) whales, mo')], ("speak", "Whales, mo")),
        ([ToolCallPart("speak", '{"message": "(Sligh')], None),
        ([TextPart("*smiles* Whales.")], ("speak", "Whales.")),
        # nor the speaker's own name called before it, in a call or in text
        ([ToolCallPart("speak", '{"message": "Ben, whales, mo')], ("speak", "Whales, mo")),
        ([ToolCallPart("speak", '{"message": "Be')], None),
        ([TextPart("Ben, whales.")], ("speak", "Whales.")),
        # a label with a note in brackets, as the complete line drops it (structured.spoken_text)
        ([TextPart("Ben (smiling): Whales, mostly.")], ("speak", "Whales, mostly.")),
        ([TextPart("**Ben** (softly): Whales.")], ("speak", "Whales.")),
        ([TextPart("Ben (smil")], None),
        ([TextPart("Ben (smiling)")], None),
    ],
)
def test_the_line_so_far_of_a_partial_answer(
    parts: list[ToolCallPart | TextPart], expected: tuple[str, str] | None
) -> None:
    assert partial_line(ModelResponse(parts=parts), TOOLS, "speak", ("Ben", "companion_ben")) == expected


def test_the_speakers_names_may_come_as_any_iterable() -> None:
    """Read twice (the label, then the name called): a generator must not be spent by the first."""
    response = ModelResponse(parts=[TextPart("Ben: Ben, whales.")])
    assert partial_line(response, TOOLS, "speak", iter(("Ben", "companion_ben"))) == ("speak", "Whales.")


def test_text_is_not_read_when_no_tool_carries_it() -> None:
    assert partial_line(ModelResponse(parts=[TextPart("Whales.")]), TOOLS, None) is None


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        ("I can tell. And if you ask so", "I can tell."),
        ("I can tell. And if you ask so.", "I can tell. And if you ask so."),  # cut just after
        ("And if you ask so", ""),
        ("こんにちは。今日は", "こんにちは。"),
    ],
)
def test_a_line_cut_at_the_token_limit_keeps_only_its_whole_sentences(cut: str, said: str) -> None:
    args = '{"to": ["user_1"], "message": ' + '"' + cut  # the JSON is cut too
    call, answer = whole_sentences(ModelResponse(parts=[ToolCallPart("speak", args)], finish_reason="length"))
    text, _ = whole_sentences(ModelResponse(parts=[TextPart(cut)], finish_reason="length"))
    [part] = call.parts
    assert isinstance(part, ToolCallPart) and part.args_as_dict() == {"to": ["user_1"], "message": said}
    assert text.parts == [TextPart(said)] and answer is (said != cut)
    # llama-cpp-python, a named tool at its limit: "tool_calls", and the JSON stops mid-string
    quirk, _ = whole_sentences(ModelResponse(parts=[ToolCallPart("speak", args)], finish_reason="tool_call"))
    [same] = quirk.parts
    assert isinstance(same, ToolCallPart) and same.args_as_dict() == part.args_as_dict()
    whole = ModelResponse(parts=[ToolCallPart("speak", args + '"}')], finish_reason="stop")
    assert whole_sentences(whole) == (whole, False)  # only the limit cuts a line


@pytest.mark.parametrize("profile", ["openai", "llama-cpp-python"])
async def test_a_line_the_token_limit_cut_says_only_its_whole_sentences(profile: ServerKind) -> None:
    long = " ".join(f"Sentence number {i} is about the sea." for i in range(40))  # past 120 tokens
    with running_server(api_key="sk-test", profile=PROFILES[profile]) as srv:
        srv.push(tool_call("speak", {"to": ["user_1"], "emotion": "happy", "message": long}))
        sink, tools = GrowingLine(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, profile)
        await model.speak(speak_request(live=sink), tools)
    [(_, args)] = tools.calls
    said = args["message"]
    assert said and long.startswith(said) and said != long and said.endswith("the sea.")
    assert args["to"] == ["user_1"]


async def test_a_tool_call_streams_its_message_as_it_is_written(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"}))
    sink, tools = GrowingLine(), ToolRecorder()
    await openai_model(server).speak(speak_request(live=sink), tools)

    assert tools.calls == [("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"})]
    texts = [t for tool, t in sink.seen if tool == "speak"]
    assert len(texts) > 3, "the line arrived at once"
    assert all(LINE.startswith(t) for t in texts) and texts[-1] == LINE
    assert texts == sorted(texts, key=len)
    [sent] = server.model_requests()
    assert sent.body["stream"] is True
    assert sent.body.get("stream_options", {}).get("include_usage") is True


async def test_a_text_answer_streams_without_the_speakers_label() -> None:
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(text(f"Ben: {LINE}"))
        sink, tools = GrowingLine(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        await model.speak(speak_request(live=sink), tools)
    assert tools.calls and tools.calls[-1][1]["message"] == LINE
    assert sink.seen and all(LINE.startswith(t) for _, t in sink.seen) and sink.seen[-1][1] == LINE


async def test_a_stream_cut_mid_answer_fails_the_call_after_showing_what_was_written(
    server: FakeLLMServer,
) -> None:
    reply = tool_call("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"})
    server.push(Reply(calls=reply.calls, cut_after=12))
    sink, tools = GrowingLine(), ToolRecorder()
    with pytest.raises(ModelError):
        await openai_model(server).speak(speak_request(live=sink), tools)
    assert tools.calls == []  # nothing half-written reaches the runtime
    assert sink.seen and LINE.startswith(sink.seen[-1][1]) and sink.seen[-1][1] != LINE


async def test_without_a_live_line_the_request_is_not_streamed(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": LINE, "to": ["user_1"]}))
    await openai_model(server).speak(speak_request(), ToolRecorder())
    [sent] = server.model_requests()
    assert not sent.body.get("stream")


async def test_an_anthropic_tool_call_streams_its_message_too(server: FakeLLMServer) -> None:
    server.push(tool_call("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"}))
    sink, tools = GrowingLine(), ToolRecorder()
    await anthropic_model(server).speak(speak_request(live=sink), tools)
    assert tools.calls == [("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"})]
    texts = [t for _, t in sink.seen]
    assert len(texts) > 3 and all(LINE.startswith(t) for t in texts) and texts[-1] == LINE
    [sent] = server.model_requests()
    assert sent.path == "/v1/messages" and sent.body["stream"] is True


def test_a_partial_answer_past_the_bound_is_not_read() -> None:
    huge = '{"message": "' + "la " * 6000
    assert partial_line(ModelResponse(parts=[ToolCallPart("speak", huge)]), TOOLS, "speak") is None
    assert partial_line(ModelResponse(parts=[TextPart("la " * 6000)]), TOOLS, "speak") is None


async def test_a_form_the_server_will_not_stream_is_sent_whole_and_keeps_its_tools() -> None:
    """llama-cpp-python with chatml-function-calling answers a streamed tool_choice "auto" with
    HTTP 500 "Automatic streaming tool choice is not supported": the same form goes again
    unstreamed (not counted as refused, so the model keeps its tools), and stays unstreamed."""
    with running_server(profile=PROFILES["llama-cpp-python-fc"]) as srv:
        srv.push(*[tool_call("speak", {"message": LINE, "to": ["user_1"]})] * 2)
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        for _ in range(2):
            tools = ToolRecorder()
            await model.speak(speak_request(live=GrowingLine()), tools)
            assert tools.calls == [("speak", {"message": LINE, "to": ["user_1"]})]
        streamed = [bool(r.body.get("stream")) for r in srv.model_requests()]
    assert streamed == [True, False, False]
    assert "tools_auto" in model.memory.speak_forms(model.config)


REFUSED_COPY = "not said, because it repeats what you already said (\u201cSentence number 0.\u201d)."


class Refusing(GrowingLine):
    """Refuses a line at its first sentence ("... sea. "), as the engine's live line refuses a
    copy before anyone hears it; a line without that sentence passes."""

    def grow(self, tool_id: str, text: str) -> None:
        super().grow(tool_id, text)
        self.abandoned = "sea. " in text
        self.refusal = REFUSED_COPY if self.abandoned else None


async def test_a_line_that_can_no_longer_be_said_stops_the_stream(server: FakeLLMServer) -> None:
    """The live line refused the first sentence (nothing heard): the model is not left writing
    to its token limit, and its answer is a refused line, asked for again fresh (the refusal in
    the task, another seed), not a call: made as one it could only say nothing."""
    long = " ".join(f"Sentence number {i} is about the sea." for i in range(40))
    server.push(
        tool_call("speak", {"message": long, "to": ["user_1"], "emotion": "happy"}),
        tool_call("speak", {"message": "Gulls, mostly.", "to": ["user_1"]}),
    )
    sink, tools = Refusing(), ToolRecorder()
    await openai_model(server).speak(speak_request(live=sink), tools)
    assert tools.calls == [("speak", {"message": "Gulls, mostly.", "to": ["user_1"]})]
    first_seen = [text for _tool, text in sink.seen if text.startswith("Sentence")]
    assert first_seen[-1].startswith("Sentence number 0 is about the sea. ")
    assert len(first_seen[-1]) < 60  # nothing read after it
    first, fresh = server.model_requests()
    request = speak_request()
    assert fresh.body.get("seed") == fresh_seed(request.message.params.id) and first.body.get("seed") is None
    assert fresh_seed("m-1") != fresh_seed("m-2"), "each message's second try is its own"
    assert "it repeated a line that was already said" in json.dumps(fresh.body["messages"][-1])

    # a text answer (llama-cpp-python's way with SmolLM2), twice refused at its first sentence, the
    # second time after a first clause only: the card's own line is said, never nothing (it was
    # "an empty answer" and the slot given up, measured)
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(text(long), text("Well, the sea. " + long))
        sink, tools = Refusing(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        forms = model.memory.speak_forms(model.config)
        await model.speak(speak_request(live=sink), tools)
        assert len(srv.model_requests()) == 2
    [(tool, args)] = tools.calls
    assert tool == "speak" and args["message"] and "Sentence number" not in args["message"]
    assert model.memory.speak_forms(model.config) == forms, "the form is not taken for one ignored"


async def test_a_line_settled_as_heard_stops_the_stream_and_is_the_call(server: FakeLLMServer) -> None:
    """Its first sentence heard, its second refused: the stream closes there, and the call
    made is the heard line with the arguments the model had not written yet filled in (its
    ``to`` came after the line), so no follow-up request is needed to complete it."""

    class Settling(GrowingLine):
        def grow(self, tool_id: str, text: str) -> None:
            super().grow(tool_id, text)
            if "copy. " in text:
                self.settled = "Whales, mostly."

    long = "Whales, mostly. A copy. " + " ".join(f"Sentence {i} about the sea." for i in range(40))
    server.push(tool_call("speak", {"message": long, "to": ["user_1"], "emotion": "happy"}))
    sink, tools = Settling(), ToolRecorder()
    await openai_model(server).speak(speak_request(live=sink), tools)
    assert tools.calls == [("speak", {"message": "Whales, mostly.", "to": ["user_1"]})]
    assert len(sink.seen[-1][1]) < 40  # nothing read after it
    assert len(server.model_requests()) == 1

    # a text answer: the line is the heard one, not its first paragraph
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(text(long + "\nuser_1: And then?"))
        sink, tools = Settling(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        await model.speak(speak_request(live=sink), tools)
        assert len(srv.model_requests()) == 1
    assert tools.calls and tools.calls[0][1]["message"] == "Whales, mostly."


async def test_a_text_line_is_complete_at_its_first_line_break(caplog: pytest.LogCaptureFixture) -> None:
    """SmolLM2-135M wrote on to its token limit after its line ("...\\n(One sentence). You must
    take the dog out to the park.", 1.5 s more, measured): the first line of a text answer is its
    line, so the stream closes when it ends, and the line said is that first line."""
    junk = "\n".join(f"(One sentence.) Line {i} of what is never said." for i in range(40))
    with running_server(profile=PROFILES["llama-cpp-python"]) as srv:
        srv.push(text(f"{LINE}\n{junk}"))
        sink, tools = GrowingLine(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        with caplog.at_level("INFO"):
            await model.speak(speak_request(live=sink), tools)
        [request] = srv.model_requests()
    assert tools.calls and tools.calls[0][1]["message"] == LINE
    stopped = [
        dict(getattr(r, "companion_fields", {}))
        for r in caplog.records
        if getattr(r, "companion_event", "") == "speak_stream_stopped"
    ]
    assert [s["ended"] for s in stopped] == [True]
    assert request.body["stream"] is True


@pytest.mark.parametrize("reads", [2, 4, 5, 8])
async def test_a_line_settled_while_its_recipients_are_written_keeps_no_half_written_one(
    server: FakeLLMServer, reads: int
) -> None:
    """The voice was interrupted after the whole line was heard, while the model was writing
    ``to``: the stream closes inside that list, and the call's ``to`` is not the half of it
    written so far ("us", "compani": measured before) but the turn's recipients."""
    line = "Whales, mostly. One of them sang!"

    class Late(GrowingLine):
        whole = 0

        def grow(self, tool_id: str, text: str) -> None:
            super().grow(tool_id, text)
            if text == line:
                self.whole += 1
                if self.whole == reads:
                    self.settled = line

    recipients = ["user_1", "companion_pim"]
    server.push(tool_call("speak", {"message": line, "to": recipients, "emotion": "happy"}))
    tools = ToolRecorder()
    await openai_model(server).speak(speak_request(live=Late(), recipients=recipients), tools)
    assert tools.calls == [("speak", {"message": line, "to": recipients})]
    assert len(server.model_requests()) == 1


async def test_a_llama_cpp_python_line_ends_at_its_finish_chunk_not_at_done() -> None:
    """llama-cpp-python with ``--cache true`` sends ``[DONE]`` only after it copied its state
    (40-130 ms with SmolLM2, measured) and never a usage chunk: the line is complete at the
    chunk with the ``finish_reason``. Here ``[DONE]`` is held until the call has returned; a
    call that waited for it would return only when the fake server gives up holding it."""
    held = threading.Event()
    with running_server(profile=PROFILES["llama-cpp-python"], after_finish=held) as srv:
        srv.push(text(LINE))
        sink, tools = GrowingLine(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        await model.speak(speak_request(live=sink), tools)
        assert srv.finish_written.is_set() and not srv.done_written.is_set()
        held.set()
    assert tools.calls and tools.calls[0][1]["message"] == LINE


async def test_a_stream_that_may_carry_usage_after_its_finish_is_read_to_its_end() -> None:
    """The OpenAI API sends the usage in a chunk after the finish: that stream is read to its end
    (the tokens are counted), however long the server takes to send it."""
    held = threading.Event()
    with running_server(api_key="sk-test", after_finish=held) as srv:
        srv.push(tool_call("speak", {"message": LINE, "to": ["user_1"], "emotion": "happy"}))
        model, tools = openai_model(srv), ToolRecorder()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(model.speak, speak_request(live=GrowingLine()), tools)
            await trio.to_thread.run_sync(srv.finish_written.wait, 10.0)
            assert tools.calls == []  # the call still waits for the rest of the stream
            held.set()
    assert tools.calls and srv.done_written.is_set()
    assert model.tokens["output"] > 0


def _ask_beside(srv: FakeLLMServer) -> None:
    """Another request to ``srv``, as another companion's would come (blocking)."""
    body = {"model": "fake-1", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        f"{srv.openai_base_url}/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer sk-test"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


async def test_a_llama_cpp_python_stream_another_request_cut_says_only_whole_sentences(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """llama-cpp-python ends the stream in progress with ``[DONE]`` and no finish chunk when
    another request comes (``interrupt_requests``, its default; measured with SmolLM2: 24 chunks,
    then the end). A line cut so is no whole line: only its complete sentences are said, as when
    the token limit cuts it, never "One of them" as if it were a sentence."""
    line = "Whales, mostly. One of them sang to the boats all night long! Then the fog came in from the sea."
    # 10 tokens a second: the other request comes while a dozen tokens are still to be written
    with running_server(profile=PROFILES["llama-cpp-python"], ttft=0.0, token_rate=10.0) as srv:
        srv.push(text(line), text("Other."))
        sink, tools = GrowingLine(), ToolRecorder()
        model = openai_model(srv)
        model.memory.identify(model.config, "llama-cpp-python")
        with trio.fail_after(20), caplog.at_level("INFO"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(model.speak, speak_request(live=sink), tools)
                while not any("sang" in seen for _, seen in sink.seen):
                    await trio.sleep(0.01)
                await trio.to_thread.run_sync(_ask_beside, srv)
        first = srv.model_requests()[0]
    assert first.interrupted
    said = [args["message"] for _, args in tools.calls]
    assert said in (
        [],
        ["Whales, mostly."],
        ["Whales, mostly. One of them sang to the boats all night long!"],
    )
