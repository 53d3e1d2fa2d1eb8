"""Declaring tools: ``@action`` and ``@knowledge`` turn one small typed function into a tool.

A definition is a frozen value: its id, what the model reads, the pydantic model of its input
(from which the model-facing JSON Schema comes) and its limits. Definitions do nothing on their
own; :class:`~companion.actions.ActionRuntime` runs them.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from companion.actions.context import ActionContext, InputT
from companion.actions.results import InputIssue
from companion.protocol import ACTIONS, MESSAGES, Action, Message

__all__ = [
    "DEFAULT_TIMEOUT",
    "ActionDef",
    "KnowledgeDef",
    "PublishOutput",
    "ToolSpec",
    "action",
    "knowledge",
    "validate_input",
]

DEFAULT_TIMEOUT: Final = 60.0
MAX_DURATION_FACTOR: Final = 10.0
"""Without an explicit ``max_duration``, progress can stretch a call to this many timeouts."""

_TOOL_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
"""What every model provider accepts as a function name."""

PublishOutput: TypeAlias = (
    Message | Action | Mapping[str, Any] | Sequence[Message | Action | Mapping[str, Any]]
)
"""What an action's ``publish`` returns: one envelope or a list (a dict is validated as one)."""

PublishFn: TypeAlias = Callable[[ActionContext[Any]], PublishOutput | Awaitable[PublishOutput]]
KnowledgeFn: TypeAlias = Callable[[ActionContext[Any]], Any]
PreviewFn: TypeAlias = Callable[[Any], str]

OutT = TypeVar("OutT")


