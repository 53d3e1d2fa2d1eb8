"""A model's parameter values fitted to the card's ``events.params`` schema before CEL sees them.

Pure. Measured with SmolLM2-135M behind llama-cpp-python: ``topic_energy: 32`` where the card
allows at most 10 (the server's JSON-schema grammar does not bound integers), and the retry gave
the same; ``wants_to_end: true`` on the first turn, so the first line was a goodbye. A value the
schema can take in a plainly meant form is fitted, and the change is reported; what cannot be
fitted is left for the schema's validation to refuse (the model is asked once more).

- numbers beyond ``minimum``/``maximum`` (and the exclusive bounds of integers) are clamped;
  a number written as a string is read; an integer written as ``3.0`` becomes ``3``;
- a boolean written ``"true"``/``"false"`` is read; an enum value in another case is the
  schema's spelling; a string longer than ``maxLength`` is cut; an array longer than
  ``maxItems`` is cut; properties the schema forbids (``additionalProperties: false``) go;
- :func:`plausible_early` says no to an ending (a boolean about ending or goodbyes) in a
  conversation's first replies, unless the message it answers takes leave.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from companion.lines.farewell import takes_leave

__all__ = ["Fitted", "fit_params", "is_ending_param", "plausible_early"]

_DEPTH_LIMIT = 8
"""Nesting followed into objects and arrays (a card's schema is shallow; a model's answer need
not be)."""


@dataclass(frozen=True, slots=True)
class Fitted:
    """The values as fitted, and one line per change (``path: what was done``)."""

    values: dict[str, Any]
    changes: tuple[str, ...] = ()


def fit_params(values: Mapping[str, Any], schema: Mapping[str, Any]) -> Fitted:
    """``values`` fitted to the object ``schema`` where it plainly allows (see the module)."""
    changes: list[str] = []
    fitted = _fit(dict(values), schema, "", changes, 0)
    return Fitted(fitted if isinstance(fitted, dict) else dict(values), tuple(changes[:20]))


def _fit(value: Any, schema: Any, path: str, changes: list[str], depth: int) -> Any:
    if not isinstance(schema, Mapping) or depth > _DEPTH_LIMIT:
        return value
    kind = schema.get("type")
    enum = schema.get("enum")
    if isinstance(enum, list) and isinstance(value, str) and value not in enum:
        folded = [e for e in enum if isinstance(e, str) and e.casefold() == value.strip().casefold()]
        if len(folded) == 1:
            changes.append(f"{path or '(root)'}: {value!r} read as {folded[0]!r}")
            return folded[0]
    if kind in ("integer", "number"):
        return _number(value, schema, kind, path, changes)
    if kind == "boolean" and isinstance(value, str) and value.strip().casefold() in ("true", "false"):
        changes.append(f"{path}: the string {value!r} read as a boolean")
        return value.strip().casefold() == "true"
    if kind == "string" and isinstance(value, str):
        limit = schema.get("maxLength")
        if isinstance(limit, int) and limit >= 0 and len(value) > limit:
            changes.append(f"{path}: cut to maxLength {limit}")
            return value[:limit]
        return value
    if kind == "array" and isinstance(value, list):
        limit = schema.get("maxItems")
        if isinstance(limit, int) and limit >= 0 and len(value) > limit:
            changes.append(f"{path}: {len(value)} items cut to maxItems {limit}")
            value = value[:limit]
        items = schema.get("items")
        return [_fit(v, items, f"{path}[{i}]", changes, depth + 1) for i, v in enumerate(value)]
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in props and schema.get("additionalProperties") is False:
                changes.append(f"{where}: not a parameter of the card, dropped")
                continue
            out[key] = _fit(item, props.get(key), where, changes, depth + 1)
        return out
    return value


def _number(value: Any, schema: Mapping[str, Any], kind: str, path: str, changes: list[str]) -> Any:
    original = value
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return original
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return original
    if kind == "integer":
        if value != int(value):
            return original  # 2.5 for an integer: not plainly meant; refused, asked again
        value = int(value)
    low, high = _bounds(schema, kind)
    clamped = min(max(value, low), high) if low <= high else value
    if clamped != value:
        changes.append(f"{path}: {value!r} clamped to {clamped!r} (the card allows {low:g}..{high:g})")
    elif type(clamped) is not type(original) or clamped != original:
        changes.append(f"{path}: {original!r} read as {clamped!r}")
    return clamped


def _bounds(schema: Mapping[str, Any], kind: str) -> tuple[float, float]:
    def number(key: str) -> float | None:
        bound = schema.get(key)
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            return None
        return float(bound)

    low, high = number("minimum"), number("maximum")
    exclusive_low, exclusive_high = number("exclusiveMinimum"), number("exclusiveMaximum")
    if kind == "integer":  # an exclusive bound of an integer is the next integer in
        if exclusive_low is not None:
            step = math.floor(exclusive_low) + 1
            low = step if low is None else max(low, step)
        if exclusive_high is not None:
            step = math.ceil(exclusive_high) - 1
            high = step if high is None else min(high, step)
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    if kind == "integer":
        lo, hi = (lo if math.isinf(lo) else math.ceil(lo)), (hi if math.isinf(hi) else math.floor(hi))
    return lo, hi


_ENDING = re.compile(
    r"(?:^|_|\b)(?:end|ends|ending|ended|close|closing|leave|leaving|bye|goodbye|farewell|finish|finished"
    r"|stop|wrap|sign_?off|done)(?:$|_|\b)",
    re.IGNORECASE,
)


def is_ending_param(name: str, schema: Any) -> bool:
    """A boolean parameter about the conversation ending (``wants_to_end``, ``said_goodbye``)."""
    return isinstance(schema, Mapping) and schema.get("type") == "boolean" and bool(_ENDING.search(name))


def plausible_early(values: Mapping[str, Any], schema: Mapping[str, Any], message: str) -> Fitted:
    """``values`` for one of a conversation's first replies: an ending parameter set true is set
    false, unless ``message`` (the line being answered) takes leave
    (:func:`~companion.lines.farewell.takes_leave`). A conversation that has barely started is
    not over; a small model says so at random (SmolLM2-135M: ``wants_to_end`` true on the first
    turn, measured). The caller says which replies are early: those in which a leader's model
    may not begin closing (:data:`~companion.conversation.rules.closing.DEFAULT_MIN_REPLIES`),
    where a companion's goodbye does not close the conversation either: said then, the card's
    goodbye would be followed by more of the same conversation."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or takes_leave(message):
        return Fitted(dict(values))
    out = dict(values)
    changes = []
    for name, sub in props.items():
        if out.get(name) is True and is_ending_param(str(name), sub):
            out[name] = False
            changes.append(f"{name}: true this early, and nobody took leave: set false")
    return Fitted(out, tuple(changes))
