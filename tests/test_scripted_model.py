"""The offline scripted model, call by call: deterministic, in character, answers questions,
follows instructions (custom actions included, through the real action runtime), never crashes."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
import pytest

from companion.actions import ActionRuntime, resolve_tool
from companion.actions.builtins import SpeakInput
from companion.conversation.rules import bigram_jaccard
from companion.lines.check import NOT_SAID
from companion.models.base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StatesRequest,
    ToolInstruction,
    ToolSpec,
)
from companion.models.lexicon import (
    FEELINGS,
    concepts_in,
    content_stems,
    is_question,
    sentences,
    topic_phrase,
)
from companion.models.phrasebook import EN, JA
from companion.models.scripted import ScriptedModel
from companion.protocol import ACTIONS, MESSAGES, Action, ClosingStage, Message, Metadata
from companion.store.history import InMemoryHistory
from support.cards import metadata as md
from support.recorders import Sink
from support.scripted import REPO, RUNG, real_cards, ring_bell

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
MIO = md("mio", name="Mio", personality="calm", story="A gardener.", sample="Hello.")

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

    @property
    def said(self) -> str:
        return str(self.calls[-1][1]["message"])


def _speak_request(
    me: Metadata = ALEX,
    text: str = "I found an old map in the attic today!",
    history: list[Message] | None = None,
    instructions: tuple[ToolInstruction, ...] = (ToolInstruction("speak", "continue the conversation"),),
    closing: ClosingStage = "none",
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
        recipients=[r for r in (sender, "companion_kyoko", ALEX.id) if r != me.id],
        closing=closing,
        extra={"names": {"companion_mio": "Mio", "companion_kyoko": "kyoko", ALEX.id: "Alex"}},
    )


def _states_request(
    turn: int = 0, text: str = "What shall we talk about?", nominated: str | None = None
) -> StatesRequest:
    message = Message.create("user", [KYOKO.id, ALEX.id, MIO.id], text, id=f"t{turn}")
    return StatesRequest(message, [KYOKO, ALEX, MIO], [message], nominated=nominated, turn=turn)


async def test_same_seed_same_answers_other_seed_differs() -> None:
    answers = []
    states = []
    for seed in (7, 7, 8):
        model = ScriptedModel(seed)
        states.append([await model.decide_states(_states_request(turn, f"line {turn}")) for turn in range(4)])
        log = ToolLog()
        await model.speak(_speak_request(), log)
        params = await model.fill_params(
            ParamsRequest(ALEX, "friend", PARAMS_SCHEMA, _speak_request().message, [])
        )
        answers.append((log.calls, params))
    assert answers[0] == answers[1]
    assert answers[0] != answers[2]
    # States (and the conversation length) follow the conversation, not the leader's seed:
    # the engine picks the leader by message id, and every leader must decide alike.
    assert states[0] == states[1] == states[2]
    assert ScriptedModel(3).name == "scripted(seed=3)"


def test_the_same_seed_gives_the_same_line_in_another_process() -> None:
    """Demo nodes are separate processes with their own hash seeds: lines must not depend on it."""
    code = (
        "import trio\n"
        "from test_scripted_model import ALEX, ToolLog, _speak_request\n"
        "from companion.models.scripted import ScriptedModel\n"
        "log = ToolLog()\n"
        "trio.run(ScriptedModel(5).speak, _speak_request(ALEX, 'Do you like the sea?'), log)\n"
        "print(log.said)\n"
    )
    lines = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO / "tests")}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        lines.add(done.stdout.strip())
    assert len(lines) == 1 and lines.pop()


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


async def test_the_companion_the_message_is_about_is_keenest() -> None:
    """Questions about islands and lights go to the old light keeper more often than not."""
    questions = [
        "What's it like to live on an island?",
        "Who kept the light burning up north?",
        "How many years did you spend on the island?",
        "Have you ever lived on a northern island?",
        "Does anyone here know about lights on islands?",
        "Thirty years on an island, who could do that?",
        "Which of you has seen the northern lights from an island?",
        "Is anyone here an island person?",
    ]
    keen = {KYOKO.id: 0, ALEX.id: 0, MIO.id: 0}
    for question in questions:
        decisions = await ScriptedModel(0).decide_states(_states_request(text=question))
        keen[max(decisions, key=lambda d: d.importance).companion_id] += 1
    assert keen[ALEX.id] >= 6, keen


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


async def test_fills_params_from_the_words_and_validly() -> None:
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
    sad = Message.create("companion_mio", [ALEX.id], "I feel so lonely and sad tonight.")
    assert (await model.fill_params(ParamsRequest(ALEX, "friend", PARAMS_SCHEMA, sad, [sad])))[
        "emotion"
    ] == "sad"
    assert await model.fill_params(ParamsRequest(ALEX, "friend", {"type": "string"}, message, [])) == {}


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5}},
        },
        {"type": "object", "properties": {"x": {"type": "number", "minimum": 1.5, "maximum": 1.5}}},
        {
            "type": "object",
            "properties": {"k": {"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 9}},
        },
        {"type": "object", "properties": {"s": {"type": "string", "minLength": 30, "maxLength": 40}}},
        {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": "^[0-9]{3}$"}},
            "required": ["s"],
        },
        {
            "type": "object",
            "properties": {
                "d": {"type": "string", "format": "date"},
                "u": {"type": "string", "format": "uri"},
            },
        },
        {
            "type": "object",
            "properties": {
                "t": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "uniqueItems": True}
            },
        },
        {
            "type": "object",
            "properties": {"o": {"$ref": "#/$defs/O"}},
            "$defs": {"O": {"type": "object", "properties": {"v": {"const": 3}}, "required": ["v"]}},
        },
        {
            "type": "object",
            "properties": {"a": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 7}]}},
        },
        {"type": "object", "properties": {"b": {"type": ["null", "boolean"]}}, "required": ["b", "c"]},
        {
            "type": "object",
            "properties": {
                "deep": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"q": {"type": "string"}}},
                        "minItems": 1,
                    },
                    "minItems": 1,
                }
            },
        },
    ],
)
async def test_params_are_valid_for_awkward_schemas(schema: dict[str, Any]) -> None:
    message = Message.create("companion_mio", [ALEX.id], "Looks like rain tonight, three times over!")
    values = await ScriptedModel(0).fill_params(ParamsRequest(ALEX, "friend", schema, message, [message]))
    if schema.get("required") == ["b", "c"]:
        assert values["b"] in (None, True, False)  # "c" is required but undeclared: any value goes
    else:
        jsonschema.validate(values, schema)


async def test_speaks_in_character_through_the_speak_tool() -> None:
    log = ToolLog()
    await ScriptedModel(0).speak(_speak_request(), log)
    assert [tool for tool, _ in log.calls] == ["speak"]
    arguments = SpeakInput.model_validate(log.calls[0][1])
    assert arguments.to == ["companion_mio", "companion_kyoko"]
    assert "attic" in arguments.message or "old map" in arguments.message
    assert '"' not in arguments.message and "“" not in arguments.message  # it says things back, never quotes
    assert arguments.emotion in ("happy", "neutral")

    ja = ToolLog()
    await ScriptedModel(0).speak(_speak_request(KYOKO, "今日はいい天気ですね。散歩に行きたいな。"), ja)
    assert any("\u3040" <= ch <= "\u30ff" for ch in ja.said)
    assert "天気" in ja.said  # it reacts to the weather


@pytest.mark.parametrize(
    ("card", "question", "story_words"),
    [
        ("juniper", "What did you do before you took up the telescope?", 2),
        ("ostra", "How long have you been at the library?", 2),
        ("pim", "Where did you work before you were an apprentice?", 2),
    ],
)
async def test_a_question_about_the_story_gets_an_answer_from_the_story(
    card: str, question: str, story_words: int
) -> None:
    loaded = next(c for c in real_cards() if c.card.metadata.id == f"companion_{card}")
    me = loaded.card.metadata
    for seed in range(6):
        log = ToolLog()
        request = dataclasses.replace(_speak_request(me, question, sender="user_demo"), role=loaded.card.role)
        await ScriptedModel(seed).speak(request, log)
        said = log.said
        story = content_stems(me.story)
        statements = [s for s in sentences(said) if not is_question(s)]
        assert statements, f"only questions back: {said!r}"
        assert any(len(content_stems(s) & story) >= story_words for s in statements), said


async def test_different_questions_get_different_answers() -> None:
    questions = [
        "What's your favourite colour?",
        "Do you like the sea?",
        "Why did you leave the island?",
        "How are you today?",
        "Who are you?",
        "What do you think of thunderstorms?",
    ]
    answers = []
    for question in questions:
        log = ToolLog()
        await ScriptedModel(0).speak(_speak_request(ALEX, question, sender="user_demo"), log)
        answers.append(log.said)
        assert not is_question(sentences(log.said)[0]) or len(sentences(log.said)) > 1
    assert len(set(answers)) == len(answers)
    assert "I do" in answers[1] or "Yes" in answers[1]  # the sea is in Alex's story


async def test_introduces_itself_reacting_to_the_line() -> None:
    intro = (ToolInstruction("speak", "Introduce yourself briefly as the island's lighthouse keeper."),)
    log = ToolLog()
    await ScriptedModel(0).speak(_speak_request(ALEX, "Looks like rain tonight.", instructions=intro), log)
    assert "I'm Alex, the island's lighthouse keeper." in log.said
    assert "rain" in log.said.casefold()
    greeting = ToolLog()
    await ScriptedModel(0).speak(_speak_request(KYOKO, "こんにちは!", instructions=intro), greeting)
    assert "私はkyokoです。" in greeting.said  # its sample introduces it: said without its question


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
    assert "companion_mio" not in log.said  # names come from the knowledge answer


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
        lines.append(log.said)
        history = [*history, Message.create(ALEX.id, ["companion_mio"], log.said, id=f"a{turn}")]
    assert len(set(lines)) == len(lines)
    for a, b in itertools.pairwise(lines):
        assert bigram_jaccard(a, b) < 0.9
    log = ToolLog()
    await model.speak(_speak_request(closing="closing"), log)
    assert log.calls[0][1]["emotion"] == "happy"
    assert any(word in log.said for word in ("Bye", "See you", "Take care", "Good night"))


def _runtime(*tools: Any) -> tuple[ActionRuntime, Sink]:
    sink = Sink()
    runtime = ActionRuntime(
        metadata=ALEX, publisher=sink, directory={ALEX.id: ALEX, MIO.id: MIO}, history=InMemoryHistory()
    )
    for tool in tools:
        runtime.register(tool)
    return runtime, sink


def _through(
    runtime: ActionRuntime, request: SpeakRequest, instructions: Sequence[ToolInstruction]
) -> SpeakRequest:
    return dataclasses.replace(request, instructions=instructions, tools=runtime.tool_specs())


async def test_speaks_through_the_real_action_runtime() -> None:
    runtime, sink = _runtime(resolve_tool("speak"), resolve_tool("companions"))

    async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        return (await runtime.call(tool_id, raw)).for_model()

    request = _through(runtime, _speak_request(), _speak_request().instructions)
    await ScriptedModel(0).speak(request, call_tool)
    assert len(sink.sent) == 1
    topic, message = sink.sent[0]
    assert topic == MESSAGES and isinstance(message, Message) and message.params.from_ == ALEX.id
    assert ALEX.id not in message.params.to


async def test_an_instructed_custom_action_runs_before_the_reply_and_a_refusal_is_survived() -> None:
    """A real @action through the real runtime: called with input built from its schema and the
    words of the instruction; when it refuses, the companion still speaks, and says it tried."""
    runtime, sink = _runtime(resolve_tool("speak"), ring_bell)

    async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        return (await runtime.call(tool_id, raw)).for_model()

    RUNG.clear()
    ring = (
        ToolInstruction("ring_bell", "Ring the bell twice to welcome the newcomer."),
        ToolInstruction("speak", "Welcome them."),
    )
    await ScriptedModel(0).speak(
        _through(runtime, _speak_request(text="Hello, I'm new here!"), ring), call_tool
    )
    assert [type(e).__name__ for _, e in sink.sent] == ["Action", "Message"]
    bell = sink.sent[0][1]
    assert isinstance(bell, Action) and sink.sent[0][0] == ACTIONS
    assert bell.params.name == "ring_bell" and bell.params.params["times"] == 2

    sink.sent.clear()
    refused = (
        ToolInstruction("ring_bell", "Ring the bell to say goodbye."),
        ToolInstruction("speak", "Say goodbye."),
    )
    await ScriptedModel(0).speak(_through(runtime, _speak_request(text="Bye for now!"), refused), call_tool)
    assert len(RUNG) == 2  # it was called, and refused
    [(topic, message)] = sink.sent
    assert topic == MESSAGES and isinstance(message, Message)
    assert "tried to ring the shop bell" in message.params.message


@pytest.mark.parametrize(
    "text",
    [
        "\ud800",
        "\udfff lone low",
        "",
        "   ",
        "x" * 200_000,
        "雨" * 50_000,
        "🙂" * 300,
        "\x00\x07\u202e hi",
        "?!?!",
    ],
)
async def test_odd_input_never_crashes_and_replies_are_clean(text: str) -> None:
    model = ScriptedModel(0)
    for me in (ALEX, KYOKO):
        request = _speak_request(me, text)
        log = ToolLog()
        await model.speak(request, log)
        said = log.said
        said.encode("utf-8")  # no lone surrogate goes out on the wire
        assert said.strip() and len(said) <= 600
        assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in said)
        params = await model.fill_params(
            ParamsRequest(me, "friend", PARAMS_SCHEMA, request.message, [request.message])
        )
        jsonschema.validate(params, PARAMS_SCHEMA)
        states = await model.decide_states(StatesRequest(request.message, [ALEX, KYOKO], [request.message]))
        assert len(states) == 2
    again = ToolLog()
    await model.speak(_speak_request(ALEX, text), again)
    first = ToolLog()
    await model.speak(_speak_request(ALEX, text), first)
    assert again.calls == first.calls  # deterministic on odd input too


@pytest.mark.parametrize("language", ["en", "ja"])
def test_a_reaction_never_sounds_like_the_feeling_it_answers(language: str) -> None:
    """Companions hear each other: a reassurance that sounds flustered ("Easy mistake to make")
    makes the next companion reassure it back, line after line."""
    book = EN if language == "en" else JA
    for feeling in FEELINGS:
        for template in book.get(feeling, ()):
            said = re.sub(r"\{\w+\}", "", template)
            assert feeling not in concepts_in(said), (feeling, template)


def test_the_concepts_of_a_line_are_the_callers_own_to_change() -> None:
    """They are remembered per line (a leader rates one message for every addressed companion):
    a caller that edits its answer, as the persona's relevance does, must not change the next."""
    line = "I baked bread in the kitchen this morning, what about you?"
    first = concepts_in(line)
    assert first and "question" in first
    first.pop("question")
    first["weather"] = 9.0
    again = concepts_in(line)
    assert "question" in again and again.get("weather") != 9.0


