"""The offline scripted model: deterministic, in character, follows instructions, closes by itself."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest

from companion.actions import ActionRuntime, resolve_tool
from companion.actions.builtins import SpeakInput
from companion.history import InMemoryHistory
from companion.models.base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StatesRequest,
    ToolInstruction,
    ToolSpec,
)
from companion.models.scripted import ScriptedModel
from companion.protocol import MESSAGES, Message, Metadata, State
from companion.transport import Publisher
from companion.turns import bigram_jaccard

KYOKO = Metadata(
    id="companion_kyoko",
    name="kyoko",
    personality="明るくて好奇心旺盛、少し天然だけど優しい。",
    story="最新のAI技術で生まれたコンパニオン。日常にそっと寄り添う。",
    sample="こんにちは!私はkyokoです。今日はどんなお話をしましょうか?",
)
ALEX = Metadata(
    id="companion_alex",
    name="Alex",
    personality="dry-witted and curious, a retired lighthouse keeper",
    story="Alex kept the light on a northern island for thirty years.",
    sample="Evening. The sea was loud today, wasn't it?",
)
MIO = Metadata(id="companion_mio", name="Mio", personality="calm", story="A gardener.", sample="Hello.")

SPEAK_SPEC = ToolSpec("speak", "Say something.", SpeakInput.model_json_schema(), "action")
COMPANIONS_SPEC = ToolSpec(
    "companions", "List companions.", {"type": "object", "properties": {}}, "knowledge"
)
PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "already_replied": {"type": "boolean"},
        "interest": {"type": "integer", "minimum": 2, "maximum": 4},
        "warmth": {"type": "number", "minimum": 0.5, "maximum": 0.9},
        "emotion": {"type": "string", "enum": ["happy", "sad", "neutral"]},
        "topic": {"type": "string"},
        "partner": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "nested": {"type": "object", "properties": {"flag": {"type": "boolean"}}},
    },
    "required": ["already_replied", "interest", "warmth", "emotion", "topic", "partner", "tags"],
}


class ToolLog:
    """Records tool calls and answers them as the runtime would."""

    def __init__(self, answers: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._answers = {k: list(v) for k, v in (answers or {}).items()}

    async def __call__(self, tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append((tool_id, dict(raw)))
        queued = self._answers.get(tool_id)
        if queued:
            return queued.pop(0)
        if tool_id == "companions":
            return {"status": "ok", "output": {ALEX.id: ALEX.model_dump(), MIO.id: MIO.model_dump()}}
        SpeakInput.model_validate(raw)
        return {"status": "ok", "output": {"published": []}}


def _speak_request(
    me: Metadata = ALEX,
    text: str = "I found an old map in the attic today!",
    history: list[Message] | None = None,
    instructions: tuple[ToolInstruction, ...] = (ToolInstruction("speak", "continue the conversation"),),
    closing: str = "none",
    sender: str = "companion_mio",
) -> SpeakRequest:
    message = Message.create(sender, [me.id, "companion_kyoko"], text, id="m-last")
    return SpeakRequest(
        me=me,
        role="a friend",
        message=message,
        history=[*(history or []), message],
        instructions=instructions,
        tools=[SPEAK_SPEC, COMPANIONS_SPEC],
        recipients=[sender, "companion_kyoko"],
        closing=closing,  # type: ignore[arg-type]
        extra={"names": {"companion_mio": "Mio", "companion_kyoko": "kyoko"}},
    )


def _states_request(
    turn: int = 0, text: str = "What shall we talk about?", nominated: str | None = None
) -> StatesRequest:
    message = Message.create("user", [KYOKO.id, ALEX.id, MIO.id], text, id=f"t{turn}")
    return StatesRequest(message, [KYOKO, ALEX, MIO], [message], nominated=nominated, turn=turn)


async def test_same_seed_same_answers_other_seed_differs() -> None:
    answers = []
    for seed in (7, 7, 8):
        model = ScriptedModel(seed)
        states = [await model.decide_states(_states_request(turn, f"line {turn}")) for turn in range(4)]
        log = ToolLog()
        await model.speak(_speak_request(), log)
        params = await model.fill_params(
            ParamsRequest(ALEX, "friend", PARAMS_SCHEMA, _speak_request().message, [])
        )
        answers.append((states, log.calls, params))
    assert answers[0] == answers[1]
    assert answers[0] != answers[2]
    assert ScriptedModel(3).name == "scripted(seed=3)"


async def test_states_honour_nomination_and_names_and_someone_speaks() -> None:
    model = ScriptedModel(1)
    nominated = await model.decide_states(_states_request(nominated=MIO.id))
    assert [d.companion_id for d in nominated] == [KYOKO.id, ALEX.id, MIO.id]
    assert [d.selected for d in nominated] == [False, False, True]
    named = await model.decide_states(_states_request(text="Alex, what do you think?"))
    assert [d.companion_id for d in named if d.selected] == [ALEX.id]
    for turn in range(40):
        decisions = await model.decide_states(_states_request(turn, f"text {turn}"))
        assert any(d.state == "speak" for d in decisions)
        assert all(0 <= d.importance <= 10 for d in decisions)


async def test_proposes_pre_closing_after_its_seeded_length() -> None:
    model = ScriptedModel(5, min_replies=3, max_replies=5)
    first = _states_request().message
    length = model.conversation_length(first)
    assert 3 <= length <= 5
    stages = []
    for turn in range(7):
        request = StatesRequest(first, [KYOKO, ALEX], [first], turn=turn)
        stages.append({d.closing for d in await model.decide_states(request)})
    assert stages == [{"none"}] * (length - 1) + [{"pre-closing"}] * (7 - length + 1)
    with pytest.raises(ValueError):
        ScriptedModel(0, min_replies=4, max_replies=2)


async def test_fills_params_sensibly_and_validly() -> None:
    model = ScriptedModel(2)
    message = Message.create("companion_mio", [ALEX.id], "I'm so happy, the garden bloomed!")
    fresh = await model.fill_params(ParamsRequest(ALEX, "friend", PARAMS_SCHEMA, message, [message]))
    jsonschema.validate(fresh, PARAMS_SCHEMA)
    assert fresh["already_replied"] is False
    assert fresh["emotion"] == "happy" and fresh["partner"] == "companion_mio"
    assert fresh["topic"] and fresh["topic"] in message.params.message
    mine = Message.create(ALEX.id, ["companion_mio"], "Hello there.")
    later = await model.fill_params(ParamsRequest(ALEX, "friend", PARAMS_SCHEMA, message, [mine, message]))
    assert later["already_replied"] is True
    assert await model.fill_params(ParamsRequest(ALEX, "friend", {"type": "string"}, message, [])) == {}


async def test_speaks_in_character_through_the_speak_tool() -> None:
    log = ToolLog()
    await ScriptedModel(0).speak(_speak_request(), log)
    assert [tool for tool, _ in log.calls] == ["speak"]
    arguments = SpeakInput.model_validate(log.calls[0][1])
    assert arguments.to == ["companion_mio", "companion_kyoko"]
    assert "Mio" in arguments.message or "old map" in arguments.message
    assert arguments.emotion in ("happy", "neutral")

    ja = ToolLog()
    await ScriptedModel(0).speak(_speak_request(KYOKO, "今日はいい天気ですね。散歩に行きたいな。"), ja)
    text = ja.calls[0][1]["message"]
    assert any("\u3040" <= ch <= "\u30ff" for ch in text)


async def test_introduces_itself_with_its_sample_once() -> None:
    intro = (ToolInstruction("speak", "自己紹介をする。"),)
    log = ToolLog()
    await ScriptedModel(0).speak(_speak_request(KYOKO, instructions=intro), log)
    assert log.calls[0][1]["message"] == KYOKO.sample
    before = [Message.create(KYOKO.id, ["companion_mio"], KYOKO.sample)]
    again = ToolLog()
    await ScriptedModel(0).speak(_speak_request(KYOKO, history=before, instructions=intro), again)
    assert again.calls[0][1]["message"] != KYOKO.sample


async def test_follows_knowledge_instructions_before_speaking() -> None:
    instructions = (
        ToolInstruction("companions", "find out who is here"),
        ToolInstruction("speak", "greet them"),
    )
    log = ToolLog()
    request = _speak_request(instructions=instructions)
    request = dataclasses.replace(request, extra={})
    await ScriptedModel(0).speak(request, log)
    assert [tool for tool, _ in log.calls] == ["companions", "speak"]
    assert "companion_mio" not in log.calls[1][1]["message"]  # names come from the knowledge answer


async def test_retries_once_on_invalid_input_then_gives_up_quietly() -> None:
    invalid = {"status": "invalid_input", "code": -32004, "message": "bad emotion"}
    log = ToolLog({"speak": [invalid, invalid]})
    await ScriptedModel(0).speak(_speak_request(), log)
    assert [tool for tool, _ in log.calls] == ["speak", "speak"]
    assert log.calls[1][1]["emotion"] == "neutral"


async def test_without_a_speaking_tool_it_is_a_model_error() -> None:
    request = _speak_request()
    bare = SpeakRequest(request.me, request.role, request.message, request.history, (), [COMPANIONS_SPEC], [])
    with pytest.raises(ModelError, match="no tool to speak with"):
        await ScriptedModel(0).speak(bare, ToolLog())


async def test_varies_lines_and_closes_warmly() -> None:
    model = ScriptedModel(4)
    history: list[Message] = []
    lines = []
    for turn in range(6):
        log = ToolLog()
        request = _speak_request(ALEX, "Tell me about the lighthouse.", history=history)
        await model.speak(request, log)
        line = log.calls[0][1]["message"]
        lines.append(line)
        history = [*history, Message.create(ALEX.id, ["companion_mio"], line, id=f"a{turn}")]
    assert len(set(lines)) == len(lines)
    for a, b in itertools.pairwise(lines):
        assert bigram_jaccard(a, b) < 0.9
    log = ToolLog()
    await model.speak(_speak_request(closing="closing"), log)
    assert log.calls[0][1]["emotion"] == "happy"
    assert any(word in log.calls[0][1]["message"] for word in ("Bye", "See you", "Take care"))


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def publish(self, topic: str, envelope: Any) -> None:
        self.sent.append((topic, envelope))


async def test_speaks_through_the_real_action_runtime() -> None:
    sink = _Sink()
    publisher: Publisher = sink
    runtime = ActionRuntime(
        metadata=ALEX, publisher=publisher, directory={ALEX.id: ALEX, MIO.id: MIO}, history=InMemoryHistory()
    )
    runtime.register(resolve_tool("speak"))
    runtime.register(resolve_tool("companions"))

    async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        return (await runtime.call(tool_id, raw)).for_model()

    request = _speak_request()
    request = SpeakRequest(
        request.me,
        request.role,
        request.message,
        request.history,
        request.instructions,
        runtime.tool_specs(),
        request.recipients,
    )
    await ScriptedModel(0).speak(request, call_tool)
    assert len(sink.sent) == 1
    topic, message = sink.sent[0]
    assert topic == MESSAGES and isinstance(message, Message) and message.params.from_ == ALEX.id
    assert not isinstance(message, State)
