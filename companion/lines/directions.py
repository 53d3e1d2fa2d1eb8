"""Stage directions at the start of a line, or between its sentences: written by a model, never
said.

Small chat models open lines the way a script does: SmolLM2-135M began seven of eight lines with
``(Slightly)`` in one run (measured, ``scripts/bench_latency.py --source smollm2``), and others
write ``*smiles*`` or ``[sighs]``. A voice reads the direction out ("Slightly. I've been in your
shoes"), companions see it in the message, and the model, reading its own earlier lines back as
chat turns, writes the next one the same way. So a bracketed direction before the first word is
not part of the line: neither voiced nor published. Nor is one standing alone between two
sentences ("(Sighs in relief)"); a bracket inside a sentence belongs to it and stays.

It also opened lines with its own name, as if it spoke to itself: the first five lines of a
conversation, every time, were ``Juniper, I am so glad ...`` from Juniper (measured,
``bench_latency.py --source smollm2 --reads-param``, 2026-12-06; the prompt asks "What do you
say now, Juniper?"). Nobody calls themselves by name: that vocative is not said either.

The same model also framed its line as advice to someone else: six lines running of one run
were ``You can say: "It's been a pleasure to speak with you. ..."`` (measured, 2026-12-05). The
frame and its quotation marks are not said either: the quoted words are the line.

Or it announced its answer, at the line's start or after a first sentence: five of ten lines of
a three-companion demo were ``You're a friend. Here is the answer to your question: "I'm glad
you asked, ..."`` (measured, ``scripts/bench_models.py --runs 2 --server-cache``, the opening
"What's your favourite cake?", 2026-12-07). The announcement and its quotation marks are not
said; the sentence before it is.

A line written as a script's, ``Pim: ...``, begins with a label: the label of the speaker's own
name is not said (:func:`own_label`, read by the models where they find a label), nor that name
written with one letter too many, as SmolLM2-135M wrote ``Pimp: I am happy to announce ...``
for Pim (measured, ``scripts/bench_models.py --runs 2 --server-cache``, 2026-12-07).

:func:`without_directions` serves both readers of a line: the live line while it grows (where a
direction still open may yet close, so nothing is shown until that is known) and the complete
line handed to the speaking action. Both see the same text, so what was shown while streaming
is always the start of the line published. Pure and synchronous.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = ["FRAMES", "MAX_DIRECTION_CHARS", "MAYBE_LABEL", "SPEAKER_LABEL", "own_label", "without_directions"]

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

_ENDS: Final = ".!?。！？…"
"""A sentence's end, before an aside between sentences."""
_ASIDE: Final = rf"[^()\[\]*\n{_ENDS}]{{1,{MAX_DIRECTION_CHARS}}}"
_BETWEEN: Final = re.compile(rf"(?<=[{_ENDS}])\s+(?:\({_ASIDE}\)|\[{_ASIDE}\]|\*{_ASIDE}\*)(?=\s|$)")
_OPEN_AT_END: Final = re.compile(
    rf"(?<=[{_ENDS}])\s+(?:[(\[*][^()\[\]*\n{_ENDS}]{{0,{MAX_DIRECTION_CHARS}}})?$"
)
"""What a line being written holds back after a sentence's end: an aside that may still close,
or the space that may come before one (the sentence is handed out only at the next word anyway,
:class:`~companion.lines.sentences.SentenceSplitter`)."""

ANNOUNCEMENTS: Final = (
    "here is the answer to your question", "here's the answer to your question",
    "here is my answer", "here's my answer", "here is the answer", "here's the answer",
)  # fmt: skip
"""What a line announcing its answer says before a colon and a quotation mark, at its start or
at the start of a later sentence."""
FRAMES: Final = (
    "you can say", "you could say", "you might say", "i would say", "i'd say", "i will say",
    "i'll say", "say", "answer", "reply", "response", "my answer", "my reply", *ANNOUNCEMENTS,
)  # fmt: skip
"""What a line framed as advice (or announcing its answer) opens with, before a colon and a
quotation mark."""
_QUOTES: Final = {'"': '"', "\u201c": "\u201d", "\u300c": "\u300d", "\u300e": "\u300f"}


