"""Structured output for real models: the schemas they fill and the checks on what comes back.

Pure functions. A check returns either the typed value or :class:`Problems` written for the
model, so the caller can send them back once for a corrected answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from companion.card.paramfit import fit_params
from companion.conversation.rules.closing import proposal_ceiling
from companion.lines.directions import SPEAKER_LABEL, own_label
from companion.lines.fields import MESSAGE_FIELDS
from companion.models.base import StateDecision, StatesRequest, ToolSpec
from companion.protocol import CLOSING_ORDER, ClosingStage

__all__ = [
    "PARAMS_TOOL",
    "STATES_TOOL",
    "Problems",
    "check_params",
    "check_states",
    "params_schema_problems",
    "parse_json_object",
    "parse_text_tool_calls",
    "speech_args",
    "spoken_text",
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
    """The ``set_states`` tool's input, as short as a leader's decision can be written: one
    number per addressed companion, in the order listed (0: it listens; 1 to 10: it wants to
    speak, and how much that matters now), and, only when they apply, the companions the last
    message asks to answer and a closing stage. ``{"speak": [7, 0]}`` is a whole answer; the
    former one entry per companion (id, state, importance, selected, closing) took about 33
    tokens for one companion and 12 tokens more for each next. Our states on the wire keep
    aikyo's shape: :func:`check_states` turns this into one :class:`StateDecision` each."""
    count = len(companion_ids)
    return {
        "type": "object",
        "properties": {
            "speak": {
                "type": "array",
                "description": "One number per companion, in the order listed: 0 = it listens; "
                "1 to 10 = it wants to speak, higher when its words matter more now.",
                # Exact length and integer values: servers that turn the schema into a grammar
                # (llama.cpp, llama-cpp-python, Ollama) then enforce them for small models.
                "minItems": count,
                "maxItems": count,
                "items": {"type": "integer", "enum": list(range(11))},
            },
            "selected": {
                "type": "array",
                "description": "Only companions the last message explicitly asks to answer.",
                "maxItems": count,
                "items": {"type": "string", "enum": list(companion_ids)},
            },
            "closing": {
                "type": "string",
                "description": "Only when the conversation nears its end.",
                "enum": list(CLOSING_ORDER),
            },
        },
        "required": ["speak"],
        "additionalProperties": False,
    }


class _StatesOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speak: list[Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]]
    selected: list[str] = []
    closing: ClosingStage = "none"


def _describe(error: ValidationError) -> Problems:
    return Problems(
        tuple(
            f"{'.'.join(str(p) for p in item['loc']) or '(root)'}: {item['msg']}"
            for item in error.errors(include_url=False)
        )
    )


def check_states(raw: Mapping[str, Any], request: StatesRequest) -> list[StateDecision] | Problems:
    """The decisions in the order of ``request.companions``, or the problems with ``raw``
    (:func:`states_schema`'s answer: a companion whose number is above 0 wants to ``speak``
    with that importance, one at 0 listens).

    The request's hard rules are applied, not argued about: the closing stage never falls below
    ``closing_floor`` and a model may only begin closing, never move it on
    (:func:`~companion.conversation.rules.closing.proposal_ceiling`: a conversation passes through
    ``pre-closing`` and ``closing`` before ``terminal``, however eager the model), and a nominated
    companion is always ``selected``. A partial answer is used, not refused: numbers past the
    last companion are dropped, a companion without a number listens, an unknown id in
    ``selected`` is dropped (a small model often gets one of these wrong; asking again costs a
    whole request). Only an answer with no number at all, or a malformed one, is refused.

    While the conversation is open, somebody speaks: when every number is 0 (SmolLM2-135M rated
    every companion 0, and the conversation fell silent for good), the first companion speaks.
    """
    try:
        parsed = _StatesOutput.model_validate(raw)
    except ValidationError as exc:
        return _describe(exc)
    expected = [c.id for c in request.companions]
    if not parsed.speak:
        return Problems((f"speak: no number for any of the companions {expected}",))
    floor = CLOSING_ORDER.index(request.closing_floor)
    ceiling = CLOSING_ORDER.index(proposal_ceiling(request.closing_floor))
    stage = CLOSING_ORDER[max(floor, min(CLOSING_ORDER.index(parsed.closing), ceiling))]
    selected = set(parsed.selected)
    decisions = []
    for index, cid in enumerate(expected):
        importance = parsed.speak[index] if index < len(parsed.speak) else 0.0
        decisions.append(
            StateDecision(
                companion_id=cid,
                state="speak" if importance > 0 else "listen",
                importance=float(importance),
                selected=cid in selected or cid == request.nominated,
                closing=stage,
            )
        )
    if not any(d.state == "speak" or d.selected for d in decisions):
        keen = max(range(len(decisions)), key=lambda i: (decisions[i].importance, -i))
        decisions[keen] = replace(decisions[keen], state="speak")
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
    """``raw`` as a plain dict if it satisfies the card's params ``schema`` once fitted
    (:func:`~companion.card.paramfit.fit_params`: a number out of bounds is clamped, not argued
    about), else every problem. ``raw`` comes back unfitted: the speaker fits it and logs what
    changed."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    fitted = fit_params(raw, schema).values
    errors = sorted(validator.iter_errors(fitted), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        return Problems(
            tuple(f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors)
        )
    return dict(raw)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_SCAN_LIMIT = 20_000
"""Characters of a model's text searched for JSON (a runaway answer must not cost seconds)."""


def _json_values(text: str) -> Iterable[Any]:
    """Every JSON object or array embedded in ``text``, in order, outermost first."""
    decoder = json.JSONDecoder()
    text = text[:_SCAN_LIMIT]
    index = 0
    while True:
        starts = [i for i in (text.find("{", index), text.find("[", index)) if i >= 0]
        if not starts:
            return
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        yield value
        index = end


