"""Stage directions at the start of a line: written by a model, never said.

Small chat models open lines the way a script does: SmolLM2-135M began seven of eight lines with
``(Slightly)`` in one run (measured, ``scripts/bench_latency.py --source smollm2``), and others
write ``*smiles*`` or ``[sighs]``. A voice reads the direction out ("Slightly. I've been in your
shoes"), companions see it in the message, and the model, reading its own earlier lines back as
chat turns, writes the next one the same way. So a bracketed direction before the first word is
not part of the line: neither voiced nor published. A bracket later in a line belongs to the
sentence and stays.

:func:`without_directions` serves both readers of a line: the live line while it grows (where a
direction still open may yet close, so nothing is shown until that is known) and the complete
line handed to the speaking action. Both see the same text, so what was shown while streaming
is always the start of the line published. Pure and synchronous.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_DIRECTION_CHARS", "without_directions"]

MAX_DIRECTION_CHARS: Final = 60
"""The longest bracketed text taken for a direction ("(Slightly)", "*leans closer, smiling*"); a
longer one is a sentence in brackets and stays."""

_PAIRS: Final = {"(": ")", "[": "]", "*": "*", "（": "）", "［": "］", "【": "】"}
_LEADING: Final = re.compile(
    "|".join(
        rf"{re.escape(o)}[^{re.escape(o + c)}\n]{{1,{MAX_DIRECTION_CHARS}}}{re.escape(c)}"
        for o, c in _PAIRS.items()
    )
)
_AFTER: Final = " \t\n,.;:、，。-"
"""What may follow a direction before the line's first word ("(Slightly), I ..."): dropped with it."""


def without_directions(text: str, *, complete: bool = True) -> str | None:
    """``text`` without the bracketed directions before its first word.

    With ``complete=False`` (a line still being written) ``None`` while a direction at the start
    is still open: it may close (and be dropped) or run past :data:`MAX_DIRECTION_CHARS` (and
    stay), and a line shown must only grow.
    """
    rest = text.lstrip()
    dropped = False
    for _ in range(len(rest) + 1):  # every round drops at least one character
        found = _LEADING.match(rest)
        if found is None or not any(ch.isalpha() for ch in found.group()):
            break  # "(1)" is a list's mark, not a direction: the line check judges it
        rest = rest[found.end() :]
        rest = rest.lstrip(_AFTER)
        dropped = True
    if not complete and _still_open(rest):
        return None
    if not dropped or (complete and not rest):
        return text  # a line that is all note is the line check's to refuse, with its reason
    return rest[:1].upper() + rest[1:]


def _still_open(text: str) -> bool:
    """Whether ``text`` starts with an opening bracket whose direction may still close."""
    closer = _PAIRS.get(text[:1])
    if closer is None:
        return False
    inside = text[1 : 2 + MAX_DIRECTION_CHARS]
    return closer not in inside and "\n" not in inside and len(text) <= 1 + MAX_DIRECTION_CHARS