def _check_common(id: str, description: str, input_model: Any, timeout: float) -> None:
    if not _TOOL_ID.match(id):
        raise ValueError(
            f"tool id {id!r} must start with a letter and use only letters, digits, '_' or '-' "
            "(at most 64 characters)"
        )
    if not description.strip():
        raise ValueError(f"tool {id!r} needs a description: it is what the model reads")
    if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
        raise TypeError(f"tool {id!r}: input must be a pydantic BaseModel subclass, got {input_model!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"tool {id!r}: timeout must be a positive number of seconds, got {timeout!r}")


@functools.cache
def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(mode="validation")


def _input_schema(model: type[BaseModel]) -> dict[str, Any]:
    return copy.deepcopy(_schema_of(model))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: id, what it does, and the JSON Schema of its input."""

    id: str
    description: str
    input_schema: Mapping[str, Any]
    kind: Literal["action", "knowledge"] = "action"


@dataclass(frozen=True, slots=True)
class ActionDef:
    """A tool that does something: its ``publish`` returns what the runtime publishes."""

    id: str
    description: str
    topic: Literal["messages", "actions"]
    input_model: type[BaseModel]
    publish: PublishFn = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT
    """Idle deadline in seconds; each progress report restarts it (up to ``max_duration``)."""
    side_effects: Literal["read-only", "write"] = "write"
    requires_approval: bool = False
    max_duration: float | None = None
    """Absolute cap in seconds however much progress is reported (default: 10 x ``timeout``)."""
    preview: PreviewFn | None = field(default=None, repr=False)
    """``input -> text`` shown to people asked for approval; derived only from the input."""
    kind: Literal["action"] = field(default="action", init=False)

    def __post_init__(self) -> None:
        _check_common(self.id, self.description, self.input_model, self.timeout)
        if self.topic not in (MESSAGES, ACTIONS):
            raise ValueError(f"action {self.id!r}: topic must be 'messages' or 'actions', got {self.topic!r}")
        if self.side_effects not in ("read-only", "write"):
            raise ValueError(f"action {self.id!r}: side_effects must be 'read-only' or 'write'")
        if self.max_duration is not None and not (
            self.max_duration >= self.timeout and math.isfinite(self.max_duration)
        ):
            raise ValueError(
                f"action {self.id!r}: max_duration ({self.max_duration!r}) must be at least the timeout"
            )

    @property
    def cap(self) -> float:
        """The absolute limit on one call's running time, in seconds."""
        return self.max_duration if self.max_duration is not None else self.timeout * MAX_DURATION_FACTOR

    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of the input, as the model sees it (a fresh copy)."""
        return _input_schema(self.input_model)


@dataclass(frozen=True, slots=True)
class KnowledgeDef:
    """A read-only tool: its function's return value (checked against ``output``) goes to the model."""

    id: str
    description: str
    input_model: type[BaseModel]
    output: Any
    """The type of the result (a pydantic model, ``str``, ``dict[str, X]``...)."""
    fetch: KnowledgeFn = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT
    kind: Literal["knowledge"] = field(default="knowledge", init=False)
    side_effects: Literal["read-only"] = field(default="read-only", init=False)
    _adapter: TypeAdapter[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_common(self.id, self.description, self.input_model, self.timeout)
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(self.output)
        except Exception as exc:
            raise TypeError(
                f"knowledge {self.id!r}: output {self.output!r} is not a usable type: {exc}"
            ) from exc
        object.__setattr__(self, "_adapter", adapter)

    @property
    def cap(self) -> float:
        return self.timeout * MAX_DURATION_FACTOR

    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of the input, as the model sees it (a fresh copy)."""
        return _input_schema(self.input_model)

    def output_json(self, value: Any) -> Any:
        """Check ``value`` against ``output`` and return it as JSON-ready data.

        Raises ``pydantic.ValidationError`` when the function returned the wrong shape.
        """
        checked = self._adapter.validate_python(value)
        return self._adapter.dump_python(checked, mode="json", by_alias=True)


def action(
    *,
    id: str,
    description: str,
    input: type[InputT],
    topic: Literal["messages", "actions"] = "actions",
    timeout: float = DEFAULT_TIMEOUT,
    side_effects: Literal["read-only", "write"] = "write",
    requires_approval: bool = False,
    max_duration: float | None = None,
    preview: Callable[[InputT], str] | None = None,
) -> Callable[[Callable[[ActionContext[InputT]], PublishOutput | Awaitable[PublishOutput]]], ActionDef]:
    """Declare an action; the decorated function (sync or async) becomes its ``publish``.

    ``publish(ctx)`` returns a Message (topic ``messages``) or an Action (topic ``actions``), or a
    list of them, whose ``from`` is ``ctx.companion_id``. Raise
    :class:`~companion.actions.ActionRefused` to refuse with a reason the model can act on.
    """

    def wrap(fn: Callable[[ActionContext[InputT]], PublishOutput | Awaitable[PublishOutput]]) -> ActionDef:
        return ActionDef(
            id=id,
            description=description,
            topic=topic,
            input_model=input,
            publish=fn,
            timeout=timeout,
            side_effects=side_effects,
            requires_approval=requires_approval,
            max_duration=max_duration,
            preview=preview,
        )

    return wrap


def knowledge(
    *,
    id: str,
    description: str,
    input: type[InputT],
    output: Any,
    timeout: float = DEFAULT_TIMEOUT,
) -> Callable[[Callable[[ActionContext[InputT]], Any]], KnowledgeDef]:
    """Declare a knowledge tool; the decorated function (sync or async) returns its answer."""

    def wrap(fn: Callable[[ActionContext[InputT]], Any]) -> KnowledgeDef:
        return KnowledgeDef(
            id=id, description=description, input_model=input, output=output, fetch=fn, timeout=timeout
        )

    return wrap


def _accepted_keys(model: type[BaseModel]) -> frozenset[str]:
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
        if isinstance(info.validation_alias, str):
            keys.add(info.validation_alias)
    return frozenset(keys)


def validate_input(model: type[InputT], raw: object) -> InputT | tuple[InputIssue, ...]:
    """Validate a tool input: the model instance, or every issue at once (never raises).

    Unknown top-level keys are dropped before validation, whatever the model's own setting.
    """
    if not isinstance(raw, Mapping):
        return (InputIssue((), f"expected a JSON object, got {type(raw).__name__}"),)
    keys = _accepted_keys(model)
    data = {k: v for k, v in raw.items() if k in keys}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return tuple(InputIssue(tuple(item["loc"]), item["msg"]) for item in exc.errors(include_url=False))
