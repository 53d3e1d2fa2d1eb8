"""The pure parts of the provider path: output checks, tool names and prompt text."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from companion.models.base import ParamsRequest, SpeakRequest, StatesRequest, ToolInstruction, ToolSpec
from companion.models.prompts import (
    HISTORY_LIMIT,
    format_history,
    params_prompt,
    speak_prompt,
    speaker_turns,
    states_prompt,
)
from companion.models.structured import (
    Problems,
    check_params,
    check_states,
    params_schema_problems,
    parse_json_object,
    spoken_text,
    states_schema,
    wire_tool_names,
)
from companion.protocol import Message, Metadata
from support.cards import metadata as md

A = Metadata(id="companion_a", name="Ann", personality="bold " * 400, story="s", sample="Yo")
B = md("b", name="Bo", personality="shy", sample="um")
OPENING = Message.create("user_1", [A.id, B.id], "Hello!")


def request(**over: Any) -> StatesRequest:
    fields: dict[str, Any] = {"message": OPENING, "companions": [A, B], "history": [OPENING]}
    return StatesRequest(**(fields | over))


def test_states_come_back_in_companion_order() -> None:
    """One number per companion, in order: 0 listens, above 0 wants to speak that much."""
    decisions = check_states({"speak": [0, 2]}, request())
    assert not isinstance(decisions, Problems)
    assert [(d.companion_id, d.state, d.importance, d.selected, d.closing) for d in decisions] == [
        (A.id, "listen", 0.0, False, "none"),
        (B.id, "speak", 2.0, False, "none"),
    ]


def test_a_partial_states_answer_is_used_not_refused() -> None:
    """A small model gives too many numbers, too few, or selects an unknown id: each costs
    nothing but itself."""
    decisions = check_states({"speak": [3, 0, 9]}, request())
    assert not isinstance(decisions, Problems)
    assert [(d.state, d.importance) for d in decisions] == [("speak", 3.0), ("listen", 0.0)]
    decisions = check_states({"speak": [3], "selected": ["companion_x", B.id]}, request())
    assert not isinstance(decisions, Problems)
    assert [(d.companion_id, d.state, d.importance, d.selected) for d in decisions] == [
        (A.id, "speak", 3.0, False),
        (B.id, "listen", 0.0, True),
    ]


def test_when_everybody_listens_the_first_speaks() -> None:
    """Measured with SmolLM2-135M: every companion rated to listen, and nobody spoke again. The
    first companion speaks; a nominee speaks anyway, so nobody else is made to."""
    decisions = check_states({"speak": [0, 0]}, request())
    assert not isinstance(decisions, Problems)
    assert [d.state for d in decisions] == ["speak", "listen"]
    decisions = check_states({"speak": [0, 0]}, request(nominated=B.id))
    assert not isinstance(decisions, Problems)
    assert [(d.state, d.selected) for d in decisions] == [("listen", False), ("listen", True)]


@pytest.mark.parametrize(
    ("floor", "answered", "expected"),
    [
        ("none", "terminal", "pre-closing"),
        ("none", "none", "none"),
        ("none", None, "none"),
        ("pre-closing", "terminal", "pre-closing"),
        ("closing", "none", "closing"),
        ("closing", "terminal", "closing"),
        ("terminal", "none", "terminal"),
        ("terminal", None, "terminal"),
    ],
)
def test_the_model_may_begin_closing_but_only_the_floor_moves_it_on(
    floor: str, answered: str | None, expected: str
) -> None:
    raw: dict[str, Any] = {"speak": [5, 5]} | ({"closing": answered} if answered else {})
    decisions = check_states(raw, request(closing_floor=floor))
    assert not isinstance(decisions, Problems)
    assert {d.closing for d in decisions} == {expected}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"speak": []}, "no number for any of the companions"),
        ({"speak": [11, 2]}, "speak.0: Input should be less than or equal to 10"),
        ({"speak": [-1, 2]}, "speak.0: Input should be greater than or equal to 0"),
        ({"speak": ["loud", 2]}, "speak.0: Input should be a valid number"),
        ({"speak": [1e400, 2]}, "speak.0"),
        ({"speak": "none"}, "speak: Input should be a valid list"),
        ({"speak": [5], "closing": "soon"}, "closing: Input should be"),
        ({"speak": [5], "selected": "companion_a"}, "selected: Input should be a valid list"),
        ({}, "speak: Field required"),
        ({"states": [{"companion_id": "companion_a", "state": "speak"}]}, "speak: Field required"),
    ],
)
def test_bad_states_are_problems_for_the_model(raw: dict[str, Any], problem: str) -> None:
    result = check_states(raw, request())
    assert isinstance(result, Problems)
    assert problem in str(result)


def test_states_rules_of_the_request_are_applied() -> None:
    result = check_states(
        {"speak": [5, 5], "selected": [A.id], "closing": "terminal"},
        request(closing_floor="closing", nominated=B.id),
    )
    assert not isinstance(result, Problems)
    assert [(d.closing, d.selected) for d in result] == [("closing", True), ("closing", True)]


def test_states_schema_names_exactly_the_companions_and_asks_one_number_each() -> None:
    schema = states_schema([A.id, B.id])
    speak = schema["properties"]["speak"]
    assert (speak["minItems"], speak["maxItems"], speak["items"]["enum"]) == (2, 2, list(range(11)))
    assert schema["properties"]["selected"]["items"]["enum"] == [A.id, B.id]
    assert schema["required"] == ["speak"] and schema["additionalProperties"] is False


def test_the_usual_states_answer_is_a_few_tokens_and_valid() -> None:
    """What the leader's model writes before anyone can speak: the usual answer for two
    companions is 17 characters (one entry per companion, the former answer, was 228)."""
    usual = {"speak": [7, 0]}
    assert len(json.dumps(usual)) == 17
    jsonschema.validate(usual, states_schema([A.id, B.id]))
    assert not isinstance(check_states(usual, request()), Problems)


SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["up", "down"]}, "n": {"type": "integer"}},
    "required": ["mood"],
}


def test_params_check_lists_every_problem() -> None:
    assert check_params({"mood": "up", "n": 2}, SCHEMA) == {"mood": "up", "n": 2}
    problems = check_params({"n": "two"}, SCHEMA)
    assert isinstance(problems, Problems)
    assert problems.items == ("(root): 'mood' is a required property", "n: 'two' is not of type 'integer'")


def test_params_schema_must_be_an_object_schema() -> None:
    assert params_schema_problems(SCHEMA) is None
    assert "type 'object'" in str(params_schema_problems({"type": "array"}))
    assert "not valid JSON Schema" in str(params_schema_problems({"type": "object", "required": "mood"}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": [1]}\n```', {"a": [1]}),
        ("[1, 2]", None),
        ("sure! here it is", None),
    ],
)
def test_json_written_as_text(text: str, expected: dict[str, Any] | None) -> None:
    assert parse_json_object(text) == expected


def test_wire_tool_names_are_valid_unique_and_stable() -> None:
    specs = [
        ToolSpec(id=tool_id, description="", input_schema={})
        for tool_id in ("speak", "pkg.mod:tool", "pkg_mod_tool", "x" * 80, "", "a b")
    ]
    names = wire_tool_names(specs)
    assert list(names.values()) == specs
    assert list(names)[:3] == ["speak", "pkg_mod_tool", "pkg_mod_tool_2"]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) for name in names)
    assert wire_tool_names(specs) == names


def test_history_is_bounded_and_ends_with_the_message() -> None:
    history = [Message.create(A.id, [B.id], f"line {i}") for i in range(30)]
    last = Message.create(B.id, [A.id], "the last one " + "x" * 5000)
    lines = format_history([*history, last], last, {A.id: "Ann"}).splitlines()
    assert len(lines) == HISTORY_LIMIT
    assert lines[0].startswith("1. Ann (companion_a) -> companion_b: line 19")
    assert lines[-1].startswith(f"{HISTORY_LIMIT}. companion_b -> Ann (companion_a): the last one")
    assert len(lines[-1]) < 1100


def test_states_prompt_is_bounded_and_mentions_the_rules() -> None:
    instructions, prompt = states_prompt(request(nominated=B.id, closing_floor="pre-closing"), "set_states")
    assert "set_states" in prompt and "set_states" not in instructions
    assert "Bo (companion_b) to speak next" in prompt and "at least 'pre-closing'" in prompt
    assert len(prompt) < 2000, "a long personality is clipped"


def test_speak_prompt_names_tools_instructions_and_closing() -> None:
    tools = wire_tool_names(
        [
            ToolSpec(id="speak", description="", input_schema={}),
            ToolSpec(id="kb.lookup", description="", input_schema={}, kind="knowledge"),
        ]
    )
    req = SpeakRequest(
        me=B,
        role="a helper",
        message=OPENING,
        history=[OPENING],
        instructions=[ToolInstruction("kb.lookup", "check facts"), ToolInstruction("speak", "answer")],
        tools=list(tools.values()),
        recipients=["user_1", A.id],
        closing="closing",
        extra={"memory": {"weather": "rain", "conversation": {"turn": 3}}, "params": {"mood": "calm"}},
        assessed={"type": "object"},
    )
    instructions, prompt = speak_prompt(req, tools)
    assert "You are Bo" in instructions and "a helper" in instructions
    # how its words reach the others is the same every turn: in the instructions, not the task
    assert "Action tools (they do something others see): speak." in instructions
    assert "Knowledge tools (they tell you something; use only if needed): kb_lookup." in instructions
    assert "Action tools" not in prompt and "- kb_lookup: check facts" in prompt
    assert "say goodbye" in prompt
    assert "Address: user_1, companion_a." in prompt
    # the parameters call before it has the same instructions: a local server reuses its prefix
    params = ParamsRequest(
        me=B,
        role="a helper",
        schema={"type": "object"},
        message=OPENING,
        history=[OPENING],
        tools=req.tools,
    )
    params_instructions, params_text = params_prompt(params, "set_params")
    assert params_instructions == instructions
    # the parameters are described there, once: the parameters call needs no task
    assert 'Parameters (JSON Schema): {"type": "object"}' in instructions
    # a forced tool call needs no task at all: the others' lines are the whole user turn
    assert params_text == "user_1: Hello!"
    json_text = params_prompt(params, "set_params", as_json=True)[1]
    assert json_text.endswith('valid against this JSON Schema: {"type": "object"}')
    assert "Parameters" not in speak_prompt(replace(req, assessed=None), tools)[0]  # none asked for
    text_instructions = speak_prompt(req, tools, text_reply=True)[0]
    assert params_prompt(params, "set_params", text_reply=True)[0] == text_instructions
    assert "Answer with only the words you say out loud" in text_instructions
    assert "Action tools" not in text_instructions
    # stable first (the same instructions), then the conversation, identical in both calls, and
    # the volatile task last: what a small model continues is its own turn, never a JSON block
    conversation = "user_1: Hello!"
    assert prompt.startswith(conversation) and params_text.startswith(conversation)
    assert "Hello!" not in instructions and "->" not in prompt
    assert "- weather: rain" in prompt and "Context:" not in prompt and 'turn": 3' not in prompt
    assert prompt.endswith("Address: user_1, companion_a.")


def test_the_turn_line_is_said_only_when_it_tells_something() -> None:
    """Answering whoever spoke since the speaker's own line needs no turn line (17 of the 32
    tokens a one-to-one turn evaluated anew before any word); other recipients, or a task with
    nothing else in it, keep it."""
    says = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
    tools = wire_tool_names([ToolSpec(id="speak", description="", input_schema=says)])
    reply = Message.create(B.id, ["user_1"], "Hi.")
    again = Message.create("user_1", [B.id], "And you, Ann?")
    asked = Message.create(A.id, [B.id], "Bo?")
    req = SpeakRequest(
        B,
        "a helper",
        again,
        [OPENING, reply, asked, again],
        [ToolInstruction("speak", "Reply.")],
        list(tools.values()),
        ["user_1", A.id],
    )
    # the lines since Bo's own come from user_1 and Ann: addressing both says nothing new
    assert speak_prompt(req, tools)[1] == f"{A.id}: Bo?\nuser_1: And you, Ann?\n\nReply."
    # one of them only, or someone else as well: said
    for recipients in (["user_1"], ["user_1", A.id, "user_2"]):
        prompt = speak_prompt(replace(req, recipients=recipients), tools)[1]
        assert prompt.endswith(f"It is your turn (Bo). Address: {', '.join(recipients)}.")
    # Bo's own line ends what it heard: the lines before it do not count
    late = replace(req, history=[OPENING, asked, reply, again], recipients=["user_1"])
    assert speak_prompt(late, tools)[1] == "user_1: And you, Ann?\n\nReply."
    # no instruction, memory or closing stage: the turn line is the task
    bare = speak_prompt(replace(req, instructions=[]), tools)[1]
    assert bare.endswith(f"It is your turn (Bo). Address: user_1, {A.id}.")
    # a server that takes no tools is still asked for only its words
    text_prompt = speak_prompt(req, tools, text_reply=True)[1]
    assert text_prompt.endswith("Reply.\n\nWhat do you say now, Bo? Only your words.")


def test_a_forced_parameters_call_has_no_task() -> None:
    """The server fills the tool's schema and the instructions say what it is for: the others'
    lines are the whole user turn. Written out as JSON, or with nothing heard, the task stays."""
    params = ParamsRequest(me=B, role="r", schema={"type": "object"}, message=OPENING, history=[OPENING])
    assert params_prompt(params, "set_params")[1] == "user_1: Hello!"
    as_json = params_prompt(params, "set_params", as_json=True)[1]
    assert as_json.startswith("user_1: Hello!\n\nAssess the situation now: fill in the parameters")
    mine = Message.create(B.id, ["user_1"], "Hi.")
    alone = replace(params, message=mine, history=[OPENING, mine])
    assert params_prompt(alone, "set_params")[1] == "Assess the situation now."


def test_a_lone_instruction_for_the_words_is_written_alone() -> None:
    """The task is evaluated anew every turn, before any word: no heading and no tool name when
    the answer can only go to one action that says a line."""
    says = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
    speak = ToolSpec(id="speak", description="", input_schema=says)
    lookup = ToolSpec(id="kb.lookup", description="", input_schema={}, kind="knowledge")
    wave = ToolSpec(id="wave", description="", input_schema={})
    tools = wire_tool_names([speak, lookup])
    req = SpeakRequest(
        B,
        "a helper",
        OPENING,
        [OPENING],
        [ToolInstruction("speak", "Reply briefly.")],
        list(tools.values()),
        ["user_1"],
    )
    prompt = speak_prompt(req, tools)[1]
    assert prompt == "user_1: Hello!\n\nReply briefly."
    assert speak_prompt(req, tools, text_reply=True)[1].startswith("user_1: Hello!\n\nReply briefly.\n\n")
    # another action the model could call instead, or an action that says no line: named
    with_wave = wire_tool_names([speak, wave])
    assert "- speak: Reply briefly." in speak_prompt(replace(req, tools=[speak, wave]), with_wave)[1]
    silent = wire_tool_names([replace(speak, input_schema={})])
    assert "- speak: Reply briefly." in speak_prompt(req, silent)[1]
    # on a server that takes no tools a lone instruction needs no tool's name either
    waving = replace(req, instructions=[ToolInstruction("wave", "Wave.")])
    assert "\n\nWave.\n\n" in speak_prompt(waving, with_wave, text_reply=True)[1]
    assert "- wave: Wave." in speak_prompt(waving, with_wave)[1]


def test_a_companions_instructions_are_the_same_on_every_call() -> None:
    """What a server's prompt cache keeps: the instructions do not change with the turn."""
    later = Message.create(A.id, [B.id], "And then?")
    tools = wire_tool_names([ToolSpec(id="speak", description="", input_schema={})])
    first = SpeakRequest(B, "a helper", OPENING, [OPENING], [], list(tools.values()), ["user_1"])
    second = SpeakRequest(B, "a helper", later, [OPENING, later], [], list(tools.values()), [A.id], "closing")
    assert speak_prompt(first, tools)[0] == speak_prompt(second, tools)[0]
    assert speak_prompt(first, tools, text_reply=True)[0] == speak_prompt(second, tools, text_reply=True)[0]
    # the next turn's prompt begins with the previous turn's conversation: only new lines are evaluated
    history = speak_prompt(first, tools)[1].split("\n\n")[0]
    assert speak_prompt(second, tools)[1].startswith(history + "\ncompanion_a: And then?")
    states = states_prompt(request(), "set_states")[0]
    assert states == states_prompt(request(nominated=B.id, closing_floor="closing"), "set_states")[0]


