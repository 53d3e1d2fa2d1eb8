"""CompanionCard: who a companion is, which tools it has, and when to use them.

A card is a YAML file (or TOML, or a Python-made :class:`CompanionCard`). Loading it checks
everything a new user can get wrong and reports every problem at once, each naming the file, the
line, the field path and a fix, so a broken card can be repaired without reading this code.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from companion.actions import BUILTINS, ActionDef, KnowledgeDef, resolve_tool
from companion.card.routines import CompiledRoutine, Routine, RoutineError, compile_routines
from companion.card.triggers import (
    CompiledTriggers,
    ToolInstruction,
    TriggerCondition,
    TriggerError,
    compile_triggers,
)
from companion.protocol import COMPANION_ID_PREFIX, Metadata

__all__ = [
    "COMPANION_ID_PREFIX",
    "IMAGE_TYPES",
    "MAX_IMAGE_BYTES",
    "Appearance",
    "CardError",
    "CardProblem",
    "CardSettings",
    "CompanionCard",
    "Condition",
    "Events",
    "Execute",
    "LoadedCard",
    "Resolver",
    "Routine",
    "ToolDefinition",
    "card_json_schema",
    "image_path",
    "image_type",
    "load_card",
]

PathPart: TypeAlias = str | int

_YamlLoader: Final[type[yaml.SafeLoader]] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are): a card parses in ~1 ms
instead of ~10 on every start, into the same nodes with the same marks."""


def _explained(exc: yaml.YAMLError, text: str) -> yaml.YAMLError:
    """The pure-Python parser's error for a card libyaml refused: its problem texts are the ones
    the fixes are chosen by (libyaml words a tab or a stray quote differently). Only a broken card
    is parsed twice."""
    try:
        yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as pure:
        return pure
    return exc


ToolDefinition: TypeAlias = ActionDef | KnowledgeDef
"""A resolved action or knowledge definition."""

Resolver: TypeAlias = Callable[[str], ToolDefinition]
"""``resolve(reference) -> definition``; raises ``ToolNotFound`` (a ``LookupError``) for unknown names."""


# --- the card format -----------------------------------------------------------------------------


class _CardModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Execute(_CardModel):
    """One tool to use when a condition holds, and how."""

    instruction: str = Field(min_length=1, description="What the tool should do, in plain words.")
    tool: str = Field(
        min_length=1, description="A tool listed under actions or knowledge (its name or reference)."
    )


class Condition(_CardModel):
    """A CEL expression over the parameters; when true, its tools are used."""

    expression: str = Field(description='A CEL boolean expression, e.g. `emotion == "joy" && energy > 6`.')
    execute: list[Execute] = Field(min_length=1, description="The tools to use when the expression holds.")


class Events(_CardModel):
    """Parameters the model fills in each turn, and the conditions evaluated over them."""

    params: dict[str, Any] = Field(
        description="A JSON Schema object (`type: object`, `properties`); each property is a CEL variable."
    )
    conditions: list[Condition] = Field(description="Evaluated in order; earlier conditions win per tool.")


class CardSettings(_CardModel):
    """Optional per-card settings for the conversation engine."""

    model: str | None = Field(
        default=None, description='Model spec: "scripted", "openai:NAME" or "anthropic:NAME".'
    )
    max_turns: int | None = Field(
        default=None, ge=1, description="Turns before the companion starts closing the conversation."
    )
    repetition_threshold: float = Field(
        default=0.6, ge=0, le=1, description="Similarity (0..1) above which replies count as repetitive."
    )


IMAGE_TYPES: Final[Mapping[bytes, str]] = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}
"""The image files a card may ship, by their first bytes (WebP is checked apart: RIFF....WEBP).
No SVG: the bridge serves the file from its own origin, and an SVG may carry scripts."""
MAX_IMAGE_BYTES: Final = 1024 * 1024


class Appearance(_CardModel):
    """How clients draw the companion: a face and a colour. Card-level, never on the wire to
    peers: aikyo's metadata is exactly five fields, so the bridge serves this to its clients."""

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="An image file beside the card (PNG, JPEG, GIF or WebP; a path relative to the "
        "card's folder) or an https:// URL.",
    )
    color: str | None = Field(
        default=None,
        pattern=r"^#[0-9a-fA-F]{6}$",
        description='The colour of its face and name, as #rrggbb (e.g. "#3c6e71").',
    )

    def image_url(self) -> str | None:
        """The image as a URL, when it is one (``https://`` or ``http://``)."""
        if self.image is not None and self.image.startswith(("https://", "http://")):
            return self.image
        return None


