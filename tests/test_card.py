"""CompanionCard loading: the example cards, and every problem a broken card can have."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from companion.actions import (
    BUILTINS,
    ActionContext,
    ActionDef,
    KnowledgeDef,
    ToolNotFound,
    action,
    knowledge,
)
from companion.card.model import (
    CardError,
    CardProblem,
    CardSettings,
    CompanionCard,
    Condition,
    Events,
    Execute,
    LoadedCard,
    Routine,
    card_json_schema,
    image_path,
    image_type,
    load_card,
)
from companion.card.triggers import ToolInstruction
from companion.protocol import Action, Metadata
from support.cards import metadata as md

CARDS = Path(__file__).resolve().parent.parent / "cards"


class WaveInput(BaseModel):
    how: str = "small"


@action(id="wave", description="Wave at someone.", input=WaveInput)
def wave(ctx: ActionContext[WaveInput]) -> Action:
    return Action.create(ctx.companion_id, "wave", {"how": ctx.input.how})


@knowledge(id="weather", description="Today's weather.", input=WaveInput, output=str)
def weather(ctx: ActionContext[WaveInput]) -> str:
    return "sunny"


@action(id="speak", description="A second tool that claims the id speak.", input=WaveInput)
def impostor(ctx: ActionContext[WaveInput]) -> Action:
    return Action.create(ctx.companion_id, "speak", {})


TOOLS: dict[str, ActionDef | KnowledgeDef] = {
    **BUILTINS,
    "wave": wave,
    "mytools.gestures:wave_action": wave,
    "weather": weather,
    "mytools.impostor:speak": impostor,
}


def resolve(ref: str) -> ActionDef | KnowledgeDef:
    """A small registry for tests: the built-ins plus a few tools of our own."""
    if ref not in TOOLS:
        raise ToolNotFound(ref, "no such tool in the test registry")
    return TOOLS[ref]


GOOD = """\
metadata:
  id: companion_tess
  name: Tess
  personality: Quick and kind.
  story: Grew up on a ferry.
  sample: "Morning! Tide's in."
role: Keep it short.
actions: [speak, "mytools.gestures:wave_action"]
knowledge: [weather]
events:
  params:
    type: object
    properties:
      emotion: {type: string, enum: [joy, calm]}
      energy: {type: integer}
    required: [emotion, energy]
  conditions:
    - expression: emotion == "joy"
      execute:
        - {tool: "mytools.gestures:wave_action", instruction: wave hello}
        - {tool: speak, instruction: greet brightly}
    - expression: energy > 3
      execute:
        - {tool: speak, instruction: keep talking}
        - {tool: weather, instruction: mention the weather}
