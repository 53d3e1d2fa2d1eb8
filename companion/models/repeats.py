"""Never the same thing twice: how the offline model tells that a line, a sentence or a
template's frame has been said before in a conversation, whatever names or words filled it
("What would you bake, Juniper?" and "What would you bake, Ostra?" are one phrase).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from companion.models.hearing import name_pattern

__all__ = ["is_phrase", "plain", "said_before"]

_NOT_WORD: Final = re.compile(r"[^\w\u3040-\u30ff\u3400-\u9fff]+")
_LEAST_FRAME: Final = 6
"""Letters a template's own words must have to count as a phrase ("{Fact}" alone is none; a
kana or kanji counts two)."""
_CJK_CHAR: Final = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")


def plain(text: str, names: Sequence[str] = ()) -> str:
    """``text`` as lines are compared: case-folded, names masked, punctuation and spacing gone
    ("What would you bake, Juniper?" and "What would you bake, Ostra!" are the same)."""
    folded = text.casefold()
    for name in sorted((n for n in names if n.strip()), key=len, reverse=True):
        folded = name_pattern(name).sub(" x ", folded)
    return " ".join(_NOT_WORD.sub(" ", folded).split())


def said_before(template: str, spoken: Sequence[str]) -> bool:
    """Whether one of ``spoken`` (:func:`plain` lines) holds ``template``'s own words in its
    order, whatever filled its placeholders."""
    chunks = [plain(c) for c in re.split(r"\{\w+\}", template)]
    chunks = [c for c in chunks if c]
    if sum(len(c) + len(_CJK_CHAR.findall(c)) for c in chunks) < _LEAST_FRAME:
        return False
    pattern = re.compile(r".{0,200}?".join(re.escape(c) for c in chunks))
    return any(pattern.search(line) for line in spoken)


def is_phrase(text: str) -> bool:
    """Whether a :func:`plain` sentence is long enough that finding it inside another line is
    a repetition (five words, or twelve kana and kanji), not a name said again."""
    return len(text.split()) >= 5 or len(_CJK_CHAR.findall(text)) >= 12
