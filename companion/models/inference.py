"""Values for a JSON Schema, inferred from the words of a message: the offline model's
``events.params`` and tool inputs.

A card's conditions only do something offline if the parameters they read follow the
conversation: ``weather_mentioned`` must be true for "Looks like rain tonight", ``wants_to_end``
for "Good night, all", ``emotion`` must move with the message. Each property is read for its
meaning (its name, description and enum options, through :mod:`.lexicon`'s concepts) and given
the value the message supports:

- booleans: whether the message evokes the property's concepts (or, without any, its name's
  own words); "already ..." properties come from the history instead;
- enums: the option whose words the message evokes most (the speaker's personality breaks ties);
- integers and numbers: a number written next to the property's words, else the strength of its
  concepts in the message (``liveliness`` for energy-like ones) mapped onto minimum..maximum;
- strings: the sender for who-properties, a listed thing (a food, a room) for thing-properties,
  else the noun phrase the message is about;
- arrays and objects: item by item, property by property.

The result is checked against the schema and repaired where it breaks it, so it is always valid
when the schema can be satisfied at all. Randomness (from the caller's seeded generator) is used
only where the words say nothing.
"""

from __future__ import annotations

import importlib
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jsonschema

from companion.models.lexicon import (
    FEELINGS,
    concepts_in,
    cue_concepts,
    first_concept,
    liveliness,
    numbers,
    spread,
    stem,
    stem_set,
    stems,
    things_in,
    topic_phrase,
    words,
)

__all__ = ["Clues", "fill_schema", "pattern_example"]

try:
    _regex_parser: Any = importlib.import_module("re._parser")
    """The standard library's own regular-expression parser (Python 3.11+), for pattern examples."""
except ImportError:  # pragma: no cover - a private module: without it, patterns get no example
    _regex_parser = None

