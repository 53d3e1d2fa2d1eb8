"""Cutting a line into sentences while it is still being written: what a voice says one at a time.

A model's line arrives a few characters at a time. A voice that waits for the whole line makes a
person wait for the whole generation; a voice that speaks every fragment says half-words. The
unit in between is the sentence: complete enough to be said with the right intonation, short
enough to start early. :class:`SentenceSplitter` is fed the line *so far* (the whole text each
time, as a partial JSON parse yields it) and hands back each sentence once it is certain to be
complete, so that feeding a text in any chunks gives exactly the sentences of feeding it whole.

A sentence ends:

- after ``.``, ``!``, ``?`` or ``…`` (runs of them, then closing quotes and brackets) followed
  by white space and a next word that does not begin in lower case: "Dr. Smith", "e.g. this",
  "approx. five", "3.14" and '"Really?" she asked' do not end one; an abbreviation or a single
  letter before a lone ``.`` (an initial) does not either;
- after ``。``, ``！``, ``？`` (and their kin) with their closing brackets, at once: Japanese puts
  no space after them;
- at a line break;
- at :attr:`SentenceSplitter.max_chars`, when no end came: at the last clause break (``,``,
  ``;``, ``:``, ``、``, ``，``) or space before the bound, so that a run-on line still starts
  early and no sentence is longer than the bound.

With :attr:`SentenceSplitter.first_clause` set (the live voice sets it), the line's *first* piece
also ends at a clause break (``,`` or ``;`` then a space, ``、``, ``，``, ``；``) that comes at least
that many characters into it, when no sentence ended before it: "I've been in your shoes," is
voiced while the model still writes "my friend." A model writes a one-sentence line about as fast
as a voice says its first clause, so waiting for the whole first sentence makes a person wait for
most of the line (SmolLM2-135M: first words at 0.6-0.7 of the line's time, measured); later pieces
are whole sentences, which the voice has time to wait for while it speaks.

Pure and synchronous: no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "CLAUSE_MARKS",
    "FIRST_CLAUSE_CHARS",
    "MAX_SENTENCE_CHARS",
    "SentenceSplitter",
    "join_sentences",
    "split_sentences",
    "whole_sentences_of",
]

MAX_SENTENCE_CHARS: Final = 200
"""The longest sentence handed out (characters): about 12 s of speech, the wait a run-on line may
impose before its first words."""

FIRST_CLAUSE_CHARS: Final = 16
"""The shortest first clause voiced on its own ("I can't talk to you," is 20): "Well," or
"You know," alone would be said as a word and a pause."""

_WESTERN: Final = ".!?…"
_EASTERN: Final = "。！？‼⁇⁈⁉｡"
_CLOSERS: Final = "\"'”’»)]}」』）】》〉］｝"
_EASTERN_CLOSERS: Final = "」』）】》〉］｝"
_CLAUSE: Final = ",;:、，；："
CLAUSE_MARKS: Final = _CLAUSE
"""The marks a piece may end on without ending its sentence (a first clause, an over-long
sentence cut at :attr:`SentenceSplitter.max_chars`)."""
_FIRST_CLAUSE: Final = re.compile(r"[,;](?=\s)|[、，；]")
"""A clause break certain as soon as it is read: a western one once the space after it came
("1,000" has none), an eastern one at once."""
_NO_SPACE_AFTER: Final = _EASTERN + _EASTERN_CLOSERS + "、，；："
_ABBREVIATIONS: Final = frozenset(
    re.split(
        r"\s+",
        "mr mrs ms dr prof sr jr st mt vs etc eg ie cf approx dept inc ltd corp vol jan feb apr aug "
        "sept oct nov dec tue thu fri e.g i.e a.m p.m u.s u.k",
    )
)
"""Words after which a lone ``.`` is not the end of a sentence (compared without case). Words that
also end sentences in speech ("No.", "I sat.") are left out: a wrong split costs a pause, a wrong
join a sentence's delay."""

_END: Final = re.compile(
    rf"[{re.escape(_WESTERN)}]+[{re.escape(_CLOSERS)}]*|[{re.escape(_EASTERN)}]+[{re.escape(_CLOSERS)}]*|\n"
)
_WORD_BEFORE: Final = re.compile(r"([\w.]+)$")


def _undecided() -> None:
    """Marks a boundary that needs more text to be decided (see :meth:`SentenceSplitter._next`)."""


