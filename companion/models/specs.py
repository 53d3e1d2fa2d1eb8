"""A model spec's kind (``scripted``, ``openai``, ``anthropic``: the part before the first
colon), read without importing any model: the demo, its spawner and the engines' set-up decide
from it what to import and whether a server must be checked, before anything heavy loads.
:func:`~companion.models.factory.make_model` validates the whole spec."""

from __future__ import annotations

__all__ = ["is_offline", "spec_kind"]


def spec_kind(spec: str) -> str:
    """``openai`` for ``openai:gpt-4o-mini``; the whole spec when it has no colon."""
    return spec.strip().partition(":")[0]


def is_offline(spec: str) -> bool:
    """The scripted model: no server, no key, nothing to check."""
    return spec_kind(spec) == "scripted"