_WHO: Final = stem_set(
    "name speaker partner who from sender person addressee recipient target user interlocutor"
)
_RECIPIENTS: Final = frozenset({"to", "recipients", "targets", "addressees", "audience"})
_SPOKEN: Final = stem_set("replied reply spoken spoke talked introduced greeted already")
_MET: Final = stem_set("met meet know known acquainted")
_GENERIC: Final = stem_set(
    """is has have was did does wants want mentioned mention mentions said say says talk talks talked
    about named name message last user someone somebody anyone conversation true false whether when
    if any the a an of to in on by for or and with it this that current something flag value level
    score amount number count"""
)
_COUNTED: Final = stem_set(
    """times time count number amount how many much percent level grams gram minutes minute seconds
    second degrees degree cups cup pieces piece items item steps step"""
)
_COUNT_WORDS: Final = stem_set("once twice thrice")
_EVIDENT: Final = 0.5
"""How strongly a message must evoke an option for it to be chosen over the speaker's lead trait."""
_FORMATS: Final = {
    "date": "2000-01-01",
    "date-time": "2000-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_MAX_DEPTH: Final = 8
_REPAIRS: Final = 32


@dataclass(frozen=True, slots=True)
class Clues:
    """What values are inferred from: the message, a little history and who is talking."""

    text: str
    """The message, cleaned (see :func:`.lexicon.clean`)."""
    recent: Sequence[str] = ()
    """The last few messages, oldest first (the message itself last), cleaned."""
    sender: str = ""
    me: str = ""
    recipients: Sequence[str] = ()
    spoken: bool = False
    """I have spoken in this conversation."""
    met: bool = False
    """I have talked with the sender before."""
    closing: str = "none"
    """The closing stage stamped on the message ("pre-closing" and "closing" sound like an end)."""
    hint: str = ""
    """The instruction that named a tool: for a tool's input, its words count like the message's."""
    persona: str = ""
    """The speaker's personality and role: a weak prior for feelings the message does not show."""
    tool_input: bool = False
    """Filling a tool's input: a schema ``default`` beats a guess."""
    evidence: dict[str, float] = field(default_factory=dict, init=False)
    raw: dict[str, float] = field(default_factory=dict, init=False)
    prior: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        said = f"{self.text} {self.hint}".strip()
        raw = concepts_in(said)
        if self.closing in ("pre-closing", "closing", "terminal"):
            raw["farewell"] = raw.get("farewell", 0.0) + 1.0  # the group is winding down
        if any(1000 <= value <= 2100 and value.is_integer() for _, value in numbers(self.text)):
            raw["doubt"] = raw.get("doubt", 0.0) + 1.0  # a date is a claim to check
        self.raw.update(raw)
        self.evidence.update(spread(raw))
        lead = first_concept(self.persona, FEELINGS)
        if lead is not None:  # the card's lead trait is the mood when the message shows none
            self.prior.update({k: 0.3 * min(v, 1.0) for k, v in spread({lead: 1.0}).items()})


def fill_schema(schema: Mapping[str, Any], clues: Clues, rng: random.Random) -> Any:
    """A value for ``schema`` inferred from ``clues``, valid against it when that is possible."""
    filler = _Filler(schema, clues, rng)
    value = filler.value(schema, "", 0)
    return filler.repair(value)


def _name_text(key: str) -> str:
    """A property name as words: ``weather_mentioned`` and ``weatherMentioned`` both read
    "weather mentioned"."""
    return re.sub(r"[_\-]+|(?<=[a-z])(?=[A-Z])", " ", key)


def _meaning_words(key: str, schema: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The stems of a property's name, and of its title and description."""
    about = f"{schema.get('title', '')} {schema.get('description', '')}"
    return [stem(w) for w in words(_name_text(key))], [stem(w) for w in words(about)]


class _Filler:
    def __init__(self, root: Mapping[str, Any], clues: Clues, rng: random.Random) -> None:
        self.root = root
        self.clues = clues
        self.rng = rng
        self.said = f"{clues.text} {clues.hint}".strip()
        self.said_stems = stems(self.said)

    # --- schema plumbing ---------------------------------------------------------------------

    def resolve(self, schema: Any) -> Mapping[str, Any]:
        seen = 0
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and seen < _MAX_DEPTH:
            schema = self._pointer(schema["$ref"]) or {}
            seen += 1
        if not isinstance(schema, Mapping):
            return {}
        if isinstance(schema.get("allOf"), list):
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self.resolve(part)
                for k, v in part.items():
                    if k == "properties" and isinstance(v, Mapping):
                        merged["properties"] = {**merged.get("properties", {}), **v}
                    elif k == "required" and isinstance(v, list):
                        merged["required"] = [*merged.get("required", []), *v]
                    else:
                        merged.setdefault(k, v)
            return merged
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                chosen = next((o for o in options if self.resolve(o).get("type") != "null"), options[0])
                rest = {k: v for k, v in schema.items() if k != key}
                return {**rest, **self.resolve(chosen)}
        return schema

    def _pointer(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    @staticmethod
    def kind_of(schema: Mapping[str, Any]) -> str | None:
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
        if kind is None:
            if isinstance(schema.get("properties"), Mapping):
                return "object"
            if "items" in schema:
                return "array"
        return kind if isinstance(kind, str) else None

    # --- values ----------------------------------------------------------------------------------

    def value(self, schema: Any, key: str, depth: int) -> Any:
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.choose(schema["enum"], key, schema)
        kind = self.kind_of(schema)
        if depth > _MAX_DEPTH:
            return schema.get("default", _empty(kind))
        if kind == "object":
            props = schema.get("properties", {})
            if not isinstance(props, Mapping):
                return {}
            return {
                name: self.value(sub, name, depth + 1) for name, sub in props.items() if isinstance(name, str)
            }
        if kind == "boolean":
            return self.boolean(key, schema)
        if kind in ("integer", "number"):
            return self.number(key, schema, integer=kind == "integer")
        if kind == "string":
            return self.string(key, schema)
        if kind == "array":
            return self.array(key, schema, depth)
        if kind == "null":
            return None
        return schema.get("default")

    def cues(self, key: str, schema: Mapping[str, Any]) -> dict[str, float]:
        """The concepts a property is about: its name counts twice, its description once."""
        about = f"{schema.get('title', '')} {schema.get('description', '')}"
        cues = {k: 2 * v for k, v in cue_concepts(_name_text(key)).items()}
        for concept, weight in cue_concepts(about).items():
            cues[concept] = cues.get(concept, 0.0) + weight
        return cues

    def boolean(self, key: str, schema: Mapping[str, Any]) -> bool:
        name, _ = _meaning_words(key, schema)
        negated = bool(name) and name[0] in ("not", "no", "non")
        if _MET & set(name):
            return self.clues.met
        if _SPOKEN & set(name):
            return self.clues.spoken
        cues = self.cues(key, schema)
        cues.pop("energy", None)
        if cues:
            found = any(self.clues.raw.get(c, 0.0) >= 1.0 for c in cues)
        elif "energy" in self.cues(key, schema):
            found = liveliness(self.clues.text) >= 0.6
        else:
            own = {w for w in name if w not in _GENERIC and w not in ("not", "no", "non")}
            found = bool(own & self.said_stems)
        return found != negated

    def choose(self, options: Sequence[Any], key: str, schema: Mapping[str, Any]) -> Any:
        """The option the message evokes most; numbers by the property's intensity."""
        if all(isinstance(o, int | float) and not isinstance(o, bool) for o in options):
            level = self.intensity(key, schema)
            low, high = min(options), max(options)
            target = low + (high - low) * level
            return min(options, key=lambda o: (abs(o - target), options.index(o)))
        ranked = self.ranked(options)
        if ranked[0][0] >= _EVIDENT:
            return ranked[0][1]
        prior = self.ranked(options, prior_only=True)
        if prior[0][0] > 0:
            return prior[0][1]
        if "default" in schema and schema["default"] in options:
            return schema["default"]
        return options[0]

    def ranked(self, options: Sequence[Any], *, prior_only: bool = False) -> list[tuple[float, Any]]:
        """``(score, option)``, best first (card order among equals): how much the message
        evokes each option's words; with ``prior_only``, how much the speaker's lead trait does."""
        scored: list[tuple[float, int, Any]] = []
        for index, option in enumerate(options):
            text = str(option)
            meant = cue_concepts(text)
            if prior_only:
                score = sum(self.clues.prior.get(c, 0.0) * w for c, w in meant.items())
            else:
                score = sum(self.clues.evidence.get(c, 0.0) * w for c, w in meant.items())
                score += 1.5 * len({stem(w) for w in words(text)} & self.said_stems)
            scored.append((score, index, option))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [(score, option) for score, _, option in scored]

    def intensity(self, key: str, schema: Mapping[str, Any]) -> float:
        """How strongly the message shows what the property measures, 0..1."""
        cues = self.cues(key, schema)
        if "energy" in cues:
            level = liveliness(self.clues.text)
            if self.clues.closing in ("pre-closing", "closing"):
                level -= 0.2
            return max(0.0, min(1.0, level))
        meant = {c: w for c, w in cues.items() if c != "question" or len(cues) == 1}
        if meant:
            hits = sum(self.clues.evidence.get(c, 0.0) for c in meant)
            return min(1.0, 0.1 + 0.3 * hits)
        return self.rng.uniform(0.3, 0.7)

    def number(self, key: str, schema: Mapping[str, Any], *, integer: bool) -> float | int:
        low, high = _bounds(schema, integer)
        written = self.written_number(key, schema, low, high)
        if written is not None:
            value: float = written
        elif self.clues.tool_input and isinstance(schema.get("default"), int | float):
            value = float(schema["default"])
        else:
            value = low + (high - low) * self.intensity(key, schema)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool) and step > 0:
            value = round(value / step) * step
            value = value - step if value > high else value + step if value < low else value
        if integer:
            return int(min(high, max(low, math.floor(value + 0.5))))
        return min(high, max(low, round(value, 6)))

    def written_number(self, key: str, schema: Mapping[str, Any], low: float, high: float) -> float | None:
        """A number the message (or the instruction) writes next to the property's own words
        ("ring the bell twice" for ``times``, "set it to 40 percent" for ``level``)."""
        name, about = _meaning_words(key, schema)
        meaning = ({*name, *about} if self.clues.tool_input else set(name)) - _GENERIC
        countable = bool(_COUNTED & {*name, *about})
        tokens = [stem(w) for w in words(self.said)]
        for index, value in numbers(self.said):
            window = set(tokens[max(0, index - 3) : index + 4]) - {tokens[index]}
            counts = tokens[index] in _COUNT_WORDS and countable
            if (counts or window & meaning) and low <= value <= high:
                return value
        return None

    def string(self, key: str, schema: Mapping[str, Any]) -> str:
        name, _ = _meaning_words(key, schema)
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        if isinstance(schema.get("default"), str) and self.clues.tool_input:
            candidates: list[str] = [schema["default"]]
        else:
            candidates = []
        if key.casefold() in _RECIPIENTS or _WHO & set(name):
            candidates.insert(0, self.clues.sender)
        for concept, _ in sorted(self.cues(key, schema).items(), key=lambda kv: -kv[1]):
            candidates.extend(things_in(concept, [self.said]))
        topic = topic_phrase(self.clues.text) or (topic_phrase(self.clues.hint) if self.clues.hint else None)
        if topic:
            candidates.append(topic)
        candidates.extend(w for w in words(self.clues.text) if len(w) > 3)
        for example in schema.get("examples", []) if isinstance(schema.get("examples"), list) else []:
            if isinstance(example, str):
                candidates.append(example)
        candidates.append(self.clues.text[:40].strip())
        return _fit_string(schema, [c for c in candidates if c])

    def array(self, key: str, schema: Mapping[str, Any], depth: int) -> list[Any]:
        items = self.resolve(schema.get("items", {}))
        least = _int(schema.get("minItems"), 0)
        most = _int(schema.get("maxItems"), 16)
        out: list[Any] = []
        if key.casefold() in _RECIPIENTS and self.kind_of(items) == "string":
            out = [r for r in self.clues.recipients if r != self.clues.me]
        elif isinstance(items.get("enum"), list) and items["enum"]:
            ranked = self.ranked(items["enum"])
            out = [option for score, option in ranked if score > 0.5] or [
                self.choose(items["enum"], key, schema)
            ]
            out.extend(option for _, option in ranked if option not in out and len(out) < least)
        elif self.kind_of(items) == "string":
            recent = list(self.clues.recent[-3:]) or [self.clues.text]
            if self.clues.hint:
                recent.append(self.clues.hint)
            things = [c for c, _ in sorted(self.cues(key, schema).items(), key=lambda kv: -kv[1])]
            for concept in things:
                out.extend(t for t in things_in(concept, recent) if t not in out)
            if least and len(out) < least:
                topic = topic_phrase(self.clues.text)
                extra = [topic] if topic else []
                extra += [w for w in words(self.clues.text) if len(w) > 3]
                out.extend(e for e in extra if e not in out)
            out = [_fit_string(items, [str(o)]) for o in out]
        while len(out) < least:
            out.append(self.value(items, key, depth + 1))
        if schema.get("uniqueItems"):
            unique: list[Any] = []
            for item in out:
                if item not in unique:
                    unique.append(item)
            out = unique
        return out[: max(most, least)]

    # --- validity --------------------------------------------------------------------------------

    def repair(self, value: Any) -> Any:
        """``value`` with every place that breaks the schema replaced by a safe value."""
        try:
            cls = jsonschema.validators.validator_for(dict(self.root), jsonschema.Draft202012Validator)
            validator = cls(dict(self.root))
        except Exception:
            return value
        for _ in range(_REPAIRS):
            try:
                error = next(iter(validator.iter_errors(value)), None)
            except Exception:
                return value
            if error is None:
                return value
            fixed = self._fix(value, error)
            if fixed is _UNFIXABLE:
                return value
            value = fixed
        return value

    def _fix(self, value: Any, error: jsonschema.ValidationError) -> Any:
        path = list(error.absolute_path)
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = next((n for n in schema.get("required", []) if n not in error.instance), None)
            if missing is None:
                return _UNFIXABLE
            props = schema.get("properties", {})
            replacement = dict(error.instance)
            replacement[missing] = _safe(self.resolve(props.get(missing, {})), self)
            return _set(value, path, replacement)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(schema.get("properties", {}))
            pattern_props = schema.get("patternProperties", {})
            kept = {
                k: v
                for k, v in error.instance.items()
                if k in allowed or any(re.search(p, k) for p in pattern_props)
            }
            return _set(value, path, kept) if kept != error.instance else _UNFIXABLE
        safe = _safe(self.resolve(schema), self)
        if safe == error.instance:
            return _UNFIXABLE
        return _set(value, path, safe)


_UNFIXABLE: Final = object()


def _set(value: Any, path: list[Any], replacement: Any) -> Any:
    if not path:
        return replacement
    head, *rest = path
    if isinstance(value, dict):
        copy = dict(value)
        copy[head] = _set(copy.get(head), rest, replacement)
        return copy
    if isinstance(value, list) and isinstance(head, int) and 0 <= head < len(value):
        items = list(value)
        items[head] = _set(items[head], rest, replacement)
        return items
    return value


def _safe(schema: Mapping[str, Any], filler: _Filler) -> Any:
    """A value that satisfies ``schema`` on its own, without reading the message."""
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["default"] if schema.get("default") in schema["enum"] else schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = filler.kind_of(schema)
    if kind in ("integer", "number"):
        low, high = _bounds(schema, kind == "integer")
        base = low if low > -math.inf else min(0.0, high)
        return int(base) if kind == "integer" else float(base)
    if kind == "string":
        return _fit_string(schema, [])
    if kind == "array":
        items = filler.resolve(schema.get("items", {}))
        return [_safe(items, filler) for _ in range(_int(schema.get("minItems"), 0))]
    if kind == "object":
        props = schema.get("properties", {})
        return {
            name: _safe(filler.resolve(props.get(name, {})), filler)
            for name in schema.get("required", [])
            if isinstance(name, str)
        }
    if kind == "boolean":
        return False
    return None


def _empty(kind: str | None) -> Any:
    return {"object": {}, "array": [], "string": "", "boolean": False, "integer": 0, "number": 0.0}.get(
        kind or ""
    )


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _bounds(schema: Mapping[str, Any], integer: bool) -> tuple[float, float]:
    """The inclusive range of a numeric schema (0..10 when it gives none)."""
    low = schema.get("minimum")
    high = schema.get("maximum")
    ex_low = schema.get("exclusiveMinimum")
    ex_high = schema.get("exclusiveMaximum")
    unit = 1.0 if integer else 0.01
    lows = [float(v) for v in (low,) if isinstance(v, int | float)]
    lows += [float(v) + unit for v in (ex_low,) if isinstance(v, int | float) and not isinstance(v, bool)]
    highs = [float(v) for v in (high,) if isinstance(v, int | float)]
    highs += [float(v) - unit for v in (ex_high,) if isinstance(v, int | float) and not isinstance(v, bool)]
    lo = max(lows) if lows else None
    hi = min(highs) if highs else None
    if lo is None and hi is None:
        lo, hi = 0.0, 10.0
    elif lo is None:
        assert hi is not None
        lo = min(0.0, hi)
    elif hi is None:
        hi = max(lo + 10.0, lo)
    if integer:
        lo, hi = float(math.ceil(lo)), float(math.floor(hi))
    return (lo, hi) if lo <= hi else (lo, lo)


def _fit_string(schema: Mapping[str, Any], candidates: Sequence[str]) -> str:
    """The first candidate that fits the string schema's length and pattern, cut to fit."""
    least = _int(schema.get("minLength"), 0)
    most = _int(schema.get("maxLength"), 200)
    pattern = schema.get("pattern")
    for candidate in candidates:
        text = candidate.strip()
        if len(text) > most:
            cut = text[:most]
            text = cut.rsplit(" ", 1)[0] if " " in cut and len(cut.rsplit(" ", 1)[0]) >= least else cut
        if len(text) < least:
            continue
        if isinstance(pattern, str):
            try:
                if re.search(pattern, text) is None:
                    continue
            except re.error:
                return text
        return text
    if isinstance(pattern, str):
        example = pattern_example(pattern)
        if example is not None and least <= len(example) <= most:
            return example
        return ""  # the repair step keeps what validates; nothing better can be guessed
    return ("x" * least) if least else ""


def pattern_example(pattern: str) -> str | None:
    """The shortest obvious string matching a regular expression (``^[0-9]{3}$`` -> "000"),
    or ``None`` for patterns too intricate to satisfy this way."""
    if _regex_parser is None:
        return None
    try:
        parsed = _regex_parser.parse(pattern)
        example = _example(list(parsed), 0)
    except Exception:
        return None
    try:
        return example if example is not None and re.search(pattern, example) else None
    except re.error:
        return None


def _example(items: list[Any], depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append("a" if arg != ord("a") else "b")
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_in_example(arg))
        elif name == "CATEGORY":
            out.append(_category(str(arg)))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, sub = arg
            part = _example(list(sub), depth + 1)
            if part is None:
                return None
            out.append(part * int(low))
        elif name == "SUBPATTERN":
            part = _example(list(arg[-1]), depth + 1)
            if part is None:
                return None
            out.append(part)
        elif name == "BRANCH":
            part = _example(list(arg[1][0]), depth + 1)
            if part is None:
                return None
            out.append(part)
        elif name in ("AT", "GROUPREF", "ASSERT_NOT"):
            continue
        else:
            return None
    return "".join(out)


def _in_example(members: list[Any]) -> str:
    negated = any(str(op) == "NEGATE" for op, _ in members)
    if negated:
        allowed = [str(op) for op, _ in members]
        for candidate in "a0_ -":
            if not any(_member(op, arg, candidate) for op, arg in members if str(op) != "NEGATE"):
                return candidate
        return "a" if "a" not in allowed else "b"
    op, arg = members[0]
    name = str(op)
    if name == "LITERAL":
        return chr(arg)
    if name == "RANGE":
        return chr(arg[0])
    if name == "CATEGORY":
        return _category(str(arg))
    return "a"


def _member(op: Any, arg: Any, char: str) -> bool:
    name = str(op)
    if name == "LITERAL":
        return char == chr(arg)
    if name == "RANGE":
        return bool(arg[0] <= ord(char) <= arg[1])
    if name == "CATEGORY":
        return _category(str(arg)) == char
    return False


def _category(name: str) -> str:
    if "DIGIT" in name:
        return "a" if "NOT" in name else "0"
    if "SPACE" in name:
        return "a" if "NOT" in name else " "
    if "WORD" in name:
        return "-" if "NOT" in name else "a"
    return "a"