@dataclass
class SentenceSplitter:
    """The complete sentences of a growing line, each handed out once, in order."""

    max_chars: int = MAX_SENTENCE_CHARS
    first_clause: int | None = None
    """The line's first piece may end at a clause break this many characters into it (see the
    module's docstring); ``None``: pieces are whole sentences."""
    clause_alone: Callable[[str], bool] = field(default=lambda _clause: True)
    """Whether a first clause may go alone (``False``: it waits for the rest of its sentence).
    Must decide by the clause's text only, so that the pieces do not depend on the chunks."""
    _text: str = field(default="", init=False)
    _start: int = field(default=0, init=False)
    """Where the text not yet handed out begins."""
    _diverged: bool = field(default=False, init=False)
    _pieces: int = field(default=0, init=False)
    """Pieces handed out so far."""
    _clauses: dict[str, bool] = field(default_factory=dict, init=False)
    """Whether each first clause asked about may go alone: every token fed asks again, and
    :attr:`clause_alone` compares with the whole conversation."""

    def __post_init__(self) -> None:
        if self.max_chars < 8:
            raise ValueError(f"max_chars must be at least 8, got {self.max_chars!r}")

    @property
    def said(self) -> str:
        """The line up to the end of the last sentence handed out, exactly as written."""
        return self._text[: self._start].strip()

    @property
    def diverged(self) -> bool:
        """A later text did not begin with the sentences already handed out (the writer went back
        on them); nothing more is handed out after that."""
        return self._diverged

    def feed(self, text: str) -> list[str]:
        """The sentences completed by ``text``, the whole line so far."""
        return self._advance(text, final=False)

    def finish(self, text: str | None = None) -> list[str]:
        """The remaining sentences once the line is complete (``text``, or the last fed)."""
        return self._advance(self._text if text is None else text, final=True)

    def _advance(self, text: str, *, final: bool) -> list[str]:
        if self._diverged:
            return []
        if not text.startswith(self._text[: self._start]):
            self._diverged = True
            return []
        self._text = text
        out: list[str] = []
        for _ in range(len(text) + 1):  # every round consumes at least one character
            end = self._next(final)
            if end is None:
                break
            piece = text[self._start : end].strip()
            self._start = end
            if any(ch.isalnum() for ch in piece):
                out.append(piece)
                self._pieces += 1
        return out

    def _next(self, final: bool) -> int | None:
        """Where the next sentence ends, or ``None`` while that is not certain yet."""
        text, start = self._text, self._start
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            return None
        bound = start + self.max_chars
        clause = self._first_clause(start, bound)
        for match in _END.finditer(text, start):
            if match.end() > bound or (clause is not None and match.start() >= clause):
                break
            verdict = self._ends_sentence(match, final)
            if verdict is _undecided:
                return None
            if verdict:
                return match.end()
        if clause is not None:
            return clause
        if len(text) > bound:
            return self._cut(start, bound)
        return len(text) if final else None

    def _first_clause(self, start: int, bound: int) -> int | None:
        """The end of the line's first clause when it may be voiced alone (see
        :attr:`first_clause`), else ``None``."""
        if self.first_clause is None or self._pieces:
            return None
        for match in _FIRST_CLAUSE.finditer(self._text, start + self.first_clause - 1, bound):
            clause = self._text[start : match.end()].strip()
            if clause not in self._clauses:
                self._clauses[clause] = _balanced(clause) and self.clause_alone(clause)
            if self._clauses[clause]:
                return match.end()
        return None

    def _ends_sentence(self, match: re.Match[str], final: bool) -> bool | object:
        text = self._text
        mark = match.group()
        if mark == "\n":
            return True
        rest = text[match.end() :]
        if rest and rest[0] in _CLOSERS + _WESTERN + _EASTERN:
            return False  # the run continues (a closer after a space is cut off by the regex)
        if mark[0] in _EASTERN:
            return True if rest or final else _undecided
        nxt = rest.lstrip()
        if not nxt:
            return True if final else _undecided
        if len(nxt) == len(rest):
            return False  # "3.14", "e.g", "U.S": no space after it
        if nxt[0].islower():
            return False
        if mark == ".":
            before = _WORD_BEFORE.search(text, 0, match.start())
            word = before.group(1).casefold().rstrip(".") if before else ""
            if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha() and word != "i"):
                return False
        return True

    def _cut(self, start: int, bound: int) -> int:
        """The end of an over-long sentence: after the last clause break, else the last space,
        before ``bound`` (a word is never cut in two unless it is longer than the bound)."""
        window = self._text[start:bound]
        for marks in (_CLAUSE, " \t"):
            at = max(window.rfind(mark) for mark in marks)
            if at > 0:
                return start + at + 1
        return bound


_PAIRED: Final = (("(", ")"), ("[", "]"), ("“", "”"), ("「", "」"), ("（", "）"))


def _balanced(clause: str) -> bool:
    """Whether every bracket and quote ``clause`` opens it also closes: a clause inside an aside
    or a quotation ("(I will give you your turn next," SmolLM2-135M, measured) is no clause of
    the line's own to say alone."""
    return clause.count('"') % 2 == 0 and all(clause.count(o) == clause.count(c) for o, c in _PAIRED)


def join_sentences(sentences: Sequence[str]) -> str:
    """Sentences (and a first clause) back into a line: a space between them, none after
    Japanese punctuation."""
    out = ""
    for sentence in sentences:
        if out and out[-1] not in _NO_SPACE_AFTER:
            out += " "
        out += sentence
    return out


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """The sentences of a complete line (what :class:`SentenceSplitter` hands out for it)."""
    return SentenceSplitter(max_chars).finish(text)


_ENDS: Final = re.compile(rf"(?:{_END.pattern})\s*$")


def whole_sentences_of(text: str) -> str:
    """The complete sentences of a line cut off at any point (a model's token limit stops it
    mid-word): what :class:`SentenceSplitter` hands out for it as it streams, plus a last
    sentence the cut fell just after."""
    splitter = SentenceSplitter()
    done = splitter.feed(text)
    rest = splitter.finish()
    if rest and _ENDS.search(rest[-1]):
        done += rest
    return join_sentences(done)
