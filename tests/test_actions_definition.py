"""Declaring tools, validating their input, and the shape of results."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from companion.actions import (
    ActionContext,
    ActionDef,
    ErrorCode,
    InputIssue,
    KnowledgeDef,
    ToolResult,
    ToolStatus,
    action,
    knowledge,
    validate_input,
)
from companion.protocol import Action


class Point(BaseModel):
    x: int
    y: int


class Move(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="where to go")
    path: list[Point] = []
    speed: float = Field(1.0, gt=0)


@action(id="move", description="Move the avatar.", input=Move)
def move(ctx: ActionContext[Move]) -> Action:
    return Action.create(ctx.companion_id, "move", {"target": ctx.input.target})


def test_action_defaults() -> None:
    assert isinstance(move, ActionDef)
    assert move.kind == "action"
    assert move.topic == "actions"
    assert move.timeout == 60.0
    assert move.side_effects == "write"
    assert move.requires_approval is False
    assert move.cap == 600.0


def test_input_schema_is_generated_and_a_fresh_copy() -> None:
    schema = move.input_schema()
    assert schema["type"] == "object"
    assert schema["required"] == ["target"]
    assert schema["properties"]["target"]["description"] == "where to go"
    schema["properties"].clear()
    assert "target" in move.input_schema()["properties"]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"id": "has space"}, ValueError, "must start with a letter"),
        ({"id": "9lives"}, ValueError, "must start with a letter"),
        ({"description": "  "}, ValueError, "needs a description"),
        ({"input_model": dict}, TypeError, "pydantic BaseModel"),
        ({"timeout": 0}, ValueError, "timeout"),
        ({"timeout": float("inf")}, ValueError, "timeout"),
        ({"topic": "states"}, ValueError, "topic"),
        ({"side_effects": "maybe"}, ValueError, "side_effects"),
        ({"max_duration": 1.0, "timeout": 5.0}, ValueError, "max_duration"),
    ],
)
def test_bad_definitions_are_refused(kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    fields: dict[str, Any] = {
        "id": "ok",
        "description": "does things",
        "topic": "actions",
        "input_model": Move,
        "publish": move.publish,
    }
    fields.update(kwargs)
    with pytest.raises(error, match=words):
        ActionDef(**fields)


class Weather(BaseModel):
    city: str


class Report(BaseModel):
    celsius: float
    sky: str


@knowledge(id="weather", description="The weather in a city.", input=Weather, output=Report)
def weather(ctx: ActionContext[Weather]) -> dict[str, Any]:
    return {"celsius": 21, "sky": "clear"}


def test_knowledge_definition_and_output_check() -> None:
    assert isinstance(weather, KnowledgeDef)
    assert weather.kind == "knowledge"
    assert weather.side_effects == "read-only"
    assert weather.output_json({"celsius": 21, "sky": "clear"}) == {"celsius": 21.0, "sky": "clear"}
    with pytest.raises(ValidationError):
        weather.output_json({"celsius": "warm"})


def test_knowledge_with_an_unusable_output_type_is_refused() -> None:
    with pytest.raises(TypeError, match="not a usable type"):
        KnowledgeDef(id="k", description="d", input_model=Weather, output=object(), fetch=lambda ctx: None)


def test_validate_input_reports_every_issue_with_its_path() -> None:
    issues = validate_input(Move, {"path": [{"x": 1, "y": 2}, {"x": "far"}], "speed": -1})
    assert isinstance(issues, tuple)
    paths = {issue.path for issue in issues}
    assert paths == {"target", "path.1.x", "path.1.y", "speed"}


def test_validate_input_drops_unknown_keys_even_when_the_model_forbids_them() -> None:
    value = validate_input(Move, {"target": "door", "colour": "red"})
    assert isinstance(value, Move)
    assert value.target == "door"


def test_validate_input_refuses_a_non_object() -> None:
    issues = validate_input(Move, ["door"])
    assert issues == (InputIssue((), "expected a JSON object, got list"),)
    assert issues[0].path == "(root)"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("invalid_input", -32004),
        ("refused", -32005),
        ("timeout", -32002),
        ("cancelled", -32001),
        ("not_found", -32003),
        ("call_cycle", -32006),
        ("call_too_deep", -32007),
        ("store_limit", -32008),
        ("internal_error", -32603),
    ],
)
def test_failure_codes_are_stable(status: ToolStatus, code: int) -> None:
    result = ToolResult("t", "c", status, "why")
    assert result.code == ErrorCode(code)
    assert not result.ok
    assert result.for_model() == {"status": status, "code": code, "message": "why"}


def test_success_for_model_and_issues() -> None:
    ok = ToolResult("t", "c", "ok", output={"a": 1})
    assert ok.ok and ok.code is None
    assert ok.for_model() == {"status": "ok", "output": {"a": 1}}
    bad = ToolResult("t", "c", "invalid_input", "bad", issues=(InputIssue(("to", 0), "not a string"),))
    assert bad.for_model()["issues"] == [{"path": "to.0", "message": "not a string"}]