async def test_a_refused_line_is_followed_by_one_other_line() -> None:
    """The engine refuses a line that copies one heard (``companion.lines.check``): the offline model
    then says something else once, rather than giving its slot up."""
    refused = {"status": "refused", "message": f"{NOT_SAID} repeats what was already said."}
    tools = ToolLog(answers={"speak": [refused]})
    await ScriptedModel().speak(_speak_request(), tools)
    said = [raw["message"] for tool, raw in tools.calls if tool == "speak"]
    assert len(said) == 2 and said[0] != said[1]
    assert content_stems(said[1]) != content_stems(said[0])


async def test_a_line_a_person_did_not_approve_is_not_said_again() -> None:
    """A refusal of another kind (a person's "no" to an approval) is an answer: no second try."""
    denied = {"status": "refused", "message": "denied: the person said no"}
    tools = ToolLog(answers={"speak": [denied]})
    await ScriptedModel().speak(_speak_request(), tools)
    assert [tool for tool, _ in tools.calls].count("speak") == 1


@pytest.mark.parametrize(
    ("asked", "topic"),
    [
        # what the card's own lines said back before (bench_latency's questions, measured):
        # "about a rainy", "about taught", "about makes", "about season smells", and later
        # "all I know of season" ("the season" now)
        ("Which road would you walk on a rainy morning?", "a rainy morning"),
        ("What would you cook for a tired friend?", "a tired friend"),
        ("How do you keep warm in a cold kitchen?", "a cold kitchen"),
        ("Which season smells the best to you, and why?", "the season"),
        ("What song do you hum when you are busy?", "the song"),
        ("What is your favourite sound at night?", "your favourite sound"),
        ("Juniper, who taught you to whistle?", None),
        ("Juniper, what makes you laugh out loud?", None),
        ("My dog loves the sea.", "my dog"),
        ("Why do stars twinkle?", "stars"),
        ("What did the old ferryman tell you last spring?", "the old ferryman"),
    ],
)
def test_the_topic_of_a_question_is_a_noun_phrase_never_a_verb(asked: str, topic: str | None) -> None:
    assert topic_phrase(asked, ["Juniper"]) == topic


