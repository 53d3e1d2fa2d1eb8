"""Approval before an action runs: what clients are asked and how their answer is read.

The question is an ``approval`` query whose body describes the call using only its validated
input (never the conversation), so people approve exactly what will run. Only an explicit
``{"approved": true}`` in a successful result approves; anything else is a denial with a reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from companion.actions.definition import ActionDef
from companion.protocol import APPROVAL_QUERY, QueryResult

__all__ = ["APPROVAL_QUERY", "DEFAULT_APPROVAL_TIMEOUT", "ApprovalDecision", "approval_body", "read_approval"]

DEFAULT_APPROVAL_TIMEOUT: Final = 120.0
"""Seconds to wait for a person; separate from (and before) the action's own timeout."""
MAX_PREVIEW_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    approved: bool
    reason: str


def preview_text(defn: ActionDef, value: BaseModel) -> str:
    """One line saying what the call will do: the action's own preview, or its id and input."""
    if defn.preview is not None:
        text = defn.preview(value)
    else:
        args = json.dumps(value.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)
        text = f"{defn.id} {args}"
    return text if len(text) <= MAX_PREVIEW_CHARS else text[: MAX_PREVIEW_CHARS - 1] + "…"


def approval_body(defn: ActionDef, value: BaseModel, call_id: str) -> dict[str, Any]:
    """The ``body`` of the approval query."""
    return {
        "call_id": call_id,
        "action": defn.id,
        "description": defn.description,
        "side_effects": defn.side_effects,
        "input": value.model_dump(mode="json"),
        "preview": preview_text(defn, value),
    }


def read_approval(result: QueryResult) -> ApprovalDecision:
    """Approved only on ``result.success`` with ``body.approved is true``; otherwise why not."""
    if result.error is not None:
        return ApprovalDecision(False, f"the client answered with an error: {result.error}")
    if result.result is None:
        return ApprovalDecision(False, "the client's answer carried no result")
    body = result.result.body
    reason = body.get("reason")
    why = f": {reason}" if isinstance(reason, str) and reason else ""
    if result.result.success and body.get("approved") is True:
        return ApprovalDecision(True, "approved" + why)
    return ApprovalDecision(False, "denied" + why)
