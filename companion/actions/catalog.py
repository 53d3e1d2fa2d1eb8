"""The list of tools a companion offers, the event announcing a change to it, and its wire shape.

:class:`~companion.actions.ActionRuntime` raises a :class:`ToolsChanged` after every change to
its tool table, carrying the full list (as Tesseron's ``actions/list_changed`` does), so whoever
relays it never has to ask for the list. :func:`tools_action` is the suggested wire form: an
``action.send`` named ``companion.tools`` on topic ``actions``, which aikyo companions do not
subscribe to and aikyo's clients treat like any other action they do not know. The companion's
metadata over ``/aikyo/metadata/1.0.0`` stays exactly ``{id, name, personality, story, sample}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from companion.actions.definition import ActionDef, KnowledgeDef
from companion.protocol import Action

__all__ = [
    "MAX_ANNOUNCED_TOOLS",
    "TOOLS_ACTION",
    "ToolChange",
    "ToolInfo",
    "ToolsChanged",
    "tool_info",
    "tools_action",
    "tools_json",
]

TOOLS_ACTION: Final = "companion.tools"
MAX_ANNOUNCED_TOOLS: Final = 64
"""An announcement lists at most this many tools (and says when it left some out)."""
MAX_ANNOUNCED_DESCRIPTION: Final = 300
"""Descriptions are cut to this many characters in an announcement, to bound its size."""

ToolChange: TypeAlias = Literal["registered", "replaced", "removed"]


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What others may know of one tool: enough to show it, not to call it."""

    id: str
    description: str
    kind: Literal["action", "knowledge"]


@dataclass(frozen=True, slots=True)
class ToolsChanged:
    """One change to a companion's tool table, with the list as it is after the change."""

    revision: int
    """Counts changes from 1; a gap tells a listener it missed one (the list is still whole)."""
    change: ToolChange
    tool_id: str
    tools: tuple[ToolInfo, ...]


def tool_info(defn: ActionDef | KnowledgeDef) -> ToolInfo:
    return ToolInfo(defn.id, defn.description, defn.kind)


def tools_json(tools: Sequence[ToolInfo], revision: int) -> dict[str, Any]:
    """The list as JSON for a companion's metadata extension: ``{revision, tools, truncated?}``."""
    shown = tools[:MAX_ANNOUNCED_TOOLS]
    out: dict[str, Any] = {
        "revision": revision,
        "tools": [
            {"id": t.id, "description": t.description[:MAX_ANNOUNCED_DESCRIPTION], "kind": t.kind}
            for t in shown
        ],
    }
    if len(tools) > len(shown):
        out["truncated"] = True
    return out


def tools_action(sender: str, event: ToolsChanged) -> Action:
    """The suggested announcement: ``action.send`` named ``companion.tools`` on ``actions``.

    ``params`` is :func:`tools_json` plus ``change: {kind, tool}``; at most 64 tools of at most
    300 description characters each keep it well inside one gossip message.
    """
    params = tools_json(event.tools, event.revision)
    params["change"] = {"kind": event.change, "tool": event.tool_id}
    return Action.create(sender, TOOLS_ACTION, params)
