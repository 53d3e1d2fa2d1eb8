"""CEL trigger conditions: type-checked and compiled once when a card loads, evaluated every turn.

The card's ``events.params`` JSON Schema declares the CEL environment. Every top-level property
becomes a CEL variable of the matching type, so expressions read like aikyo's (``emotion == "joy"``):

=================  ==========================================
JSON Schema type   CEL type
=================  ==========================================
string             ``string`` (``enum`` too)
integer            ``int``
number             ``double``
boolean            ``bool``
array              ``list(T)`` with ``T`` from ``items`` (``dyn`` without)
object             ``map(string, dyn)`` (nested fields are not type-checked)
anything else      ``dyn``
=================  ==========================================

A variable ``params`` (``map(string, dyn)``) holds the whole object, so an optional property can be
tested with ``has(params.x)`` — unless the schema declares its own ``params`` property, which wins.
A property the model left out (or gave as ``null``, or with a value of the wrong JSON type) is
unbound: a condition that reads it evaluates to an error, and an error never counts as true.

Google's checker keeps ``int`` and ``double`` apart (``score > 5`` with a ``number`` parameter is a
load error: write ``5.0``); values the model sends as ``7.0`` for an ``integer`` are turned into
``7`` (and ``7`` for a ``number`` into ``7.0``) before evaluation, so each variable always holds
its declared type.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from cel_expr_python import cel
from cel_expr_python.ext import ext_math, ext_strings

from companion.log import log_event

__all__ = [
    "PARAMS_VARIABLE",
    "CompiledTriggers",
    "ConditionOutcome",
    "ParamType",
    "ToolInstruction",
    "TriggerCondition",
    "TriggerError",
    "TriggerProblem",
    "cel_env",
    "compile_cel",
    "compile_triggers",
    "eval_bool",
    "reads_no_parameter",
]

logger = logging.getLogger(__name__)

PARAMS_VARIABLE: Final = "params"
"""The CEL variable holding the whole parameter object (for ``has(params.x)``)."""

ParamKind: TypeAlias = Literal["string", "integer", "number", "boolean", "array", "object", "any"]
PathPart: TypeAlias = str | int

_JSON_TYPES: Final = ("string", "integer", "number", "boolean", "array", "object", "null")
_SCALARS: Final[dict[str, ParamKind]] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CEL_RESERVED: Final = frozenset(
    {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function"}
    | {"if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}
)
_CEL_ISSUE: Final = re.compile(r"ERROR: <input>:(?P<line>\d+):(?P<column>\d+): (?P<message>[^\n]*)")
_SYNTAX_REWRITES: Final = (
    (re.compile(r"mismatched input '<EOF>' expecting .*"), "the expression ends too early"),
    (
        re.compile(r"(?:mismatched|extraneous) input '(.*?)' expecting <EOF>"),
        r"unexpected '\1' after a complete expression",
    ),
    (re.compile(r"(?:mismatched|extraneous) input '(.*?)' expecting .*"), r"unexpected '\1'"),
    (re.compile(r"token recognition error at: '(.*)'"), r"unrecognised text '\1'"),
)


@dataclass(frozen=True, slots=True)
class ParamType:
    """The declared type of one parameter, as much of it as CEL and normalisation need."""

    kind: ParamKind
    items: ParamType | None = None
    properties: Mapping[str, ParamType] = field(default_factory=dict)

    def cel_type(self) -> cel.Type:
        match self.kind:
            case "string":
                return cel.Type.STRING
            case "integer":
                return cel.Type.INT
            case "number":
                return cel.Type.DOUBLE
            case "boolean":
                return cel.Type.BOOL
            case "array":
                return cel.Type.List(self.items.cel_type() if self.items else cel.Type.DYN)
            case "object":
                return cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
            case _:
                return cel.Type.DYN

    def fits(self, value: Any) -> bool:
        """Whether a JSON value has this type's JSON shape (``bool`` is not a number here)."""
        match self.kind:
            case "string":
                return isinstance(value, str)
            case "integer":
                return isinstance(value, int) and not isinstance(value, bool)
            case "number":
                return isinstance(value, int | float) and not isinstance(value, bool)
            case "boolean":
                return isinstance(value, bool)
            case "array":
                return isinstance(value, list)
            case "object":
                return isinstance(value, Mapping)
            case _:
                return True

    def normalise(self, value: Any) -> Any:
        """``7.0`` for an integer becomes ``7``, ``7`` for a number ``7.0``; recursively."""
        if self.kind == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        if self.kind == "number" and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if self.kind == "array" and isinstance(value, list):
            return [self.items.normalise(v) for v in value] if self.items else list(value)
        if self.kind == "object" and isinstance(value, Mapping):
            return {
                k: (self.properties[k].normalise(v) if k in self.properties else v) for k, v in value.items()
            }
        return value