"""


def write(tmp_path: Path, text: str, name: str = "card.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems(path: Path) -> list[CardProblem]:
    with pytest.raises(CardError) as info:
        load_card(path, resolve=resolve)
    return info.value.problems


def only(found: list[CardProblem], field: str) -> CardProblem:
    matching = [p for p in found if p.path == field]
    assert len(matching) == 1, [str(p) for p in found]
    return matching[0]


def edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


# --- the example cards -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(CARDS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_cards_load_with_the_real_registry(path: Path) -> None:
    loaded = load_card(path)
    assert loaded.card.metadata.id.startswith("companion_")
    assert len(loaded.triggers) >= 2
    assert "speak" in loaded.tools
    assert loaded.card.settings.model is None
    assert loaded.path == path


def test_there_are_three_distinct_example_cards() -> None:
    cards = [load_card(p).card for p in sorted(CARDS.glob("*.yaml"))]
    assert len(cards) == 3
    assert len({c.metadata.id for c in cards}) == 3
    assert len({c.metadata.personality for c in cards}) == 3


def test_example_card_conditions_react_to_the_engine_signals() -> None:
    juniper = load_card(CARDS / "juniper.yaml")
    ending = juniper.triggers.evaluate({"emotion": "calm", "topic_energy": 5, "wants_to_end": True})
    assert ending[0].tool == "speak" and "Sign off" in ending[0].instruction
    curious = juniper.triggers.evaluate({"emotion": "curious", "topic_energy": 8.0, "wants_to_end": False})
    assert "follow-up question" in curious[0].instruction


# --- a good card -----------------------------------------------------------------------------------


def test_good_card_resolves_tools_by_id_and_compiles_triggers(tmp_path: Path) -> None:
    loaded = load_card(write(tmp_path, GOOD), resolve=resolve)
    assert set(loaded.tools) == {"speak", "wave", "weather"}
    assert loaded.tools["weather"].kind == "knowledge"
    assert loaded.triggers.evaluate({"emotion": "joy", "energy": 5}) == [
        ToolInstruction("wave", "wave hello"),
        ToolInstruction("speak", "greet brightly"),
        ToolInstruction("weather", "mention the weather"),
    ]
    assert loaded.card.settings == CardSettings()
    assert loaded.card.settings.repetition_threshold == 0.6
    assert loaded.card.knowledge == ["weather"]


def test_execute_may_name_a_tool_by_its_id(tmp_path: Path) -> None:
    text = edit('- {tool: "mytools.gestures:wave_action", instruction', "- {tool: wave, instruction")
    loaded = load_card(write(tmp_path, text), resolve=resolve)
    assert loaded.triggers.evaluate({"emotion": "joy", "energy": 0})[0] == ToolInstruction(
        "wave", "wave hello"
    )


def test_settings_are_read(tmp_path: Path) -> None:
    text = GOOD + "settings:\n  model: openai:gpt-4o-mini\n  max_turns: 8\n  repetition_threshold: 0.5\n"
    settings = load_card(write(tmp_path, text), resolve=resolve).card.settings
    assert settings == CardSettings(model="openai:gpt-4o-mini", max_turns=8, repetition_threshold=0.5)


TOML = """\
        role = "Keep it short."
        actions = ["speak"]
        [metadata]
        id = "companion_tess"
        name = "Tess"
        personality = "Quick."
        story = "Ferry."
        sample = "Hi."
        [events.params]
        type = "object"
        properties = { energy = { type = "integer" } }
        [[events.conditions]]
        expression = "energy > 3"
        execute = [{ tool = "speak", instruction = "talk" }]
        """


def test_toml_cards_load_too(tmp_path: Path) -> None:
    loaded = load_card(write(tmp_path, TOML, "card.toml"), resolve=resolve)
    assert loaded.triggers.evaluate({"energy": 4}) == [ToolInstruction("speak", "talk")]


def test_a_card_built_in_python_gets_the_same_checks() -> None:
    card = CompanionCard(
        metadata=md("py", name="Py"),
        role="r",
        actions=["speak"],
        events=Events(
            params={"type": "object", "properties": {"n": {"type": "integer"}}},
            conditions=[Condition(expression="n > 1", execute=[Execute(instruction="go", tool="speak")])],
        ),
    )
    loaded = LoadedCard.from_card(card, resolve=resolve)
    assert loaded.path is None
    assert loaded.triggers.evaluate({"n": 2}) == [ToolInstruction("speak", "go")]

    bad = card.model_copy(
        update={
            "metadata": Metadata(id="py", name="Py", personality="p", story="s", sample="x"),
            "events": Events(
                params={"type": "object", "properties": {}},
                conditions=[Condition(expression="n > 1", execute=[Execute(instruction="go", tool="wave")])],
            ),
        }
    )
    with pytest.raises(CardError) as info:
        LoadedCard.from_card(bad, resolve=resolve)
    assert {p.path for p in info.value.problems} == {
        "metadata.id",
        "events.conditions[0].execute[0].tool",
        "events.conditions[0].expression",
    }
    assert all(p.file is None and p.line is None for p in info.value.problems)


# --- each kind of problem --------------------------------------------------------------------------


def test_unknown_key_names_the_allowed_keys_and_a_likely_spelling(tmp_path: Path) -> None:
    found = problems(write(tmp_path, GOOD + "setings:\n  max_turns: 3\n"))
    problem = only(found, "setings")
    assert problem.message == "unknown key 'setings'"
    assert "did you mean 'settings'?" in problem.fix
    assert problem.line == 26


def test_unknown_key_inside_a_nested_section(tmp_path: Path) -> None:
    found = problems(
        write(
            tmp_path,
            edit("    - expression: energy > 3\n", "    - expression: energy > 3\n      when: now\n"),
        )
    )
    problem = only(found, "events.conditions[1].when")
    assert "allowed here: expression, execute" in problem.fix


def test_wrong_id_prefix(tmp_path: Path) -> None:
    problem = only(problems(write(tmp_path, edit("id: companion_tess", "id: tess"))), "metadata.id")
    assert "does not start with 'companion_'" in problem.message
    assert "companion_tess" in problem.fix
    assert problem.line == 2


def test_missing_field(tmp_path: Path) -> None:
    problem = only(problems(write(tmp_path, edit("role: Keep it short.\n", ""))), "role")
    assert problem.message == "missing required field 'role'"
    assert problem.fix == "add `role:` (how the companion behaves in the conversation)"
    assert problem.line is None


def test_missing_metadata_field_explains_what_it_is(tmp_path: Path) -> None:
    text = edit('  sample: "Morning! Tide\'s in."\n', "")
    problem = only(problems(write(tmp_path, text)), "metadata.sample")
    assert "one line the companion might say" in problem.fix


def test_wrong_value_type(tmp_path: Path) -> None:
    problem = only(
        problems(write(tmp_path, edit('actions: [speak, "mytools.gestures:wave_action"]', "actions: speak"))),
        "actions",
    )
    assert "valid list" in problem.message and '"speak"' in problem.message
    assert "- item" in problem.fix


def test_out_of_range_setting(tmp_path: Path) -> None:
    problem = only(problems(write(tmp_path, GOOD + "settings:\n  max_turns: 0\n")), "settings.max_turns")
    assert problem.fix == "use a value at least 1"


def test_tool_not_registered(tmp_path: Path) -> None:
    text = edit("knowledge: [weather]", "knowledge: [weather, almanac]")
    problem = only(problems(write(tmp_path, text)), "knowledge[1]")
    assert problem.message == "tool 'almanac' is not registered: no such tool in the test registry"
    assert "speak" in problem.fix and "package.module:attribute" in problem.fix


def test_unimportable_reference_with_the_real_resolver(tmp_path: Path) -> None:
    text = GOOD.replace('"mytools.gestures:wave_action"', '"no_such_pkg.tools:wave"').replace(
        "knowledge: [weather]", "knowledge: []"
    )
    text = text.replace("        - {tool: weather, instruction: mention the weather}\n", "")
    with pytest.raises(CardError) as info:
        load_card(write(tmp_path, text))
    paths = [p.path for p in info.value.problems]
    assert paths == ["actions[1]"]
    assert "cannot import 'no_such_pkg.tools'" in info.value.problems[0].message


def test_execute_tool_not_listed(tmp_path: Path) -> None:
    text = edit("- {tool: weather, instruction", "- {tool: wether, instruction")
    problem = only(problems(write(tmp_path, text)), "events.conditions[1].execute[1].tool")
    assert problem.message == "tool 'wether' is not listed in actions or knowledge"
    assert "did you mean 'weather'?" in problem.fix


def test_knowledge_listed_as_an_action(tmp_path: Path) -> None:
    text = edit(
        'actions: [speak, "mytools.gestures:wave_action"]',
        'actions: [speak, "mytools.gestures:wave_action", weather]',
    )
    text = text.replace("knowledge: [weather]", "knowledge: []")
    problem = only(problems(write(tmp_path, text)), "actions[2]")
    assert "is a knowledge tool" in problem.message and problem.fix == "move it to knowledge"


def test_two_tools_with_one_id(tmp_path: Path) -> None:
    text = edit(
        'actions: [speak, "mytools.gestures:wave_action"]',
        'actions: [speak, "mytools.gestures:wave_action", "mytools.impostor:speak"]',
    )
    problem = only(problems(write(tmp_path, text)), "actions[2]")
    assert "already uses" in problem.message


def test_params_not_an_object_schema(tmp_path: Path) -> None:
    text = edit("    type: object\n    properties:", "    type: array\n    properties:")
    problem = only(problems(write(tmp_path, text)), "events.params.type")
    assert "must be an object schema" in problem.message
    assert "type: object" in problem.fix


def test_cel_syntax_error_gives_line_column_and_caret(tmp_path: Path) -> None:
    problem = only(
        problems(write(tmp_path, edit("expression: energy > 3", "expression: energy > > 3"))),
        "events.conditions[1].expression",
    )
    assert problem.message == "CEL 1:10: Syntax error: unexpected '>'"
    assert problem.excerpt == "energy > > 3\n         ^"
    rendered = str(problem)
    assert "    energy > > 3\n             ^" in rendered
    assert problem.line == 22


def test_cel_error_in_a_literal_block_points_at_the_file_line(tmp_path: Path) -> None:
    text = edit(
        'expression: emotion == "joy"', 'expression: |\n        emotion == "joy" &&\n          enrgy > 1'
    )
    problem = only(problems(write(tmp_path, text)), "events.conditions[0].expression")
    assert problem.message.startswith("CEL 2:3: undeclared reference to 'enrgy'")
    lines = text.splitlines()
    assert problem.line is not None and "enrgy > 1" in lines[problem.line - 1]
    assert "did you mean 'energy'?" in problem.fix


def test_undeclared_parameter(tmp_path: Path) -> None:
    problem = only(
        problems(write(tmp_path, edit("expression: energy > 3", "expression: mood > 3"))),
        "events.conditions[1].expression",
    )
    assert "undeclared reference to 'mood'" in problem.message
    assert "declared parameter: emotion, energy" in problem.fix


def test_non_boolean_expression(tmp_path: Path) -> None:
    problem = only(
        problems(write(tmp_path, edit("expression: energy > 3", "expression: energy * 2"))),
        "events.conditions[1].expression",
    )
    assert "type int" in problem.message and "bool" in problem.message


def test_yaml_syntax_error_has_a_line_and_caret(tmp_path: Path) -> None:
    text = edit("role: Keep it short.", 'role: "Keep it short.')
    (problem,) = problems(write(tmp_path, text))
    assert problem.message.startswith("YAML syntax error")
    assert problem.line == 8
    assert problem.excerpt.splitlines() == [
        'actions: [speak, "mytools.gestures:wave_action"]',
        " " * 18 + "^",
    ]
    assert "text continues after a closing quote" in problem.fix


def test_tab_indentation_is_explained(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, "metadata:\n\tid: companion_x\n"))
    assert problem.line == 2 and problem.fix == "indent with spaces, not tabs"


def test_unclosed_quote_at_the_end_shows_where_it_began(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, 'metadata:\n  id: companion_x\n  name: "X\n'))
    assert "while scanning a quoted scalar started on line 3" in problem.message
    assert problem.excerpt.splitlines() == ['  name: "X', "        ^"]


def test_yaml_indentation_error(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, "metadata:\n  id: companion_x\n name: X\n"))
    assert problem.message.startswith("YAML syntax error") and problem.line == 3


def test_duplicate_keys_are_reported(tmp_path: Path) -> None:
    found = problems(write(tmp_path, GOOD + "role: Again.\n"))
    assert "duplicate key 'role'" in only(found, "role").message


@pytest.mark.parametrize(("text", "expected"), [("", "empty"), ("- a\n- b\n", "must be a mapping")])
def test_empty_or_non_mapping_file(tmp_path: Path, text: str, expected: str) -> None:
    (problem,) = problems(write(tmp_path, text))
    assert expected in problem.message


def test_missing_file(tmp_path: Path) -> None:
    (problem,) = problems(tmp_path / "nope.yaml")
    assert "cannot read the card" in problem.message and problem.file == str(tmp_path / "nope.yaml")


def test_all_problems_are_collected_and_printed_in_file_order(tmp_path: Path) -> None:
    text = edit("id: companion_tess", "id: tess")
    text = text.replace("expression: energy > 3", "expression: mood > 3")
    text = text.replace("- {tool: weather,", "- {tool: rain,")
    text = text.replace("  name: Tess\n", "  name: Tess\n  mood: sunny\n")
    text += "setings: {}\n"
    path = write(tmp_path, text)
    with pytest.raises(CardError) as info:
        load_card(path, resolve=resolve)
    found = info.value.problems
    assert [p.path for p in found] == [
        "metadata.id",
        "metadata.mood",
        "events.conditions[1].expression",
        "events.conditions[1].execute[1].tool",
        "setings",
    ]
    lines = [p.line or 0 for p in found]
    assert lines == sorted(lines)
    rendered = str(info.value)
    assert rendered.startswith(f"{path}: 5 problems\n")
    for problem in found:
        assert f"{path}:{problem.line}: {problem.path}: {problem.message}" in rendered
        assert f"fix: {problem.fix}" in rendered


# --- routines ----------------------------------------------------------------------------------------

ROUTINES = """\
routines:
  - name: greet
    tool: speak
    on: joined
    when: size(companions) < 10
    input: {emotion: happy}
    args:
      to: "[companion_id]"
      message: '"Welcome aboard, " + companion_name + "!"'
  - tool: weather
    every: 1h
  - tool: "mytools.gestures:wave_action"
    idle: 5m
    input: {how: big}