def _opening(phrases: Sequence[str], before: str = "") -> re.Pattern[str]:
    """One of ``phrases`` (any run of spaces between their words), a colon and an opening
    quotation mark (the last group), after ``before``."""
    words = "|".join(re.escape(f).replace(r"\ ", r"\s+") for f in phrases)
    return re.compile(rf"{before}(?:{words})\s*:\s*([{''.join(_QUOTES)}])", re.IGNORECASE)


def _spaceless(phrases: Sequence[str]) -> tuple[str, ...]:
    """Each of ``phrases`` with its colon and each opening quotation mark, without spaces: for
    telling whether a line being written may still become one."""
    return tuple(f.replace(" ", "") + ":" + q for f in phrases for q in _QUOTES)


_FRAME: Final = _opening(FRAMES)
_FRAME_TEXTS: Final = _spaceless(FRAMES)
_ANNOUNCED: Final = _opening(ANNOUNCEMENTS, rf"(?<=[{_ENDS}])(\s+)")
_ANNOUNCEMENT_TEXTS: Final = _spaceless(ANNOUNCEMENTS)
_LAST_SENTENCE: Final = re.compile(rf"(?<=[{_ENDS}])\s+([^{_ENDS}\s][^{_ENDS}]*)$")
"""The start of the last sentence of a line, after the sentence before it."""


def without_directions(text: str, *, complete: bool = True, speaker: Iterable[str] = ()) -> str | None:
    """``text`` without the bracketed directions before its first word, without the speaker's
    own name called at its start (``speaker``: its names, ``Juniper, I ...``), and without a
    frame around the line (``You can say: "..."``).

    With ``complete=False`` (a line still being written) ``None`` while a direction at the start
    is still open (it may close, and be dropped, or run past :data:`MAX_DIRECTION_CHARS`, and
    stay) or the start may still become the speaker's name or a frame: a line shown must only
    grow. A framed line being written holds back a closing quotation mark at its end.
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
    names = [n for n in speaker if n.strip()]
    called = _own_name_called(rest, names)
    if called:
        rest, dropped = rest[called:].lstrip(_AFTER), True
    if not complete and (
        not rest or _still_open(rest) or _may_become_frame(rest) or _may_become_own_name(rest, names)
    ):
        return None
    framed = _FRAME.match(rest)
    if framed is not None:
        quoted = rest[framed.end() :].rstrip()
        quoted = quoted.removesuffix(_QUOTES[framed.group(1)]).rstrip()
        if any(ch.isalpha() for ch in quoted):
            rest, dropped = quoted, True
        elif not complete:
            return None  # the quoted words have not begun
    if not dropped or (complete and not rest):
        # a line that is all note is the line check's to refuse, with its reason
        return _without_asides(_without_announcements(text, complete=complete), complete=complete)
    rest = _without_announcements(rest[:1].upper() + rest[1:], complete=complete)
    return _without_asides(rest, complete=complete)


def _without_announcements(text: str, *, complete: bool) -> str:
    """``text`` without an answer announced after one of its sentences (``... Here is the answer
    to your question: "I'm glad ..."``): the announcement and its quotation marks go, the quoted
    words stay, from a capital. While the line is written, a last sentence that may still become
    an announcement is held back."""
    kept = text
    start = 0
    for _ in range(len(text)):  # every round drops at least the announcement's words
        found = _ANNOUNCED.search(kept, start)
        if found is None:
            break
        quoted = kept[found.end() :]
        closing = quoted.find(_QUOTES[found.group(2)])
        if closing >= 0:
            quoted = quoted[:closing] + quoted[closing + 1 :]
        kept = kept[: found.start()] + found.group(1) + quoted[:1].upper() + quoted[1:]
        start = found.start() + len(found.group(1))
    if not complete:
        last = _LAST_SENTENCE.search(kept)
        if last is not None:
            words = "".join(last.group(1).casefold().split())
            if any(t.startswith(words) for t in _ANNOUNCEMENT_TEXTS):
                kept = kept[: last.start()]
    return kept


def _without_asides(text: str, *, complete: bool) -> str:
    """``text`` without the directions standing between its sentences ("... another day. (Sighs
    in relief) In my time, ...": SmolLM2-135M, six in one ten-line conversation, measured), each
    a bracket of :data:`MAX_DIRECTION_CHARS` or fewer with a letter and no sentence mark in it,
    after a sentence's end and before a space or the line's end. A bracket inside a sentence
    ("Dr. Ahn (the harbour master) said"), or one that is a sentence ("(She left.)"), stays.
    While the line is written, one still open after a sentence's end is held back, and so is the
    space after a sentence's end."""
    kept = _BETWEEN.sub(lambda m: "" if any(ch.isalpha() for ch in m.group()) else m.group(), text)
    if not complete:
        still_open = _OPEN_AT_END.search(kept)
        if still_open is not None:
            kept = kept[: still_open.start()]
    return kept


