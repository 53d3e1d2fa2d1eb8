"""Finding a tool from the reference a card names: a built-in name or ``package.module:attribute``."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from types import MappingProxyType

from companion.actions.builtins import companions, speak, speak_with_voice
from companion.actions.definition import ActionDef, KnowledgeDef

__all__ = ["BUILTINS", "ToolNotFound", "resolve_tool"]

BUILTINS: Mapping[str, ActionDef | KnowledgeDef] = MappingProxyType(
    {tool.id: tool for tool in (speak, speak_with_voice, companions)}
)


class ToolNotFound(LookupError):
    """A card names a tool that does not exist or cannot be imported."""

    def __init__(self, ref: str, reason: str, missing_module: str | None = None) -> None:
        builtins = ", ".join(BUILTINS)
        super().__init__(
            f"tool {ref!r}: {reason}. Built-in tools: {builtins}; a custom tool is named "
            "'package.module:attribute' (an @action or @knowledge object)"
        )
        self.ref = ref
        self.reason = reason
        self.missing_module = missing_module
        """The module Python did not find while importing ``ref``'s module: that module itself (or
        a package above it: make it importable), or one it imports (install that)."""


def resolve_tool(ref: str) -> ActionDef | KnowledgeDef:
    """The definition ``ref`` names; :class:`ToolNotFound` (with the reason) if there is none."""
    ref = ref.strip()
    if ":" not in ref:
        if ref in BUILTINS:
            return BUILTINS[ref]
        close = difflib.get_close_matches(ref, list(BUILTINS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ToolNotFound(ref, f"no built-in tool has this name{hint}")
    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ToolNotFound(ref, "expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        reason = f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        raise ToolNotFound(ref, reason, exc.name) from exc
    except Exception as exc:  # an import runs arbitrary code; any failure is a reason to report
        raise ToolNotFound(ref, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ToolNotFound(ref, f"{module_name!r} has no attribute {attribute!r}") from exc
    if not isinstance(target, ActionDef | KnowledgeDef):
        raise ToolNotFound(
            ref,
            f"it is a {type(target).__name__}, not a tool; declare it with @action or @knowledge",
        )
    return target