"""


def test_routines_load_compiled_with_tool_ids(tmp_path: Path) -> None:
    loaded = load_card(write(tmp_path, GOOD + ROUTINES), resolve=resolve)
    greet, weather_routine, wave_routine = loaded.routines
    assert (greet.name, greet.tool, greet.kind, greet.speaks) == ("greet", "speak", "joined", True)
    assert greet.cooldown == 10 and greet.max_fires == 100 and greet.input == {"emotion": "happy"}
    assert (weather_routine.name, weather_routine.kind, weather_routine.interval) == (
        "weather#1",
        "every",
        3600,
    )
    assert not weather_routine.speaks
    assert (wave_routine.tool, wave_routine.kind, wave_routine.interval) == ("wave", "idle", 300)
    assert load_card(write(tmp_path, GOOD, "plain.yaml"), resolve=resolve).routines == ()


def test_routines_in_toml_and_in_python(tmp_path: Path) -> None:
    toml = (
        TOML
        + """\
        [[routines]]
        tool = "speak"
        on = "message"
        when = 'text.contains("tide")'
        input = { emotion = "happy" }
        args = { to = "[sender]", message = '"The tide! " + text' }
        """
    )
    [routine] = load_card(write(tmp_path, toml, "card.toml"), resolve=resolve).routines
    assert routine.kind == "message" and set(routine.args) == {"to", "message"}

    card = load_card(write(tmp_path, GOOD), resolve=resolve).card
    bad = card.model_copy(update={"routines": [Routine(tool="speak", every="soon")]})
    with pytest.raises(CardError) as info:
        LoadedCard.from_card(bad, resolve=resolve)
    assert [(p.path, p.line) for p in info.value.problems] == [
        ("routines[0].every", None),
        ("routines[0]", None),
    ]


def test_a_routine_problem_names_file_line_field_and_fix(tmp_path: Path) -> None:
    text = GOOD + ROUTINES.replace("companion_name +", "companion_nam +").replace(
        "every: 1h", "every: 1 hour"
    )
    text = text.replace("tool: weather\n", "tool: wether\n").replace("{how: big}", "{how: big, size: 3}")
    path = write(tmp_path, text)
    found = problems(path)
    lines = text.splitlines()
    by_path = {p.path: p for p in found}
    assert set(by_path) == {
        "routines[0].args.message",
        "routines[1].tool",
        "routines[1].every",
        "routines[2].input.size",
    }
    args = by_path["routines[0].args.message"]
    assert args.file == str(path) and "message:" in lines[(args.line or 0) - 1]
    assert args.message.startswith("CEL 1:22: undeclared reference to 'companion_nam'")
    assert "did you mean 'companion_name'?" in args.fix and args.excerpt.endswith("^")
    tool = by_path["routines[1].tool"]
    assert "wether" in lines[(tool.line or 0) - 1] and "did you mean 'weather'?" in tool.fix
    every = by_path["routines[1].every"]
    assert every.message == "'1 hour' is not a duration" and "1h30m" in every.fix
    assert "every: 1 hour" in lines[(every.line or 0) - 1]
    size = by_path["routines[2].input.size"]
    assert size.message == "the tool 'wave' has no input field 'size'" and size.fix == "use one of: how"
    rendered = str(CardError(found))
    assert f"{path}:{every.line}: routines[1].every: '1 hour' is not a duration" in rendered


def test_a_routine_without_a_trigger_or_with_two(tmp_path: Path) -> None:
    text = GOOD + "routines:\n  - tool: weather\n  - tool: weather\n    every: 10\n    on: joined\n"
    found = problems(write(tmp_path, text))
    none, two = only(found, "routines[0]"), only(found, "routines[1].on")
    assert none.message == "the routine has no trigger" and none.line == 27
    assert "`on: joined|left|message`" in none.fix
    assert "several triggers (every, on)" in two.message and two.line == 30


def test_a_routine_whose_tool_needs_input_it_does_not_get(tmp_path: Path) -> None:
    text = GOOD + "routines:\n  - tool: speak\n    idle: 60\n    input: {emotion: furious}\n"
    found = problems(write(tmp_path, text))
    missing, emotion = only(found, "routines[0]"), only(found, "routines[0].input.emotion")
    assert missing.message == "the tool 'speak' needs the input fields 'message', 'to'"
    assert "args (a CEL expression)" in missing.fix
    assert "'happy', 'sad', 'angry' or 'neutral'" in emotion.message and emotion.line == 29


def test_a_routine_guard_must_be_a_bool_over_its_own_variables(tmp_path: Path) -> None:
    text = GOOD + "routines:\n  - tool: weather\n    every: 60\n"
    text += "    when: |\n      fired > 2 &&\n        text == 'x'\n"
    problem = only(problems(write(tmp_path, text)), "routines[0].when")
    assert problem.message.startswith("CEL 2:3: undeclared reference to 'text'")
    assert problem.line == 31  # the line inside the | block
    assert "not a variable of a routine fired every" in problem.fix and "idle_seconds" in problem.fix
    text = GOOD + "routines:\n  - tool: weather\n    every: 60\n    when: fired + 1\n"
    assert "must be a bool" in only(problems(write(tmp_path, text)), "routines[0].when").message


def test_a_misspelt_routine_key_is_caught(tmp_path: Path) -> None:
    found = problems(write(tmp_path, GOOD + "routines:\n  - tool: weather\n    evry: 60\n"))
    problem = only(found, "routines[0].evry")
    assert "did you mean 'every'?" in problem.fix and problem.line == 28


def test_the_routine_examples_in_the_docs_load() -> None:
    doc = (CARDS.parent / "docs" / "cards.md").read_text(encoding="utf-8")
    blocks = [b for b in doc.split("```yaml\n")[1:] if b.startswith("  - tool: speak")]
    assert len(blocks) == 1
    pim = (CARDS / "pim.yaml").read_text(encoding="utf-8")
    text = pim.replace("routines:\n", "routines:\n" + blocks[0].split("```")[0])
    path = CARDS.parent / "docs" / "cards.md"
    loaded = LoadedCard.from_card(CompanionCard.model_validate(_yaml_1_2(yaml.safe_load(text))), path=path)
    assert [r.kind for r in loaded.routines] == ["message", "idle", "joined"]


def _yaml_1_2(data: Any) -> Any:
    """PyYAML reads YAML 1.1, where a bare `on` key is true; the card loader reads it as `on`."""
    for routine in data.get("routines", []):
        if True in routine:
            routine["on"] = routine.pop(True)
    return data


# --- the schema for editors ------------------------------------------------------------------------


def test_json_schema_describes_the_card_format() -> None:
    schema = card_json_schema()
    assert schema["title"] == "CompanionCard"
    assert set(schema["required"]) == {"metadata", "role", "actions", "events"}
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Metadata"]["properties"]["id"]["pattern"] == "^companion_"


def test_example_cards_validate_against_the_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")

    schema = card_json_schema()
    for path in sorted(CARDS.glob("*.yaml")):
        jsonschema.validate(_yaml_1_2(yaml.safe_load(path.read_text(encoding="utf-8"))), schema)
    bad: dict[str, Any] = yaml.safe_load((CARDS / "pim.yaml").read_text(encoding="utf-8"))
    bad["metadata"]["id"] = "pim"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# --- appearance --------------------------------------------------------------------------------------

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005ff02fea7a3a3f50000000049454e44ae426082"
)


def test_an_appearance_is_card_level_and_never_in_the_metadata(tmp_path: Path) -> None:
    (tmp_path / "faces").mkdir()
    (tmp_path / "faces" / "tess.png").write_bytes(PNG_1X1)
    text = GOOD + "appearance:\n  image: faces/tess.png\n  color: '#3c6e71'\n"
    loaded = load_card(write(tmp_path, text), resolve=resolve)
    appearance = loaded.card.appearance
    assert appearance is not None and appearance.color == "#3c6e71"
    assert image_path(appearance, tmp_path / "card.yaml") == (tmp_path / "faces" / "tess.png").resolve()
    assert image_type(PNG_1X1) == "image/png"
    # aikyo's metadata stays its five fields
    fields = {"id", "name", "personality", "story", "sample"}
    assert set(loaded.card.metadata.model_dump(by_alias=True)) == fields
    url = GOOD + "appearance: {image: 'https://example.org/tess.webp'}\n"
    remote = load_card(write(tmp_path, url), resolve=resolve).card.appearance
    assert remote is not None and remote.image_url() == "https://example.org/tess.webp"


@pytest.mark.parametrize(
    ("appearance", "files", "field", "words"),
    [
        ("{color: teal}", {}, "appearance.color", "#rrggbb"),
        ("{image: tess.png}", {}, "appearance.image", "cannot read"),
        ("{image: ../tess.png}", {}, "appearance.image", "outside the card's folder"),
        ("{image: tess.svg}", {"tess.svg": b"<svg onload='alert(1)'/>"}, "appearance.image", "not a PNG"),
        ("{image: 'ftp://x/tess.png'}", {}, "appearance.image", "not an https:// URL"),
        ("{image: tess.png}", {"tess.png": PNG_1X1 + bytes(1024 * 1024)}, "appearance.image", "bytes"),
        ("{colour: '#ffffff'}", {}, "appearance.colour", "unknown key"),
    ],
)
def test_a_bad_appearance_names_the_field_and_the_fix(
    tmp_path: Path, appearance: str, files: dict[str, bytes], field: str, words: str
) -> None:
    card_dir = tmp_path / "cards"
    card_dir.mkdir()
    for name, data in files.items():
        (card_dir / name).write_bytes(data)
    found = only(problems(write(card_dir, GOOD + f"appearance: {appearance}\n")), field)
    assert words in f"{found.message} {found.fix}", str(found)
    assert found.fix and found.line is not None
