"""Structured output for real models: the schemas they fill and the checks on what comes back.

Pure functions. A check returns either the typed value or :class:`Problems` written for the
model, so the caller can send them back once for a corrected answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import CLOSING_ORDER, ClosingStage
from .base import StateDecision, StatesRequest, ToolSpec

__all__ = [
    "PARAMS_TOOL",
    "STATES_TOOL",
    "Problems",
    "check_params",
    "check_states",
    "params_schema_problems",
    "parse_json_object",
    "states_schema",
    "wire_tool_names",
]

STATES_TOOL = "set_states"
PARAMS_TOOL = "set_params"


@dataclass(frozen=True, slots=True)
class Problems:
    """Why a model's structured answer was refused, one line per problem (sent back to it)."""

    items: tuple[str, ...]

    def __str__(self) -> str:
        return "; ".join(self.items)


def states_schema(companion_ids: Sequence[str]) -> dict[str, Any]:
    """The ``set_states`` tool's input: one entry per addressed companion."""
    return {
        "type": "object",
        "properties": {
            "states": {
                "type": "array",
                "description": "One entry per companion, in the order listed.",
                "items": {
                    "type": "object",
                    "properties": {
                        "companion_id": {"type": "string", "enum": list(companion_ids)},
                        "state": {"type": "string", "enum": ["speak", "listen"]},
                        "importance": {"type": "number", "minimum": 0, "maximum": 10},
                        "selected": {"type": "boolean"},
                        "closing": {"type": "string", "enum": list(CLOSING_ORDER)},
                    },
                    "required": ["companion_id", "state", "importance", "selected", "closing"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["states"],
        "additionalProperties": False,
    }


class _StateItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    companion_id: str
    state: Literal["speak", "listen"]
    importance: float = Field(ge=0, le=10, allow_inf_nan=False)
    selected: bool
    closing: ClosingStage = "none"


class _StatesOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    states: list[_StateItem]


def _describe(error: ValidationError) -> Problems:
    return Problems(
        tuple(
            f"{'.'.join(str(p) for p in item['loc']) or '(root)'}: {item['msg']}"
            for item in error.errors(include_url=False)
        )
    )


def check_states(raw: Mapping[str, Any], request: StatesRequest) -> list[StateDecision] | Problems:
    """The decisions in the order of ``request.companions``, or the problems with ``raw``.

    The request's hard rules are applied, not argued about: the closing stage never falls below
    ``closing_floor`` and a nominated companion is always ``selected``.
    """
    try:
        parsed = _StatesOutput.model_validate(raw)
    except ValidationError as exc:
        return _describe(exc)
    expected = [c.id for c in request.companions]
    problems: list[str] = []
    by_id: dict[str, _StateItem] = {}
    for item in parsed.states:
        if item.companion_id not in expected:
            problems.append(f"states: {item.companion_id!r} is not one of the companions {expected}")
        elif item.companion_id in by_id:
            problems.append(f"states: {item.companion_id!r} appears more than once")
        else:
            by_id[item.companion_id] = item
    missing = [cid for cid in expected if cid not in by_id]
    if missing:
        problems.append(f"states: no entry for {missing}")
    if problems:
        return Problems(tuple(problems))
    floor = CLOSING_ORDER.index(request.closing_floor)
    decisions = []
    for cid in expected:
        item = by_id[cid]
        decisions.append(
            StateDecision(
                companion_id=cid,
                state=item.state,
                importance=float(item.importance),
                selected=item.selected or cid == request.nominated,
                closing=CLOSING_ORDER[max(floor, CLOSING_ORDER.index(item.closing))],
            )
        )
    return decisions


def params_schema_problems(schema: Mapping[str, Any]) -> Problems | None:
    """Why a card's ``events.params`` cannot serve as a tool's input schema, or ``None``."""
    if schema.get("type") != "object":
        return Problems(("events.params must be a JSON Schema with type 'object'",))
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        return Problems((f"events.params is not valid JSON Schema: {exc.message}",))
    return None


def check_params(raw: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any] | Problems:
    """``raw`` as a plain dict if it satisfies the card's params ``schema``, else every problem."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(dict(raw)), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        return Problems(
            tuple(f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors)
        )
    return dict(raw)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """A JSON object a model wrote as plain text (optionally in a code fence), else ``None``.

    Some local models answer with the JSON instead of calling the output tool.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_WIRE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def wire_tool_names(tools: Iterable[ToolSpec]) -> dict[str, ToolSpec]:
    """Tool specs by a name every provider accepts (``^[A-Za-z0-9_-]{1,64}$``), unique, stable."""
    out: dict[str, ToolSpec] = {}
    for spec in tools:
        base = _WIRE_NAME.sub("_", spec.id)[:60] or "tool"
        name, n = base, 2
        while name in out:
            name, n = f"{base[:57]}_{n}", n + 1
        out[name] = spec
    return out
