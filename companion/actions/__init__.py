"""Companion actions and knowledge tools, and the runtime that runs them.

Declare a tool with :func:`action` or :func:`knowledge`; name it in a card; the engine runs it
through :class:`ActionRuntime`, which validates, enforces deadlines and settles every call once
with a :class:`ToolResult`. See ``docs/actions.md``.
"""

from typing import TYPE_CHECKING

from companion.actions.approval import APPROVAL_QUERY
from companion.actions.catalog import TOOLS_ACTION, ToolInfo, ToolsChanged, tools_action, tools_json
from companion.actions.context import ActionContext
from companion.actions.definition import (
    DEFAULT_TIMEOUT,
    ActionDef,
    KnowledgeDef,
    PublishOutput,
    ToolSpec,
    action,
    knowledge,
    validate_input,
)
from companion.actions.progress import PROGRESS_ACTION
from companion.actions.registry import BUILTINS, ToolNotFound, resolve_tool
from companion.actions.results import (
    ActionRefused,
    ErrorCode,
    InputIssue,
    QueryTimeout,
    ToolResult,
    ToolStatus,
)
from companion.lazy import lazy_exports

if TYPE_CHECKING:
    from companion.actions.runtime import (
        MAX_CALL_DEPTH,
        MAX_NOTE_CHARS,
        MAX_NOTES,
        ActionRuntime,
        ToolDef,
        ToolsListener,
    )
    from companion.store.kv import KeyValueStore, Namespace, StoreLimitExceeded, StoreLimits

# The runtime and the store run on trio; card loading, the models' vocabulary and the demo's
# transcript import this package for definitions only, so those two load on first use.
_LAZY = {
    **dict.fromkeys(
        ("KeyValueStore", "Namespace", "StoreLimitExceeded", "StoreLimits"), "companion.store.kv"
    ),
    **dict.fromkeys(
        ("MAX_CALL_DEPTH", "MAX_NOTE_CHARS", "MAX_NOTES", "ActionRuntime", "ToolDef", "ToolsListener"),
        "companion.actions.runtime",
    ),
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "APPROVAL_QUERY",
    "BUILTINS",
    "DEFAULT_TIMEOUT",
    "MAX_CALL_DEPTH",
    "MAX_NOTES",
    "MAX_NOTE_CHARS",
    "PROGRESS_ACTION",
    "TOOLS_ACTION",
    "ActionContext",
    "ActionDef",
    "ActionRefused",
    "ActionRuntime",
    "ErrorCode",
    "InputIssue",
    "KeyValueStore",
    "KnowledgeDef",
    "Namespace",
    "PublishOutput",
    "QueryTimeout",
    "StoreLimitExceeded",
    "StoreLimits",
    "ToolDef",
    "ToolInfo",
    "ToolNotFound",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "ToolsChanged",
    "ToolsListener",
    "action",
    "knowledge",
    "resolve_tool",
    "tools_action",
    "tools_json",
    "validate_input",
]