def image_type(head: bytes) -> str | None:
    """The content type of an image file from its first 12 bytes, if it is one a card may ship."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    for magic, kind in IMAGE_TYPES.items():
        if head.startswith(magic):
            return kind
    return None


class CompanionCard(_CardModel):
    """A companion's card: identity, role, tools and trigger conditions."""

    metadata: Metadata = Field(description="Sent to peers as is; id must start with `companion_`.")
    role: str = Field(min_length=1, description="How the companion behaves in the conversation.")
    actions: list[str] = Field(
        description='Action references: built-in names ("speak") or "package.module:attribute".'
    )
    knowledge: list[str] = Field(default_factory=list, description="Knowledge references, same form.")
    events: Events
    routines: list[Routine] = Field(
        default_factory=list,
        description="Tools the companion runs on its own: every N seconds, after silence, or on an event.",
    )
    settings: CardSettings = Field(default_factory=CardSettings)
    appearance: Appearance | None = Field(
        default=None,
        description="How clients draw the companion (an image, a colour); never sent to peers.",
    )


def card_json_schema() -> dict[str, Any]:
    """The JSON Schema of the card format, for editors (YAML language servers) to validate cards."""
    schema = CompanionCard.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "CompanionCard"
    metadata_id = schema["$defs"]["Metadata"]["properties"]["id"]
    metadata_id["pattern"] = f"^{COMPANION_ID_PREFIX}"
    return schema


# --- problems ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CardProblem:
    """One thing wrong with a card: where (file, line, field path), what, and how to fix it."""

    file: str | None
    path: str
    message: str
    fix: str
    line: int | None = None
    excerpt: str = ""

    def __str__(self) -> str:
        where = self.file or "<card>"
        if self.line is not None:
            where += f":{self.line}"
        head = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        lines = [head]
        lines += [f"    {text}" for text in self.excerpt.splitlines()]
        lines.append(f"    fix: {self.fix}")
        return "\n".join(lines)


class CardError(ValueError):
    """A card cannot be used; ``problems`` lists everything found, ``str()`` prints them all."""

    def __init__(self, problems: Sequence[CardProblem]) -> None:
        # Top to bottom through the file, as a reader fixes them.
        self.problems = sorted(problems, key=lambda p: p.line or 0)
        count = len(self.problems)
        file = self.problems[0].file if self.problems else None
        header = f"{file or 'card'}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([header, *(str(p) for p in self.problems)]))