def test_the_speaker_sees_the_conversation_as_chat_turns() -> None:
    """Its own lines are its turns, the others' lines ``id: line`` in the user's turns; the last
    user turn (the others' lines since its own) opens the prompt. Measured with SmolLM2-135M: a
    numbered record in one prompt was written on as its line."""
    said = [
        Message.create(B.id, ["user_1"], "I came early."),  # an own line first: left out
        Message.create("user_1", [B.id], "Hello!"),
        Message.create(A.id, [B.id], "Hi Bo."),
        Message.create(B.id, ["user_1"], "Hi, both of you."),
        Message.create("user_1", [B.id], "What did you bake?"),
        Message.create(A.id, [B.id], "Tell us!"),
    ]
    turns, heard = speaker_turns(B, said[:-1], said[-1])
    assert turns == ((False, "user_1: Hello!\ncompanion_a: Hi Bo."), (True, "Hi, both of you."))
    assert heard == "user_1: What did you bake?\ncompanion_a: Tell us!"
    tools = wire_tool_names([ToolSpec(id="speak", description="", input_schema={})])
    req = SpeakRequest(B, "a helper", said[-1], said[:-1], [], list(tools.values()), ["user_1"])
    assert speak_prompt(req, tools)[1].startswith(heard + "\n\n")
    # the next turn's earlier turns begin with these: a server's cache keeps them evaluated
    after = Message.create(B.id, ["user_1"], "Bread, of course.")
    later = Message.create("user_1", [B.id], "Nice.")
    assert speaker_turns(B, [*said, after], later)[0][: len(turns)] == turns
    # bounded as the record is
    many = [Message.create("user_1", [B.id], f"line {i}") for i in range(30)]
    turns, heard = speaker_turns(B, many[:-1], many[-1])
    assert turns == () and len(heard.splitlines()) == HISTORY_LIMIT