def parse_json_object(text: str) -> dict[str, Any] | None:
    """A JSON object a model wrote as text (bare, in a code fence, or inside prose), else ``None``.

    Some local models answer with the JSON instead of calling the output tool, or wrap it in a
    sentence; the first object found is the answer.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    for value in _json_values(text):
        if isinstance(value, dict):
            return value
    return None


_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FUNCTIONS_PREFIX = re.compile(r"functions\.([A-Za-z0-9_-]+):\s*")


def parse_text_tool_calls(text: str, names: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls a model wrote as text instead of as tool calls, for tools in ``names`` only.

    Recognised: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen,
    SmolLM), a bare ``{"name": ..., "arguments"|"parameters": {...}}`` or a list of them, and
    ``functions.NAME: {...}`` (chatml-function-calling). Anything else is not a call.
    """
    known = set(names)
    calls: list[tuple[str, dict[str, Any]]] = []

    def add(value: Any) -> None:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in known:
                continue
            args = item.get("arguments", item.get("parameters", {}))
            if isinstance(args, str):
                args = parse_json_object(args)
            if isinstance(args, dict):
                calls.append((item["name"], args))

    text = text[:_SCAN_LIMIT]
    tagged = _TOOL_CALL_TAG.findall(text)
    for block in tagged:
        for value in _json_values(block):
            add(value)
            break
    if calls or tagged:
        return calls
    prefixed = list(_FUNCTIONS_PREFIX.finditer(text))
    for match in prefixed:
        if match.group(1) in known:
            value = next(iter(_json_values(text[match.end() :])), None)
            if isinstance(value, dict):
                calls.append((match.group(1), value))
    if prefixed:
        return calls
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    if stripped[:1] in ("{", "["):
        add(next(iter(_json_values(stripped)), None))
    return calls


_NEUTRAL = ("neutral", "calm", "normal", "none")


_LINE_LIMIT = 400
_HISTORY = re.compile(r"^\s*\d+\.(?:\s|$)")
"""A line in (or cut from) the prompt's numbered history (``3. Aya (companion_aya) -> Ben: ...``)."""
_TURN_ECHO = re.compile(r"(?:\byour turn\b.*\(|\bAddress:\s)", re.IGNORECASE)
"""The prompt's turn line, as small models echo it ("Your turn (Juniper). Address: ...")."""
_HEADING = re.compile(r"^[\w ()'-]{0,40}:$")
"""A heading and nothing after it, as SmolLM2-135M wrote ("Conversation:") before other lines."""


def spoken_text(text: str, speaker_names: Iterable[str] = (), prompt: str = "") -> str:
    """A plain-text answer as a line to say: its first paragraph that is not an echo of the
    ``prompt``, without a ``Name:`` label of the speaker's or wrapping quotes, at most
    :data:`_LINE_LIMIT` characters (cut after a sentence when it can be). Small models repeat
    lines of their prompt and go on writing the others' lines after their own."""
    echoed = {
        " ".join(line.split()) for line in prompt.splitlines() if line.strip() and not _HISTORY.match(line)
    }
    speaker_names = tuple(speaker_names)  # read for every paragraph
    line = ""
    for part in text.strip().split("\n"):
        candidate = part.strip()
        label = SPEAKER_LABEL.match(candidate)
        if label and own_label(label.group(1), speaker_names):
            candidate = candidate[label.end() :].strip()
        if len(candidate) >= 2 and candidate[0] == candidate[-1] and candidate[0] in "\"'":
            candidate = candidate[1:-1].strip()
        flat = " ".join(candidate.split())
        if _HISTORY.match(candidate) or _TURN_ECHO.search(candidate) or _HEADING.match(candidate):
            continue
        if candidate and not any(flat in seen or seen in flat for seen in echoed if len(seen) > 12):
            line = candidate
            break
    if len(line) > _LINE_LIMIT:
        cut = max(line.rfind(mark, 0, _LINE_LIMIT) for mark in (". ", "! ", "? "))
        line = line[: cut + 1] if cut > 0 else line[: _LINE_LIMIT - 1].rstrip() + "…"
    return line


def speech_args(spec: ToolSpec, line: str, recipients: Sequence[str]) -> dict[str, Any] | None:
    """Input for the speaking action ``spec`` that says ``line`` to ``recipients``, or ``None``
    when ``spec`` takes no message text (so it cannot carry a plain-text answer).

    The message goes into the ``message`` (or ``text``, ``content``) string property; a
    ``to``-like array of strings gets ``recipients``; other required properties get a neutral
    value the schema accepts (``neutral`` from an enum, else its first value).
    """
    props = spec.input_schema.get("properties")
    if not isinstance(props, Mapping):
        return None
    field = next(
        (f for f in MESSAGE_FIELDS if isinstance(props.get(f), Mapping) and props[f].get("type") == "string"),
        None,
    )
    if field is None:
        return None
    args: dict[str, Any] = {field: line}
    required = spec.input_schema.get("required", [])
    for name, sub in props.items():
        if name == field or not isinstance(sub, Mapping):
            continue
        if name in ("to", "recipients") and sub.get("type") == "array":
            args[name] = list(recipients)
        elif name in required:
            value = _plain_value(sub)
            if value is not None:
                args[name] = value
    return args


def _plain_value(schema: Mapping[str, Any]) -> Any:
    """A neutral value a simple JSON Schema accepts, or ``None`` when there is no obvious one."""
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return next((v for v in enum if v in _NEUTRAL), enum[0])
    kind = schema.get("type")
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "array":
        return []
    if kind == "string":
        return ""
    return None


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
