"""Which argument of a speaking action carries its line.

aikyo's speaking tool takes ``message``; a card's own action may name it ``text``, ``content``
or ``utterance``. Whoever reads a line out of a call's arguments (the live voice while the model
writes it, the line check and the stage directions before it is published) reads the same one,
so a custom action's line is checked and cleaned as ``speak_with_voice``'s is. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["MESSAGE_FIELDS", "line_field"]

MESSAGE_FIELDS: Final = ("message", "text", "content", "utterance")
"""The argument of a speaking action that carries the line, the first of these it has."""


def line_field(args: Mapping[str, object]) -> str | None:
    """Which of ``args`` carries the line: the first of :data:`MESSAGE_FIELDS` holding a string."""
    return next((name for name in MESSAGE_FIELDS if isinstance(args.get(name), str)), None)