def _dotted(parts: Sequence[PathPart]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- loading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedCard:
    """A checked card: its tools resolved (by tool id), its conditions and routines compiled."""

    card: CompanionCard
    path: Path | None
    triggers: CompiledTriggers
    tools: Mapping[str, ToolDefinition]
    routines: tuple[CompiledRoutine, ...] = ()

    @classmethod
    def from_card(
        cls, card: CompanionCard, *, resolve: Resolver = resolve_tool, path: Path | None = None
    ) -> LoadedCard:
        """Check a card built in Python exactly as :func:`load_card` checks a file."""
        checked = _Checker(str(path) if path else None, resolve)
        found = checked.semantic(card.metadata.id, card.actions, card.knowledge, card.events, card.routines)
        if checked.problems or found.triggers is None:
            raise CardError(checked.problems)
        return cls(card=card, path=path, triggers=found.triggers, tools=found.tools, routines=found.routines)


def load_card(path: str | Path, *, resolve: Resolver = resolve_tool) -> LoadedCard:
    """Read, validate and compile a card file; raise :class:`CardError` listing every problem.

    ``resolve`` turns tool references into definitions (tests pass their own).
    """
    file = Path(path)
    name = str(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        fix = "check the path, and that the file is UTF-8 text"
        raise CardError([CardProblem(name, "", f"cannot read the card: {reason}", fix)]) from None
    checker = _Checker(name, resolve)
    raw = checker.parse(text, toml=file.suffix.lower() == ".toml")
    if raw is None:
        raise CardError(checker.problems)
    card = checker.structure(raw)
    if card is not None:
        found = checker.semantic(card.metadata.id, card.actions, card.knowledge, card.events, card.routines)
        checker.appearance(card.appearance, file)
        if not checker.problems and found.triggers is not None:
            return LoadedCard(
                card=card, path=file, triggers=found.triggers, tools=found.tools, routines=found.routines
            )
    raise CardError(checker.problems)


@dataclass(frozen=True, slots=True)
class _Semantics:
    """What the meaning checks produced (None / empty where a section could not be checked)."""

    triggers: CompiledTriggers | None
    tools: dict[str, ToolDefinition]
    routines: tuple[CompiledRoutine, ...] = ()


class _Checker:
    """Collects the problems of one card, locating them in the source when there is one."""

    def __init__(self, file: str | None, resolve: Resolver) -> None:
        self.file = file
        self.root: yaml.Node | None = None  # the YAML node tree, once parsed
        self.resolve = resolve
        self.problems: list[CardProblem] = []
        self.unimported: set[str] = set()
        """Attributes of ``module:attribute`` tools whose module could not be imported: their
        tool ids are unknown, so a condition or routine naming one is not a second problem."""

    def add(
        self,
        parts: Sequence[PathPart],
        message: str,
        fix: str,
        excerpt: str = "",
        inner_line: int | None = None,
    ) -> None:
        """Record a problem; ``inner_line`` is a line within a multi-line (``|``) value."""
        line, node = self._locate(parts)
        literal_block = isinstance(node, yaml.ScalarNode) and node.style == "|"
        if line is not None and inner_line is not None and literal_block:
            line += inner_line
        self.problems.append(CardProblem(self.file, _dotted(parts), message, fix, line, excerpt))

    # parsing

    def parse(self, text: str, *, toml: bool) -> dict[str, Any] | None:
        if toml:
            import tomllib  # only for TOML cards (start-up)

            try:
                data: Any = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                self.add([], f"TOML syntax error: {exc}", "fix the TOML syntax at that position")
                return None
        else:
            loader = _YamlLoader(text)
            try:
                self.root = loader.get_single_node()
                self._duplicate_keys(self.root, [])  # before constructing: merge keys rewrite nodes
                data = None if self.root is None else loader.construct_document(self.root)
            except yaml.YAMLError as exc:
                self._yaml_error(_explained(exc, text), text)
                return None
            finally:
                loader.dispose()
            _routine_on_keys(data)
        if data is None:
            self.add([], "the card is empty", "start from one of the example cards in cards/")
            return None
        if not isinstance(data, dict):
            self.add(
                [],
                f"the card must be a mapping of keys, not a {type(data).__name__}",
                "write `metadata:`, `role:`, `actions:` and `events:` at the top level",
            )
            return None
        return data

    def _yaml_error(self, exc: yaml.YAMLError, text: str) -> None:
        mark = getattr(exc, "problem_mark", None)
        context_mark = getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"YAML syntax error: {problem}"
        if context:
            message += f" ({context}" + (
                f" started on line {context_mark.line + 1})" if context_mark else ")"
            )
        lines = text.splitlines()
        excerpt = ""
        line = None
        if mark is not None:
            line = mark.line + 1
            # Show where the broken construct began (an unclosed quote, say) and where YAML gave up.
            scanning = bool(context) and str(context).startswith("while scanning")
            first = context_mark if scanning else None
            shown = [m for m in (first, mark) if m is not None and m.line < len(lines)]
            shown = [m for m in shown if lines[m.line].strip()]
            if len(shown) == 2 and shown[0].line == shown[1].line:
                shown = shown[1:]
            excerpt = "\n".join(f"{lines[m.line]}\n{' ' * m.column}^" for m in shown)
        self.problems.append(CardProblem(self.file, "", message, _yaml_fix(str(problem)), line, excerpt))

    def _duplicate_keys(self, node: yaml.Node | None, parts: list[PathPart]) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key, value in node.value:
                name = key.value
                if name in seen:
                    self.problems.append(
                        CardProblem(
                            self.file,
                            _dotted([*parts, name]),
                            f"duplicate key {name!r} (the later value would silently win)",
                            "keep one of them",
                            key.start_mark.line + 1,
                        )
                    )
                seen.add(name)
                self._duplicate_keys(value, [*parts, name])
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._duplicate_keys(item, [*parts, i])

    def _locate(self, parts: Sequence[PathPart]) -> tuple[int | None, yaml.Node | None]:
        """The source line of the key (or list item) at ``parts`` and its value node.

        When the path leaves the document, the line is that of the nearest parent found (none for
        a missing top-level key) and the node is ``None``.
        """
        node = self.root
        line: int | None = None
        for part in parts:
            if isinstance(node, yaml.MappingNode):
                pair = next(((k, v) for k, v in node.value if k.value == part), None)
                if pair is None:
                    return line, None
                line, node = pair[0].start_mark.line + 1, pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line, None
        return line, node

    # structure

    def structure(self, raw: dict[str, Any]) -> CompanionCard | None:
        try:
            return CompanionCard.model_validate(raw)
        except ValidationError as exc:
            failed_sections = set()
            for error in exc.errors():
                loc = tuple(error["loc"])
                failed_sections.add(loc[0] if loc else "")
                self._pydantic_problem(loc, error)
        # Check what did validate, so the user sees every problem in one run.
        raw_metadata = raw.get("metadata")
        raw_id = raw_metadata.get("id") if isinstance(raw_metadata, dict) else None
        events = _try(Events, raw.get("events")) if "events" not in failed_sections else None
        actions = raw.get("actions") if "actions" not in failed_sections else None
        knowledge = raw.get("knowledge", []) if "knowledge" not in failed_sections else None
        routines = _try_routines(raw.get("routines", [])) if "routines" not in failed_sections else None
        self.semantic(raw_id if isinstance(raw_id, str) else None, actions, knowledge, events, routines)
        return None

    def _pydantic_problem(self, loc: tuple[PathPart, ...], error: Mapping[str, Any]) -> None:
        kind = error["type"]
        key = loc[-1] if loc else ""
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            self.add(loc, f"unknown key {key!r}", f"{hint}remove it; allowed here: {', '.join(allowed)}")
        elif kind == "missing":
            description = _field_description(loc)
            if description:
                description = " (" + description[0].lower() + description[1:].rstrip(".") + ")"
            self.add(loc, f"missing required field {key!r}", f"add `{key}:`{description}")
        else:
            got = json.dumps(error.get("input"), default=str, ensure_ascii=False)
            got = got if len(got) <= 40 else got[:37] + "..."
            fix = _fix_for_type(kind, error)
            if kind == "string_pattern_mismatch" and _field_description(loc):
                fix = _field_description(loc)  # the pattern's regex says less than its description
            self.add(loc, f"{error['msg']} (got {got})", fix)

    # meaning

    def semantic(
        self,
        companion_id: str | None,
        actions: Sequence[str] | None,
        knowledge: Sequence[str] | None,
        events: Events | None,
        routines: Sequence[Routine] | None = None,
    ) -> _Semantics:
        if companion_id is not None and not companion_id.startswith(COMPANION_ID_PREFIX):
            self.add(
                ["metadata", "id"],
                f"companion id {companion_id!r} does not start with {COMPANION_ID_PREFIX!r}",
                f"rename it, e.g. {COMPANION_ID_PREFIX + companion_id!r} "
                "(on an aikyo network every companion id starts with companion_)",
            )
        tools: dict[str, ToolDefinition] = {}
        names: dict[str, str] = {}  # reference or id -> tool id
        listed: set[str] = set()
        for section, kind, refs in (("actions", "action", actions), ("knowledge", "knowledge", knowledge)):
            for i, ref in enumerate(refs or []):
                listed.add(ref)
                defn = self._resolve([section, i], ref, kind)
                if defn is None:
                    continue
                if defn.id in tools:
                    self.add(
                        [section, i],
                        f"{ref!r} has the tool id {defn.id!r}, which another listed tool already uses",
                        "list each tool once; two tools must not share an id",
                    )
                    continue
                tools[defn.id] = defn
                names[ref] = names[defn.id] = defn.id
        compiled_routines = self._routines(routines or [], tools, names, listed)
        if events is None:
            return _Semantics(None, tools, compiled_routines)
        conditions: list[TriggerCondition] = []
        for j, condition in enumerate(events.conditions):
            instructions: list[ToolInstruction] = []
            for k, step in enumerate(condition.execute):
                self._listed(["events", "conditions", j, "execute", k, "tool"], step.tool, names, listed)
                instructions.append(ToolInstruction(names.get(step.tool, step.tool), step.instruction))
            conditions.append(TriggerCondition(condition.expression, tuple(instructions)))
        try:
            triggers = compile_triggers(events.params, conditions)
        except TriggerError as exc:
            for problem in exc.problems:
                self.add(
                    ["events", *problem.path], problem.message, problem.fix, problem.excerpt, problem.line
                )
            return _Semantics(None, tools, compiled_routines)
        return _Semantics(triggers, tools, compiled_routines)

    def appearance(self, appearance: Appearance | None, card_file: Path) -> None:
        """A local image must be a small PNG, JPEG, GIF or WebP inside the card's folder."""
        if appearance is None or appearance.image is None or appearance.image_url() is not None:
            return
        parts: list[PathPart] = ["appearance", "image"]
        if "://" in appearance.image:
            self.add(parts, f"{appearance.image!r} is not an https:// URL", "use https://... or a file path")
            return
        path = image_path(appearance, card_file)
        if path is None:
            self.add(
                parts,
                f"{appearance.image!r} is outside the card's folder",
                "put the image beside the card (or in a folder below it) and give its relative path",
            )
            return
        try:
            size = path.stat().st_size
            with path.open("rb") as f:
                head = f.read(12)
        except OSError as exc:
            self.add(
                parts,
                f"cannot read {appearance.image!r}: {exc.strerror or exc}",
                f"put {appearance.image!r} beside the card (a copied card needs its image too), or remove"
                " appearance.image: the face is then the initials on the colour",
            )
            return
        if image_type(head) is None:
            self.add(parts, f"{appearance.image!r} is not a PNG, JPEG, GIF or WebP image", "convert it")
        elif size > MAX_IMAGE_BYTES:
            self.add(
                parts,
                f"{appearance.image!r} is {size} bytes; at most {MAX_IMAGE_BYTES} are served",
                "make the image smaller (a face needs ~256 px)",
            )

    def _listed(self, parts: list[PathPart], tool: str, names: Mapping[str, str], listed: set[str]) -> bool:
        """Whether ``tool`` names a listed tool (by reference or id); a problem if not."""
        if tool in names or tool in listed:
            return True
        if tool in self.unimported:
            return False  # its tool could not be imported: already reported
        choices = sorted(set(names) | listed)
        close = difflib.get_close_matches(tool, choices, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self.add(
            parts,
            f"tool {tool!r} is not listed in actions or knowledge",
            f"{hint}add it to actions (or knowledge), or use one of: "
            + (", ".join(choices) or "(nothing listed yet)"),
        )
        return False

    def _routines(
        self,
        routines: Sequence[Routine],
        tools: Mapping[str, ToolDefinition],
        names: Mapping[str, str],
        listed: set[str],
    ) -> tuple[CompiledRoutine, ...]:
        resolved: list[ToolDefinition | None] = []
        for i, routine in enumerate(routines):
            self._listed(["routines", i, "tool"], routine.tool, names, listed)
            tool_id = names.get(routine.tool)
            resolved.append(tools.get(tool_id) if tool_id is not None else None)
        try:
            return compile_routines(routines, resolved)
        except RoutineError as exc:
            for problem in exc.problems:
                self.add(
                    ["routines", *problem.path], problem.message, problem.fix, problem.excerpt, problem.line
                )
            return ()

    def _resolve(self, parts: list[PathPart], ref: str, kind: str) -> ToolDefinition | None:
        try:
            defn = self.resolve(ref)
        except LookupError as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            missing = getattr(exc, "missing_module", None)
            if missing:
                self.unimported.add(ref.rpartition(":")[2].rpartition(".")[2])
                fix = _importable_fix(ref.partition(":")[0], missing, self.file)
            else:
                fix = (
                    f"use a built-in ({', '.join(BUILTINS)}) or 'package.module:attribute' naming an "
                    f"@{kind} object in your code"
                )
            self.add(parts, f"tool {ref!r} is not registered: {reason}", fix)
            return None
        if defn.kind != kind:
            other = "knowledge" if kind == "action" else "actions"
            self.add(
                parts,
                f"{ref!r} is a {defn.kind} tool, listed under {parts[0]}",
                f"move it to {other}",
            )
            return None
        return defn


def image_path(appearance: Appearance, card_file: Path) -> Path | None:
    """The local image file of ``appearance``, resolved beside ``card_file`` (``None``: a URL,
    no image, or a path that leaves the card's folder)."""
    if appearance.image is None or "://" in appearance.image:
        return None
    folder = card_file.resolve().parent
    path = (folder / appearance.image).resolve()
    return path if path.is_relative_to(folder) else None


def _importable_fix(module: str, missing: str, card_file: str | None) -> str:
    """How to make ``module`` importable when Python found no ``missing`` module: Python looks
    in PYTHONPATH and the installed packages, not in the card's folder, so a module lying next
    to the card needs its folder named; a module it imports needs installing."""
    if not f"{module}.".startswith(f"{missing}."):
        return f"{module!r} imports {missing!r}, which is not installed here: pip install the package with it"
    top = module.partition(".")[0]
    folder = Path(card_file).parent if card_file else None
    if folder is not None and ((folder / f"{top}.py").is_file() or (folder / top).is_dir()):
        shown = str(folder) if str(folder) != "." else "."
        return (
            f"{top!r} is in the card's folder, which Python does not search: run with "
            f"PYTHONPATH={shown} (e.g. PYTHONPATH={shown} companion run {card_file})"
        )
    return (
        f"make {module!r} importable: add the folder that holds {top}.py (or the {top} package) to "
        "PYTHONPATH, or pip install the package that provides it"
    )


def _yaml_fix(problem: str) -> str:
    """Plain advice for the YAML mistakes people make most in cards."""
    if "found '<scalar>'" in problem:
        return (
            "text continues after a closing quote or on a badly indented line: quote the whole value "
            "(single quotes outside if it contains double quotes) and check the indentation"
        )
    if "mapping values are not allowed" in problem:
        return "a value contains `: `; put the whole value in quotes"
    if "'\\t'" in problem or "tab" in problem:
        return "indent with spaces, not tabs"
    if "end of stream" in problem:
        return "close the quote or bracket that is still open"
    return (
        "check indentation and quoting on that line (a value containing `: ` or starting with a quote, "
        "`{`, `[`, `*` or `&` must be quoted)"
    )


_M = typing.TypeVar("_M", bound=BaseModel)


def _try(model: type[_M], data: Any) -> _M | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def _try_routines(data: Any) -> list[Routine] | None:
    """The routines that validate, when some of the others do not (so all problems show at once)."""
    if not isinstance(data, list):
        return None
    found = [_try(Routine, item) for item in data]
    return [r for r in found if r is not None] if all(r is not None for r in found) else None


def _routine_on_keys(data: Any) -> None:
    """YAML 1.1 (PyYAML) reads the key ``on`` as the boolean true: give routines their ``on`` back.

    Editors and YAML 1.2 readers see the string ``on``, as the card format means.
    """
    routines = data.get("routines") if isinstance(data, dict) else None
    if not isinstance(routines, list):
        return
    for item in routines:
        if isinstance(item, dict) and True in item and "on" not in item:
            item["on"] = item.pop(True)


def _model_at(loc: Sequence[PathPart]) -> type[BaseModel] | None:
    """The card model class found by following field names (list indexes skipped) from the root."""
    current: Any = CompanionCard
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _innermost_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _innermost_model(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin in (list, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if args else annotation
            if origin is list or len(args) == 1:
                continue
        return annotation


def _allowed_keys(loc: Sequence[PathPart]) -> list[str]:
    model = _model_at(loc)
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


_METADATA_FIELDS: Final[dict[str, str]] = {
    "id": "a unique id starting with `companion_`, e.g. companion_juniper",
    "name": "the name others call the companion",
    "personality": "a sentence or two on how the companion thinks and talks",
    "story": "the companion's background",
    "sample": "one line the companion might say, to set its voice",
}


def _field_description(loc: Sequence[PathPart]) -> str:
    if tuple(loc[:-1]) == ("metadata",) and isinstance(loc[-1], str):
        return _METADATA_FIELDS.get(loc[-1], "")
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str):
        return ""
    field = model.model_fields.get(loc[-1])
    if field is None:
        return ""
    return field.description or ""


_TYPE_FIXES: Final[dict[str, str]] = {
    "string_type": "write a string (quote it if YAML would read it as a number, date or boolean)",
    "list_type": "write a list: one `- item` per line, or `[a, b]`",
    "dict_type": "write a mapping of `key: value` lines",
    "model_type": "write a mapping of `key: value` lines",
    "model_attributes_type": "write a mapping of `key: value` lines",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "float_type": "write a number",
    "float_parsing": "write a number",
    "bool_type": "write true or false",
    "bool_parsing": "write true or false",
    "string_too_short": "write some text here; it must not be empty",
    "too_short": "add at least one entry",
    "literal_error": "use one of the values the message lists",
}


def _fix_for_type(kind: str, error: Mapping[str, Any]) -> str:
    if kind in _TYPE_FIXES:
        return _TYPE_FIXES[kind]
    ctx = error.get("ctx") or {}
    bounds = {"ge": "at least", "le": "at most", "gt": "more than", "lt": "less than"}
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return "use a value " + " and ".join(f"{bounds.get(k, k)} {v}" for k, v in ctx.items())
    return "correct the value as the message says"