_CALLING: Final = frozenset(",、，")
"""What follows a name called at a line's start ("Juniper, I ...", "ジュニパー、")."""


def _own_name_called(text: str, names: Sequence[str]) -> int:
    """The length of one of the speaker's ``names`` called at the start of ``text`` with its
    comma, or 0 ("Juniperberry, ..." and "Juniper is ..." call nobody)."""
    for name in names:
        size = len(name)
        if text[:size].casefold() == name.casefold() and text[size : size + 1] in _CALLING:
            return size + 1
    return 0


SPEAKER_LABEL: Final = re.compile(r"^\s*(?:\*\*)?([A-Z][\w .'-]{0,40}?)(?:\*\*)?\s*(?:\([^)]*\))?\s*:\s+")
"""A ``Name:`` label at a line's start, bold or with a note in brackets ("Juniper (softly): "),
as small models write one; group 1 is the name (:func:`own_label` says whether it is the
speaker's). One pattern for the line streamed and the line complete: with two, "Juniper
(smiling): Hello." was voiced with its label and published without it."""
MAYBE_LABEL: Final = re.compile(r"^\s*(?:\*\*)?[A-Z][\w .'-]{0,40}(?:\*\*)?\s*(?:\([^)]*\)?)?\s*:?$")
"""A first line that may still become a :data:`SPEAKER_LABEL` (held back until it is certain:
the label is no part of the line, and a line shown must only grow)."""


def own_label(label: str, names: Iterable[str]) -> bool:
    """Whether ``label``, written before a colon at a line's start, is one of the speaker's
    ``names``: as it is, in any case, or a name of three letters or more with one letter added
    ("Pimp" for Pim). Another name is not the speaker's ("Pam", "Pimento"), nor a word before a
    colon ("Note")."""
    folded = label.strip().casefold()
    for name in names:
        own = name.strip().casefold()
        if folded == own:
            return True
        if len(own) >= 3 and len(folded) == len(own) + 1 and folded.startswith(own) and folded[-1].isalpha():
            return True
    return False


def _may_become_own_name(text: str, names: Sequence[str]) -> bool:
    """Whether ``text`` (a line being written) may still become one of ``names`` called."""
    folded = text.casefold()
    return any(name.casefold().startswith(folded) for name in names)


def _may_become_frame(text: str) -> bool:
    """Whether ``text`` (a line being written) is the start of a frame, not yet past it."""
    start = "".join(text.casefold().split())
    return bool(start) and any(frame.startswith(start) for frame in _FRAME_TEXTS)


def _still_open(text: str) -> bool:
    """Whether ``text`` starts with an opening bracket whose direction may still close."""
    closer = _PAIRS.get(text[:1])
    if closer is None:
        return False
    inside = text[1 : 2 + MAX_DIRECTION_CHARS]
    return closer not in inside and "\n" not in inside and len(text) <= 1 + MAX_DIRECTION_CHARS
