"""How a tool call ends: one typed result with a status and, on failure, a stable JSON-RPC code.

Every caller (the model, a test, the command line) gets a :class:`ToolResult`; the model gets
:meth:`ToolResult.for_model`, a small JSON object it can act on (fix its input, retry, give up).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal, TypeAlias

from companion.protocol import Action, Message

__all__ = [
    "ActionRefused",
    "ErrorCode",
    "InputIssue",
    "QueryTimeout",
    "ToolResult",
    "ToolStatus",
    "published_summary",
]


class ErrorCode(IntEnum):
    """Stable failure codes (JSON-RPC server-error range; -32603 is JSON-RPC's internal error)."""

    CANCELLED = -32001
    TIMEOUT = -32002
    NOT_FOUND = -32003
    INVALID_INPUT = -32004
    REFUSED = -32005
    CALL_CYCLE = -32006
    """A nested :meth:`~companion.actions.ActionContext.call` named a tool already running in its chain."""
    CALL_TOO_DEEP = -32007
    """A nested call would go deeper than :data:`~companion.actions.MAX_CALL_DEPTH`."""
    STORE_LIMIT = -32008
    """A :attr:`~companion.actions.ActionContext.store` write went past a size limit (uncaught)."""
    INTERNAL = -32603


ToolStatus: TypeAlias = Literal[
    "ok",
    "invalid_input",
    "refused",
    "timeout",
    "cancelled",
    "not_found",
    "call_cycle",
    "call_too_deep",
    "store_limit",
    "internal_error",
]

_CODES: dict[ToolStatus, ErrorCode] = {
    "invalid_input": ErrorCode.INVALID_INPUT,
    "refused": ErrorCode.REFUSED,
    "timeout": ErrorCode.TIMEOUT,
    "cancelled": ErrorCode.CANCELLED,
    "not_found": ErrorCode.NOT_FOUND,
    "call_cycle": ErrorCode.CALL_CYCLE,
    "call_too_deep": ErrorCode.CALL_TOO_DEEP,
    "store_limit": ErrorCode.STORE_LIMIT,
    "internal_error": ErrorCode.INTERNAL,
}


class ActionRefused(Exception):
    """Raised by a handler to refuse the call for a reason the model can read and act on.

    The call ends with status ``refused`` (-32005) and the message goes to the model verbatim,
    so write it for the model: what was wrong and what would work instead.
    """


class QueryTimeout(TimeoutError):
    """No client answered a query before its deadline. Uncaught, it ends the call as ``timeout``."""

    def __init__(self, query_type: str, timeout: float) -> None:
        super().__init__(f"no client answered the {query_type!r} query within {timeout:g} s")
        self.query_type = query_type
        self.timeout = timeout


@dataclass(frozen=True, slots=True)
class InputIssue:
    """One problem with a tool's input: where in the input (``loc``) and what is wrong."""

    loc: tuple[str | int, ...]
    message: str

    @property
    def path(self) -> str:
        """Dotted path into the input (``to.0``); ``(root)`` for the input as a whole."""
        return ".".join(str(part) for part in self.loc) or "(root)"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The one way a tool call ends. ``output`` is set when ``status == "ok"``."""

    tool_id: str
    call_id: str
    status: ToolStatus
    message: str = ""
    """On failure, what the model (or person) is told; on success, empty."""
    output: Any = None
    """JSON-ready output: a knowledge tool's value, or an action's summary of what it published."""
    issues: tuple[InputIssue, ...] = ()
    published: tuple[Message | Action, ...] = ()
    """What an action published (in order)."""
    notes: tuple[str, ...] = ()
    """What the handler told the model with :meth:`~companion.actions.ActionContext.note`.

    Notes go to the model's next step only: never published, never recorded as anyone's words.
    """

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def code(self) -> ErrorCode | None:
        """The stable failure code, or ``None`` on success."""
        return None if self.status == "ok" else _CODES[self.status]

    def for_model(self) -> dict[str, Any]:
        """The JSON object a model sees as the tool's answer (with ``notes`` when there are any)."""
        out: dict[str, Any]
        if self.status == "ok":
            out = {"status": "ok", "output": self.output}
        else:
            out = {"status": self.status, "code": int(_CODES[self.status]), "message": self.message}
            if self.issues:
                out["issues"] = [{"path": issue.path, "message": issue.message} for issue in self.issues]
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def for_caller(self) -> dict[str, Any]:
        """The whole typed result as JSON, for a person or a program that called the tool
        directly (``companion action run``, the bridge's ``POST /actions/TOOL``).

        ``{tool, call_id, status, output | code + message, issues?, notes?, published}``; the
        notes are the caller's to read (it made the call), and ``published`` summarises every
        envelope that went out, a failed call's included.
        """
        out: dict[str, Any] = {"tool": self.tool_id, "call_id": self.call_id, "status": self.status}
        if self.status == "ok":
            out["output"] = self.output
        else:
            out["code"] = int(_CODES[self.status])
            out["message"] = self.message
        if self.issues:
            out["issues"] = [{"path": issue.path, "message": issue.message} for issue in self.issues]
        if self.notes:
            out["notes"] = list(self.notes)
        out["published"] = [published_summary(e) for e in self.published]
        return out


def published_summary(envelope: Message | Action) -> dict[str, Any]:
    """What one published envelope was, in a line: its topic and id or name."""
    if isinstance(envelope, Message):
        return {"topic": "messages", "id": envelope.params.id, "to": list(envelope.params.to)}
    return {"topic": "actions", "name": envelope.params.name}
