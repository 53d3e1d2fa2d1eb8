"""CEL triggers: declaration from the params schema, load-time checks, evaluation rules."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from companion.card.triggers import (
    CompiledTriggers,
    ParamType,
    ToolInstruction,
    TriggerCondition,
    TriggerError,
    TriggerProblem,
    compile_triggers,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "emotion": {"type": "string", "enum": ["joy", "gloom", "calm"]},
        "energy": {"type": "integer", "minimum": 0, "maximum": 10},
        "score": {"type": "number"},
        "wants_to_end": {"type": "boolean"},
        "topics": {"type": "array", "items": {"type": "string"}},
        "counts": {"type": "array", "items": {"type": "integer"}},
        "speaker": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "address": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        "note": {"type": ["string", "null"]},
    },
    "required": ["emotion", "energy"],
}

VALUES: dict[str, Any] = {
    "emotion": "joy",
    "energy": 7,
    "score": 0.75,
    "wants_to_end": False,
    "topics": ["rain", "Trains in Japan"],
    "counts": [1, 2, 3],
    "speaker": {"name": "user_kai", "age": 31, "address": {"city": "Osaka"}},
}


def cond(expression: str, *pairs: tuple[str, str]) -> TriggerCondition:
    return TriggerCondition(expression, tuple(ToolInstruction(tool, text) for tool, text in pairs))


def compile_one(expression: str, schema: dict[str, Any] | None = None) -> CompiledTriggers:
    return compile_triggers(schema or SCHEMA, [cond(expression, ("speak", "x"))])


def matches(expression: str, values: dict[str, Any] | None = None) -> bool:
    outcome = compile_one(expression).explain(VALUES if values is None else values)[0]
    assert outcome.error is None, outcome.error
    return outcome.matched


def problems_of(schema: dict[str, Any], expressions: Sequence[str]) -> list[TriggerProblem]:
    with pytest.raises(TriggerError) as info:
        compile_triggers(schema, [cond(e, ("speak", "x")) for e in expressions])
    return info.value.problems


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [
            r.companion_fields  # type: ignore[attr-defined]
            for r in self.records
            if getattr(r, "companion_event", None) == name
        ]


@pytest.fixture
def logs() -> Iterator[Records]:
    handler = Records()
    log = logging.getLogger("companion.card.triggers")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


# --- declaration -------------------------------------------------------------------------------


def test_each_property_becomes_a_typed_variable() -> None:
    triggers = compile_triggers(SCHEMA, [])
    kinds = {name: t.kind for name, t in triggers.variables.items()}
    assert kinds == {
        "emotion": "string",
        "energy": "integer",
        "score": "number",
        "wants_to_end": "boolean",
        "topics": "array",
        "counts": "array",
        "speaker": "object",
        "note": "string",
    }
    assert triggers.variables["counts"].items == ParamType("integer")


@pytest.mark.parametrize(
    "expression",
    [
        'emotion == "joy"',
        "energy >= 7",
        "score > 0.5",
        "!wants_to_end",
        '"rain" in topics',
        "counts.all(c, c > 0)",
        'speaker.name.startsWith("user_")',
        'note == "" || true',
    ],
)
def test_expressions_over_each_declared_type_compile_and_match(expression: str) -> None:
    assert matches(expression)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('emotion in ["joy", "calm"]', True),
        ('emotion in ["gloom"]', False),
        ('topics.exists(t, t.contains("Japan"))', True),
        ('topics.exists(t, t.startsWith("snow"))', False),
        ("has(speaker.age) && speaker.age > 30", True),
        ("has(speaker.nickname)", False),
        ("has(params.score)", True),
        ("has(params.note)", False),
        ("size(topics) == 2 && size(emotion) == 3", True),
        ('speaker.name.matches("^user_[a-z]+$")', True),
        ('topics[1].lowerAscii().contains("trains")', True),
        ('speaker.address.city == "Osaka"', True),
        ('"city" in speaker.address', True),
        ("energy > 5 ? score > 0.5 : false", True),
    ],
)
def test_cel_language_features(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_a_property_named_params_wins_over_the_whole_object() -> None:
    schema = {"type": "object", "properties": {"params": {"type": "integer"}}}
    triggers = compile_one("params > 1", schema)
    assert triggers.evaluate({"params": 2}) == [ToolInstruction("speak", "x")]


# --- evaluation order and merging ---------------------------------------------------------------


def test_every_match_contributes_in_card_order_and_the_first_instruction_per_tool_wins() -> None:
    triggers = compile_triggers(
        SCHEMA,
        [
            cond("energy > 100", ("speak", "never")),
            cond('emotion == "joy"', ("speak", "bubbly"), ("wave", "big wave")),
            cond("true", ("speak", "plain"), ("companions", "look around")),
            cond("wants_to_end", ("speak", "goodbye")),
        ],
    )
    assert triggers.evaluate(VALUES) == [
        ToolInstruction("speak", "bubbly"),
        ToolInstruction("wave", "big wave"),
        ToolInstruction("companions", "look around"),
    ]
    assert [o.matched for o in triggers.explain(VALUES)] == [False, True, True, False]


def test_no_match_gives_no_instructions() -> None:
    triggers = compile_triggers(SCHEMA, [cond("wants_to_end", ("speak", "bye"))])
    assert triggers.evaluate(VALUES) == []


# --- runtime errors are never true ---------------------------------------------------------------


def test_runtime_error_is_skipped_and_logged_with_its_expression(logs: Records) -> None:
    triggers = compile_triggers(
        SCHEMA,
        [cond("10 / (energy - 7) > 0", ("speak", "divided")), cond("true", ("speak", "fallback"))],
    )
    assert triggers.evaluate(VALUES) == [ToolInstruction("speak", "fallback")]
    (event,) = logs.events("trigger_condition_error")
    assert event["expression"] == "10 / (energy - 7) > 0"
    assert event["index"] == 0
    assert "divide by zero" in event["error"]


def test_error_inside_a_negation_is_not_true(logs: Records) -> None:
    triggers = compile_one('!(speaker.nickname == "x")')
    outcome = triggers.explain(VALUES)[0]
    assert not outcome.matched
    assert outcome.error is not None


def test_a_missing_parameter_makes_its_conditions_errors() -> None:
    triggers = compile_triggers(SCHEMA, [cond("score > 0.1", ("speak", "a")), cond("true", ("wave", "b"))])
    values = {k: v for k, v in VALUES.items() if k != "score"}
    outcomes = triggers.explain(values)
    assert outcomes[0].error is not None and not outcomes[0].matched
    assert triggers.evaluate(values) == [ToolInstruction("wave", "b")]


def test_null_means_absent() -> None:
    assert compile_one("has(params.note)").evaluate({**VALUES, "note": None}) == []
    assert compile_one("has(params.note)").evaluate({**VALUES, "note": "hi"}) == [
        ToolInstruction("speak", "x")
    ]
    outcome = compile_one('note == "x"').explain({**VALUES, "note": None})[0]
    assert outcome.error is not None and not outcome.matched


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("energy", True),
        ("energy", "7"),
        ("energy", 7.5),
        ("score", False),
        ("emotion", 3),
        ("topics", "rain"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_left_unbound(logs: Records, name: str, value: Any) -> None:
    expression = {
        "energy": "energy >= 0",
        "score": "score >= 0.0",
        "emotion": 'emotion != ""',
        "topics": "size(topics) >= 0",
    }[name]
    outcome = compile_one(expression).explain({**VALUES, name: value})[0]
    assert not outcome.matched and outcome.error is not None
    assert logs.events("trigger_param_type_mismatch")[0]["param"] == name
    assert name not in compile_one("true").bind({**VALUES, name: value})["params"]


def test_params_keeps_keys_the_schema_does_not_declare() -> None:
    assert matches('params.extra == "yes" && params.energy == 7', {**VALUES, "extra": "yes"})


def test_a_wrongly_typed_list_element_is_an_error_not_a_match() -> None:
    outcome = compile_one("counts.exists(c, c > 1)").explain({**VALUES, "counts": [1, "2"]})[0]
    assert not outcome.matched and outcome.error is not None


@pytest.mark.parametrize(
    ("expression", "values"),
    [
        ("energy > 0", {**VALUES, "energy": 2**80}),
        ("has(speaker.x)", {**VALUES, "speaker": {"x": object()}}),
        ("size(params) > 0", {**VALUES, "extra": {1, 2}}),
    ],
)
def test_values_cel_cannot_hold_are_errors_not_matches(expression: str, values: dict[str, Any]) -> None:
    outcome = compile_one(expression).explain(values)[0]
    assert not outcome.matched and outcome.error is not None


def test_dyn_result_that_is_not_a_bool_is_an_error() -> None:
    triggers = compile_one("params.energy")
    outcome = triggers.explain(VALUES)[0]
    assert not outcome.matched
    assert outcome.error is not None and "not a bool" in outcome.error
    assert triggers.evaluate({**VALUES, "energy": 3}) == []


# --- numbers -------------------------------------------------------------------------------------


def test_integer_given_as_float_is_normalised() -> None:
    triggers = compile_one("energy == 7 && energy / 2 == 3")
    assert triggers.bind({**VALUES, "energy": 7.0})["energy"] == 7
    assert isinstance(triggers.bind({**VALUES, "energy": 7.0})["energy"], int)
    assert triggers.evaluate({**VALUES, "energy": 7.0}) == [ToolInstruction("speak", "x")]


def test_int_given_for_a_number_becomes_a_double() -> None:
    triggers = compile_one("score == 2.0 && score / 4.0 == 0.5")
    bound = triggers.bind({**VALUES, "score": 2})
    assert bound["score"] == 2.0 and isinstance(bound["score"], float)
    assert triggers.evaluate({**VALUES, "score": 2}) == [ToolInstruction("speak", "x")]


def test_nested_numbers_are_normalised_following_the_schema() -> None:
    triggers = compile_one("counts.exists(c, c == 2) && speaker.age == 31")
    bound = triggers.bind({**VALUES, "counts": [1.0, 2.0], "speaker": {"age": 31.0}})
    assert bound["counts"] == [1, 2] and all(type(c) is int for c in bound["counts"])
    assert type(bound["speaker"]["age"]) is int
    assert type(bound["params"]["counts"][0]) is int
    assert triggers.evaluate({**VALUES, "counts": [1.0, 2.0], "speaker": {"age": 31.0}})


def test_untyped_nested_values_compare_across_int_and_double_as_the_spec_says() -> None:
    assert matches("speaker.age > 30.5")
    assert matches("speaker.age == 31.0")
    assert matches("params.score < 1")


def test_mixing_int_and_double_on_declared_types_is_a_load_error_with_a_hint() -> None:
    (problem,) = problems_of(SCHEMA, ["score > 5"])
    assert problem.message == "CEL 1:7: '>' cannot be applied to (double, int)"
    assert "7.0" in problem.fix and "double(x)" in problem.fix


# --- load-time checks ----------------------------------------------------------------------------


def test_syntax_error_reports_line_column_and_caret() -> None:
    (problem,) = problems_of(SCHEMA, ['emotion == "joy" &&'])
    assert problem.path == ("conditions", 0, "expression")
    assert (problem.line, problem.column) == (1, 20)
    assert problem.message.startswith("CEL 1:20: Syntax error")
    assert problem.excerpt == 'emotion == "joy" &&\n                   ^'


def test_syntax_error_on_a_later_line_of_a_multiline_expression() -> None:
    problems = problems_of(SCHEMA, ['emotion == "joy" &&\n  (energy > 3 ||'])
    assert problems[0].line == 2
    assert problems[0].excerpt.splitlines()[0] == "  (energy > 3 ||"


def test_undeclared_parameter_is_named_with_a_suggestion() -> None:
    (problem,) = problems_of(SCHEMA, ["energie > 3"])
    assert "undeclared reference to 'energie'" in problem.message
    assert "did you mean 'energy'?" in problem.fix
    assert "events.params.properties" in problem.fix
    assert problem.excerpt == "energie > 3\n^"


def test_non_boolean_expression_is_refused() -> None:
    (problem,) = problems_of(SCHEMA, ["energy + 1"])
    assert "type int" in problem.message and "must be a bool" in problem.message


def test_empty_expression_is_refused() -> None:
    (problem,) = problems_of(SCHEMA, ["  "])
    assert "empty" in problem.message and problem.fix == "write a CEL condition, e.g. `true`"


def test_all_problems_are_collected() -> None:
    problems = problems_of(SCHEMA, ["mood == 1", "true", "energy +", '"x"', "a && b"])
    assert [p.path[1] for p in problems] == [0, 2, 3, 4, 4]


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "array", "items": {"type": "string"}}, ("params", "type")),
        ({"properties": {"x": {"type": "string"}}}, ("params", "type")),
        ({"type": "object", "properties": ["x"]}, ("params", "properties")),
        ({"type": "object", "properties": {"in": {"type": "string"}}}, ("params", "properties", "in")),
        (
            {"type": "object", "properties": {"my-mood": {"type": "string"}}},
            ("params", "properties", "my-mood"),
        ),
        ({"type": "object", "properties": {"x": {"type": "int"}}}, ("params", "properties", "x", "type")),
        ({"type": "object", "properties": {"x": "string"}}, ("params", "properties", "x")),
        ({"type": "object", "properties": {}, "required": ["x"]}, ("params", "required", 0)),
    ],
)
def test_bad_params_schemas_are_refused_with_their_path(
    schema: dict[str, Any], path: tuple[Any, ...]
) -> None:
    problems = problems_of(schema, [])
    assert path in [p.path for p in problems]
    assert all(p.fix for p in problems)


def test_schema_without_type_but_with_string_enum_is_a_string() -> None:
    schema = {"type": "object", "properties": {"mood": {"enum": ["a", "b"]}}}
    assert compile_triggers(schema, []).variables["mood"] == ParamType("string")


@pytest.mark.parametrize(
    "expression",
    [
        "true",
        'size("abc") > 1 && "tea".contains("e")',
        "[1, 2].exists(x, x > 1)",
        "[1].exists(energy, energy > 0)",  # the comprehension's own variable, not the parameter
        "math.greatest(1, 2) == 2",
    ],
)
def test_a_condition_that_reads_no_parameter_is_known(expression: str) -> None:
    triggers = compile_one(expression)
    assert not triggers.reads_params and triggers.reading == ()


@pytest.mark.parametrize(
    "expression",
    [
        'emotion == "joy"',
        "has(params.score)",
        'params.emotion == "joy"',
        'topics.exists(t, t.contains("rain"))',
        "speaker.age > 30",
        "true || energy > 3",  # read even where it cannot change the outcome: no guessing
    ],
)
def test_a_condition_that_reads_a_parameter_is_known(expression: str) -> None:
    triggers = compile_one(expression)
    assert triggers.reads_params and triggers.reading == (expression,)


def test_only_the_conditions_that_read_parameters_are_listed() -> None:
    triggers = compile_triggers(
        SCHEMA, [cond("wants_to_end", ("speak", "bye")), cond("true", ("speak", "hi")), cond("1 < 2")]
    )
    assert triggers.reading == ("wants_to_end",)
    assert not compile_triggers(SCHEMA, []).reads_params  # no conditions: nothing to choose


def test_conditions_that_read_no_parameter_choose_the_same_whatever_the_values() -> None:
    triggers = compile_triggers(
        SCHEMA, [cond("1 > 2", ("speak", "never")), cond('"a" < "b"', ("speak", "always"))]
    )
    assert not triggers.reads_params
    chosen = [triggers.evaluate(values) for values in ({}, VALUES, {"emotion": "gloom", "energy": 0})]
    assert chosen == [[ToolInstruction("speak", "always")]] * 3