@dataclass(frozen=True, slots=True)
class ToolInstruction:
    """What a matching CEL condition asks for: use ``tool`` following ``instruction``."""

    tool: str
    instruction: str


@dataclass(frozen=True, slots=True)
class TriggerCondition:
    """One card condition: a CEL expression and the tool instructions it contributes when true."""

    expression: str
    execute: tuple[ToolInstruction, ...]


@dataclass(frozen=True, slots=True)
class TriggerProblem:
    """Why a params schema or an expression was refused, where, and how to fix it.

    ``path`` is relative to the card's ``events`` section, e.g. ``("conditions", 2, "expression")``.
    ``excerpt`` holds the offending expression line and a caret under the column, for CEL errors.
    """

    path: tuple[PathPart, ...]
    message: str
    fix: str
    excerpt: str = ""
    line: int | None = None
    column: int | None = None


class TriggerError(ValueError):
    """The params schema or some conditions cannot be compiled; ``problems`` lists every one."""

    def __init__(self, problems: Sequence[TriggerProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(p.message for p in self.problems))


@dataclass(frozen=True, slots=True)
class ConditionOutcome:
    """What one condition did for one set of values: matched, did not, or failed with ``error``."""

    index: int
    expression: str
    matched: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Compiled:
    condition: TriggerCondition
    program: cel.Expression


class CompiledTriggers:
    """A card's conditions, compiled against its params schema; evaluate them with model output."""

    def __init__(
        self,
        env: cel.Env,
        variables: Mapping[str, ParamType],
        compiled: Sequence[_Compiled],
        whole_object: bool,
        reading: Sequence[str] = (),
    ) -> None:
        self._env = env
        self._variables = dict(variables)
        self._compiled = tuple(compiled)
        self._whole_object = whole_object
        self.reading = tuple(reading)
        """The expressions of the conditions that read a parameter (or may: see
        :func:`reads_no_parameter`), in card order."""

    @property
    def variables(self) -> Mapping[str, ParamType]:
        """The declared top-level parameters (not counting the whole-object ``params``)."""
        return self._variables

    @property
    def conditions(self) -> tuple[TriggerCondition, ...]:
        return tuple(c.condition for c in self._compiled)

    @property
    def reads_params(self) -> bool:
        """Whether any condition reads a parameter. When none does, the parameters cannot change
        which instructions are chosen, so nobody needs to ask a model for them."""
        return bool(self.reading)

    def __len__(self) -> int:
        return len(self._compiled)

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The CEL variables for ``values``: normalised, with absent, null or ill-typed ones left unbound.

        ``params`` holds the same values, plus any keys the schema does not declare.
        """
        bound: dict[str, Any] = {}
        for name, declared in self._variables.items():
            if name not in values or values[name] is None:
                continue
            value = declared.normalise(values[name])
            if not declared.fits(value):
                log_event(
                    logger,
                    "trigger_param_type_mismatch",
                    logging.WARNING,
                    param=name,
                    expected=declared.kind,
                    got=type(value).__name__,
                )
                continue
            bound[name] = value
        if self._whole_object:
            # The same view as the variables: declared values as bound, extra keys as given.
            extra = {k: v for k, v in values.items() if k not in self._variables and v is not None}
            bound[PARAMS_VARIABLE] = {**extra, **bound}
        return bound

    def explain(self, values: Mapping[str, Any]) -> list[ConditionOutcome]:
        """Evaluate every condition in card order and say what each one did."""
        activation = self._env.Activation(self.bind(values))
        outcomes: list[ConditionOutcome] = []
        for index, item in enumerate(self._compiled):
            expression = item.condition.expression
            matched, error = eval_bool(item.program, activation)
            if error is not None:
                log_event(
                    logger,
                    "trigger_condition_error",
                    logging.WARNING,
                    index=index,
                    expression=expression,
                    error=error,
                )
            outcomes.append(ConditionOutcome(index, expression, matched, error))
        return outcomes

    def evaluate(self, values: Mapping[str, Any]) -> list[ToolInstruction]:
        """Instructions of every matching condition, in card order; the first one per tool wins."""
        chosen: dict[str, ToolInstruction] = {}
        for outcome in self.explain(values):
            if outcome.matched:
                for instruction in self._compiled[outcome.index].condition.execute:
                    chosen.setdefault(instruction.tool, instruction)
        return list(chosen.values())


def compile_triggers(
    params_schema: Mapping[str, Any], conditions: Sequence[TriggerCondition]
) -> CompiledTriggers:
    """Type-check and compile every condition; raise :class:`TriggerError` listing all problems."""
    variables, problems = declare_params(params_schema)
    whole_object = PARAMS_VARIABLE not in variables
    declarations = {name: t.cel_type() for name, t in variables.items()}
    if whole_object:
        declarations[PARAMS_VARIABLE] = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    env = cel_env(declarations)
    compiled: list[_Compiled] = []
    bare = cel_env({})
    for index, condition in enumerate(conditions):
        path: tuple[PathPart, ...] = ("conditions", index, "expression")
        program, found = compile_cel(env, condition.expression, path, list(variables), condition=True)
        problems.extend(found)
        if program is not None:
            compiled.append(_Compiled(condition, program))
    if problems:
        raise TriggerError(problems)
    expressions = [c.condition.expression for c in compiled]
    reading = [e for e in expressions if not reads_no_parameter(bare, e)]
    return CompiledTriggers(env, variables, compiled, whole_object, reading)


def reads_no_parameter(bare: cel.Env, expression: str) -> bool:
    """Whether ``expression`` surely reads no parameter: it type-checks in ``bare``, an
    environment that declares none (the checker then resolved every identifier it reads to
    something else: a literal, a function, a comprehension's own variable). cel-expr-python
    names no references of a compiled expression; a failure for any reason counts as reading
    one, so when unsure the model is asked as before."""
    try:
        bare.compile(expression)
    except RuntimeError:
        return False
    return True


def cel_env(declarations: Mapping[str, cel.Type]) -> cel.Env:
    """A CEL environment with these typed variables, the standard library and the strings and
    math extensions (the one vocabulary every CEL expression of a card gets)."""
    return cel.NewEnv(variables=dict(declarations), extensions=[ext_strings.ExtStrings(), ext_math.ExtMath()])


def compile_cel(
    env: cel.Env,
    expression: str,
    path: tuple[PathPart, ...],
    declared: Sequence[str],
    *,
    vocabulary: str | None = None,
    condition: bool = False,
) -> tuple[cel.Expression | None, list[TriggerProblem]]:
    """Type-check and compile one expression: the program, or the problems (each with a caret).
    A ``condition`` must be a bool (or ``dyn``).

    ``declared`` names the variables for "did you mean" hints; ``vocabulary`` says where they
    come from when it is not ``events.params`` (e.g. "a routine's guard").
    """
    if not expression.strip():
        what = "condition" if condition else "expression"
        return None, [TriggerProblem(path, "the expression is empty", f"write a CEL {what}, e.g. `true`")]
    try:
        program = env.compile(expression)
    except RuntimeError as exc:
        return None, _compile_problems(path, expression, str(exc), list(declared), vocabulary)
    returns = program.return_type()
    if condition and returns != cel.Type.BOOL and returns != cel.Type.DYN:
        return None, [
            TriggerProblem(
                path,
                f"the expression has type {returns.name().lower()}, but a condition must be a bool",
                'compare the value to something, e.g. `x > 0`, `x == "joy"` or `size(x) > 0`',
            )
        ]
    return program, []


def eval_bool(program: cel.Expression, activation: Any) -> tuple[bool, str | None]:
    """Evaluate a condition: ``(matched, error)``. An error (or a non-bool) never counts as true."""
    # Bad input (wrong types, out-of-range integers) comes back as an error value.
    result = program.eval(activation)
    if result.type() == cel.Type.BOOL:
        return result.value() is True, None
    if result.type() == cel.Type.ERROR:
        return False, str(result.value())
    return False, f"the expression produced a {result.type().name()}, not a bool"


def declare_params(schema: Mapping[str, Any]) -> tuple[dict[str, ParamType], list[TriggerProblem]]:
    """The top-level parameters an ``events.params`` object schema declares, and what is wrong with it."""
    problems: list[TriggerProblem] = []
    object_fix = "make events.params a JSON Schema object: `type: object` with a `properties` mapping"
    if not isinstance(schema, Mapping):
        return {}, [TriggerProblem(("params",), "params is not a mapping", object_fix)]
    if schema.get("type") != "object":
        problems.append(
            TriggerProblem(
                ("params", "type"),
                f"params must be an object schema, but its type is {schema.get('type')!r}",
                object_fix,
            )
        )
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        problems.append(TriggerProblem(("params", "properties"), "properties is not a mapping", object_fix))
        return {}, problems
    variables: dict[str, ParamType] = {}
    for name, sub in properties.items():
        path: tuple[PathPart, ...] = ("params", "properties", str(name))
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or name in _CEL_RESERVED:
            problems.append(
                TriggerProblem(
                    path,
                    f"{name!r} cannot be a CEL variable name",
                    "use letters, digits and underscores, starting with a letter "
                    "(and not a CEL keyword such as `in` or `null`)",
                )
            )
            continue
        declared, sub_problems = _param_type(sub, path)
        problems.extend(sub_problems)
        variables[name] = declared
    required = schema.get("required", [])
    if isinstance(required, list):
        for i, name in enumerate(required):
            if name not in properties:
                problems.append(
                    TriggerProblem(
                        ("params", "required", i),
                        f"{name!r} is required but not declared under properties",
                        f"declare {name!r} under events.params.properties, or remove it from required",
                    )
                )
    else:
        problems.append(
            TriggerProblem(("params", "required"), "required is not a list", "write `required: [name, ...]`")
        )
    return variables, problems


def _param_type(schema: Any, path: tuple[PathPart, ...]) -> tuple[ParamType, list[TriggerProblem]]:
    if not isinstance(schema, Mapping):
        return ParamType("any"), [
            TriggerProblem(path, "a parameter must be a JSON Schema mapping", "write e.g. `type: string`")
        ]
    raw = schema.get("type")
    names = raw if isinstance(raw, list) else [raw] if raw is not None else []
    unknown = [n for n in names if n not in _JSON_TYPES]
    if unknown:
        return ParamType("any"), [
            TriggerProblem(
                (*path, "type"),
                f"unknown JSON Schema type {unknown[0]!r}",
                "use one of " + ", ".join(_JSON_TYPES),
            )
        ]
    concrete = [n for n in names if n != "null"]
    if not concrete:
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return ParamType("string"), []
        return ParamType("any"), []
    if len(concrete) > 1:
        return ParamType("any"), []
    kind = concrete[0]
    if kind == "array":
        items = schema.get("items")
        if items is None:
            return ParamType("array"), []
        item_type, problems = _param_type(items, (*path, "items"))
        return ParamType("array", items=item_type), problems
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(props, Mapping):
            return ParamType("object"), [
                TriggerProblem((*path, "properties"), "properties is not a mapping", "write a mapping")
            ]
        nested: dict[str, ParamType] = {}
        problems = []
        for name, sub in props.items():
            nested[str(name)], sub_problems = _param_type(sub, (*path, "properties", str(name)))
            problems.extend(sub_problems)
        return ParamType("object", properties=nested), problems
    return ParamType(_SCALARS[kind]), []


def _compile_problems(
    path: tuple[PathPart, ...], expression: str, text: str, declared: list[str], vocabulary: str | None
) -> list[TriggerProblem]:
    """Turn the checker's status text into one problem per reported issue, with a caret excerpt."""
    problems: list[TriggerProblem] = []
    lines = expression.splitlines() or [""]
    for m in _CEL_ISSUE.finditer(text):
        line, column = int(m["line"]), int(m["column"])
        message = _readable(m["message"].removesuffix(" [INVALID_ARGUMENT]"))
        # An error at the very end may sit on an empty last line: show the end of the text instead.
        while line > 1 and (line > len(lines) or not lines[line - 1].strip()) and column == 1:
            line -= 1
            column = len(lines[line - 1]) + 1 if line <= len(lines) else 1
        source = lines[line - 1] if line <= len(lines) else ""
        problems.append(
            TriggerProblem(
                path,
                f"CEL {line}:{column}: {message}",
                _fix_for(message, declared, vocabulary),
                excerpt=f"{source}\n{' ' * (column - 1)}^",
                line=line,
                column=column,
            )
        )
    if not problems:
        problems.append(TriggerProblem(path, f"CEL: {text}", "check the expression against the CEL syntax"))
    return problems


def _readable(message: str) -> str:
    """The checker's message without the container note and the parser's long token lists."""
    message = message.removesuffix(" (in container '')")
    overload = re.fullmatch(r"found no matching overload for '_(.+)_' applied to '\((.*)\)'", message)
    if overload:
        return f"'{overload[1]}' cannot be applied to ({overload[2]})"
    prefix = "Syntax error: "
    if message.startswith(prefix):
        detail = message[len(prefix) :]
        for pattern, replacement in _SYNTAX_REWRITES:
            if pattern.fullmatch(detail):
                return prefix + pattern.sub(replacement, detail)
    return message


def _fix_for(message: str, declared: list[str], vocabulary: str | None = None) -> str:
    undeclared = re.match(r"undeclared reference to '([^']*)'", message)
    if undeclared:
        name = undeclared[1]
        close = difflib.get_close_matches(name, declared, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        names = ", ".join(sorted(declared)) or "(none declared yet)"
        if vocabulary is not None:
            return f"{hint}{name!r} is not a variable of {vocabulary}; use one of: {names}"
        return f"{hint}declare {name!r} under events.params.properties, or use a declared parameter: {names}"
    if message.startswith("Syntax error"):
        if "unrecognised text '=" in message:
            return "compare with `==` (a single `=` is not CEL)"
        if "unrecognised text '\"" in message or "unrecognised text ''" in message:
            return "close the string with the same quote it was opened with"
        if "missing ')'" in message:
            return "close the parenthesis opened earlier in the expression"
        if "ends too early" in message:
            return (
                "complete the expression: close every parenthesis and give each `&&`, `||` "
                "or operator a right side"
            )
        return "fix the CEL syntax at the caret (strings in quotes, `&&`/`||`, balanced parentheses)"
    overload = re.search(r"cannot be applied to \((.*)\)|applied to '\((.*)\)'", message)
    if overload:
        args = overload[1] or overload[2] or ""
        if "int" in args and "double" in args:
            return (
                "CEL keeps int and double apart: compare an integer parameter with 7 and a number "
                "with 7.0, or convert with double(x) / int(x)"
            )
        return f"the operand types ({args}) do not fit together; compare values of the same type"
    return "check the expression against the parameter types declared in events.params"