async def test_when_every_line_composed_is_like_an_own_line_the_least_like_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A card's own line said after two refused tries is refused too when it copies one of the
    companion's earlier lines, and the slot is given up (SmolLM2 bench: 2 turns of 30 without a
    line). When no line composed is unlike them all, the least like any is said, not the first."""
    said_before = "I've told you most of what I know about a rainy morning."
    history = [Message.create(ALEX.id, ["companion_mio"], said_before, id="m-old")]
    other = "I've told you most of what I know about a cold morning."  # like it, less so
    composed = iter([said_before] * 3 + [other] + [said_before] * 2)
    monkeypatch.setattr("companion.models.scripted.compose", lambda *_a, **_k: next(composed))
    tools = ToolLog()
    await ScriptedModel().speak(_speak_request(history=history), tools)
    said = [raw["message"] for tool, raw in tools.calls if tool == "speak"]
    assert said == [other]


async def test_a_line_the_engine_would_refuse_as_a_copy_is_not_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlike the own line by the model's measure (bigram likeness 0.58), a copy by the engine's
    line check: said as the card's own line after the model's two refused, it was refused too
    and the slot given up, so the person heard nothing (SmolLM2-135M bench, measured). A line
    the check passes is said instead."""
    said_before = "I've told you most of what I know about a rainy morning."
    history = [Message.create(ALEX.id, ["companion_mio"], said_before, id="m-old")]
    near = "I've told you most of what I know about a tired friend."
    fresh = "Bees keep their own hours up on the roof."
    composed = iter([near, fresh, near, near, near, near])
    monkeypatch.setattr("companion.models.scripted.compose", lambda *_a, **_k: next(composed))
    tools = ToolLog()
    await ScriptedModel().speak(_speak_request(history=history), tools)
    assert [raw["message"] for tool, raw in tools.calls if tool == "speak"] == [fresh]
