"""companion: a Python node for a peer-to-peer network of AI companions (aikyo-compatible).

The front door: what card and action authors use, importable from ``companion`` itself::

    from companion import ActionContext, Message, action

    @action(name="wave", description="Wave at someone.")
    async def wave(ctx: ActionContext[WaveInput]) -> Message: ...

Everything else stays importable by its path (``companion.node``, ``companion.bridge``, ...);
``docs/architecture.md`` is the map. Test doubles (the in-memory hub, the offline model) are in
:mod:`companion.testing`. The names load on first use, so ``import companion.protocol`` stays as
cheap as the module itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.3.0.dev0"

from companion.lazy import lazy_exports

if TYPE_CHECKING:
    from companion.actions.context import ActionContext
    from companion.actions.definition import action, knowledge
    from companion.actions.results import ActionRefused, ToolResult
    from companion.card.model import CardError, CompanionCard, LoadedCard, load_card
    from companion.protocol import Action, Message, Metadata, Query, QueryResult, State, parse_payload

_LAZY = {
    "ActionContext": "companion.actions.context",
    "action": "companion.actions.definition",
    "knowledge": "companion.actions.definition",
    "ActionRefused": "companion.actions.results",
    "ToolResult": "companion.actions.results",
    **dict.fromkeys(("CardError", "CompanionCard", "LoadedCard", "load_card"), "companion.card.model"),
    **dict.fromkeys(
        ("Action", "Message", "Metadata", "Query", "QueryResult", "State", "parse_payload"),
        "companion.protocol",
    ),
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "Action",
    "ActionContext",
    "ActionRefused",
    "CardError",
    "CompanionCard",
    "LoadedCard",
    "Message",
    "Metadata",
    "Query",
    "QueryResult",
    "State",
    "ToolResult",
    "__version__",
    "action",
    "knowledge",
    "load_card",
    "parse_payload",
]
