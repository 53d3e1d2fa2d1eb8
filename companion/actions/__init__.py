"""Companion actions and knowledge tools, and the runtime that runs them.

Declare a tool with :func:`action` or :func:`knowledge`; name it in a card; the engine runs it
through :class:`ActionRuntime`, which validates, enforces deadlines and settles every call once
with a :class:`ToolResult`. See ``docs/actions.md``.
"""

from .approval import APPROVAL_QUERY
from .context import ActionContext
from .definition import (
    DEFAULT_TIMEOUT,
    ActionDef,
    KnowledgeDef,
    PublishOutput,
    ToolSpec,
    action,
    knowledge,
    validate_input,
)
from .progress import PROGRESS_ACTION
from .registry import BUILTINS, ToolNotFound, resolve_tool
from .results import ActionRefused, ErrorCode, InputIssue, QueryTimeout, ToolResult, ToolStatus
from .runtime import ActionRuntime, ToolDef

__all__ = [
    "APPROVAL_QUERY",
    "BUILTINS",
    "DEFAULT_TIMEOUT",
    "PROGRESS_ACTION",
    "ActionContext",
    "ActionDef",
    "ActionRefused",
    "ActionRuntime",
    "ErrorCode",
    "InputIssue",
    "KnowledgeDef",
    "PublishOutput",
    "QueryTimeout",
    "ToolDef",
    "ToolNotFound",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "action",
    "knowledge",
    "resolve_tool",
    "validate_input",
]