def test_a_past_turn_is_quoted_as_it_was_asked() -> None:
    """With ``asked``, the user turn before an own line is the whole turn as it was sent, task
    included; the others' lines still open the last one, which no line answered yet."""
    said = [
        Message.create("user_1", [B.id], "Hello!"),
        Message.create(B.id, ["user_1"], "Hi."),
        Message.create("user_1", [B.id], "Hello again!"),
    ]
    asked = {"user_1: Hello!": "user_1: Hello!\n\nIt is your turn.", "user_1: Hello again!": "not this"}
    turns, heard = speaker_turns(B, said[:-1], said[-1], asked=asked)
    assert turns == ((False, "user_1: Hello!\n\nIt is your turn."), (True, "Hi."))
    assert heard == "user_1: Hello again!"


def test_a_heading_alone_is_not_a_line() -> None:
    """Measured with SmolLM2-135M: "Conversation:" was said as a whole line."""
    assert spoken_text("Conversation:", ["Pim"]) == ""
    assert spoken_text("Conversation:\nThe oven is warm today!", ["Pim"]) == "The oven is warm today!"
    assert spoken_text("Note: the oven is warm.", ["Pim"]) == "Note: the oven is warm."


def test_the_speakers_own_label_is_not_said_even_mangled() -> None:
    """Measured with SmolLM2-135M as Pim: "Pimp: I am happy to announce ..."."""
    assert spoken_text("Pimp: I am happy to announce it.", ["Pim"]) == "I am happy to announce it."
    assert spoken_text("**Pim** (smiling): Flour first.", ["Pim"]) == "Flour first."
    assert spoken_text("Pam: Flour first.", ["Pim"]) == "Pam: Flour first."


def test_a_small_models_echo_of_its_prompt_is_not_its_line() -> None:
    """Measured with SmolLM2-135M: it repeated a history line or the turn line before its own."""
    prompt = (
        "Answer with only the words you say.\nIt is your turn (Ostra). Address: companion_juniper, user_demo."
    )
    echo = (
        "2. user_demo -> Juniper (companion_juniper), companion_pim: Hello everyone!\n"
        "It is your turn (Ostra). Address: companion_juniper, user_demo.\n"
        "Ostra: The tide was kind today.\nJuniper: Indeed!"
    )
    assert spoken_text(echo, ["Ostra"], prompt) == "The tide was kind today."
    assert (
        spoken_text("It is your turn (Ostra). Address: companion_juniper, user_demo.", ["Ostra"], prompt)
        == ""
    )
