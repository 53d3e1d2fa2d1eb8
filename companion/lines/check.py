"""Is this line the character's own? A pure check of one text before anybody hears it.

Measured with SmolLM2-135M: a small model reads its prompt aloud (a ``Context: {...}`` block, the
history's own line format ``Pim (companion_pim) -> companion_ostra, ...``, the instructions'
words: "You can use the action tools ...") and copies what another companion just said, word for
word. None of that is a line of the character's, whatever the model, so the speaker refuses it
once (the model is asked again, told why) and then gives its slot up rather than say it.

:func:`check_line` takes one text, a whole line or one sentence of a line being streamed, and
the :class:`LineContext` (what was already said in the conversation, the ids of who is in it,
and texts whose wording belongs to the prompt), and returns a :class:`LineVerdict`. It is
deterministic and bounded in the size of what it reads; it never raises on odd text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Final, Literal

from companion.lines.sentences import CLAUSE_MARKS, join_sentences, split_sentences
from companion.protocol import Message
from companion.text import clip

__all__ = [
    "COPY_SIMILARITY",
    "NOT_SAID",
    "LineContext",
    "LineVerdict",
    "begins_an_earlier_sentence",
    "check_line",
    "check_said",
    "normalized_words",
    "sentences",
]

NOT_SAID = "not said, because it"
"""How every refusal of a line begins (what the model is told), so a speaker can tell a line
refused from a tool call refused for another reason (a person's denied approval)."""

COPY_SIMILARITY = 0.8
"""Word-sequence similarity (0..1) from which a text counts as a near-copy of an earlier one.
"Greetings, welcome to a special treat!" against the same with one word changed is 0.86; two
lines that only share a name and a topic stay far below."""

_EXACT_SIZE = 3.0
"""A text shorter than this (in words; a CJK character counts half) may repeat exactly: "Good
night!" or 「はい」 said twice is not a copied line."""
_NEAR_SIZE = 5.0
"""Near-copies count from this size on (short lines differ by too little to judge)."""
_SENTENCE_SIZE = 8.0
"""A sentence of an earlier line counts as copied from this size on (words said again in a
short sentence, "I should introduce myself: I'm Aki.", are a turn of phrase, not a copy)."""
_SPLICE_SIZE = 12.0
"""From this size on (in words), a line is also judged by its runs of words (:data:`_RUN`)."""
_RUN = 4
_SPLICE_SHARE = 0.3
"""The share of a line's runs of :data:`_RUN` words found in one other's earlier line from which
it is a copy, however rearranged. Measured with SmolLM2-135M in the demo: lines spliced from
another's sentences, reworded, shared 0.31-0.40 of their runs with it (each sentence and the whole
below :data:`COPY_SIMILARITY`); every other line of those runs, 0.21 or less."""
_ECHO_WORDS = 7
"""A run of this many words taken from the prompt's own wording is reading the prompt aloud."""
_LOOP_WORD = 6
"""One word said this many times running is a loop, not speech ("A great, great, great, great,
great, great, ..." to the token limit: SmolLM2-135M behind llama.cpp's server, whose sampling
has no repetition penalty by default, measured); "No, no, no!" is not one."""
_LOOP_PHRASE = 4
"""A phrase of two to :data:`_LOOP_SPAN` words said this many times running is one too ("A little,
a little, a little, a little, ...", measured); "Thank you, thank you, thank you!" is not."""
_LOOP_SPAN = 8
_TEXT_LIMIT = 2000
"""Characters of a text (and of each earlier line) looked at."""
_EARLIER_LIMIT = 64
"""Earlier lines compared with (the most recent)."""
_WORDS_CACHED = 4096
"""Texts whose words and sentences are kept once read: every check reads the conversation's
earlier lines again, and a line written whole is checked once whole and once a sentence at a
time (the fault suite's 70 conversations read the same texts 29,000 times)."""

_JSON = re.compile(r"""[{\[]\s*["'][^"'\n]{0,80}["']\s*:|["'][\w -]{1,40}["']\s*:\s*[{\["\d]""")
"""A JSON object written out (``{"memory": ...``, ``"params": {``)."""
_ARROW = re.compile(r"\S\s*(?:->|→)\s*\S")
"""The history's line format: ``Pim (companion_pim) -> companion_ostra: ...``."""
_ID_IN_PARENS = re.compile(r"\(\s*(?:id\s+)?[a-z]+_[\w-]*\s*\)|\(\s*id\s*\)", re.IGNORECASE)
"""``Name (companion_x)``, even cut short (``Juniper (companion_junipe)``), or the format's own
placeholder (``My name is: Juniper (id)``, SmolLM2-135M, measured)."""
_LABELS = re.compile(
    r"\bContext\s*:"
    r"|(?:^|\n)\s*(?:background|companions|parameters|instructions|address)\b[^:\n]{0,24}:"
    r"|(?:^|\n|[.!?]\s)\s*(?:conversation so far|personality|your role|how you talk"
    r"|follow these instructions)\b[^:\n]{0,24}:",
    re.IGNORECASE,
)
"""A heading of the prompt read aloud (``Context:``, ``Your role:``, ``Address:``). The headings
only the prompt has count at the start of any sentence ("... ask them to make it yourself. Your
role (Pim): Respond with a smile. ... Follow these instructions: Respond in character.",
SmolLM2-135M in the demo, measured); those a character may say ("... Address: 12 Harbour
Street", a recipe's "Instructions:") only at the line's start."""
_LETTER_LABEL = re.compile(r"(?:^|[.!?\u2026]\s)\s*[A-Z]\s*:\s")
"""A line of a script labelled by a letter; three in a line are a script, not speech ("... A: No,
I'm not. B: No way? C: No way! D: No way! ...", SmolLM2-135M in the demo, measured)."""
_TOOL_TALK = re.compile(
    r"\b(?:actions?|knowledge|output) tools?\b|\btool[ _]calls?\b|\bjson\b|\bschema\b"
    r"|\bset_(?:params|states)\b|\bspeak with voice\b|\btools? to (?:speak|talk)\b"
    # the speaker rules' length, paraphrased (SmolLM2-135M, measured: "You can only use what is
    # requested here: 1-2 sentences (you may have a longer sentence ...", "I'm sorry, but I can
    # only speak one or two sentences at a time.")
    r"|\b(?:\d+|one|two|three)\s*(?:[-\u2013]|\s(?:or|to)\s)\s*(?:\d+|two|three|four)\s+(?:(?:short|new)\s+)?"
    r"sentences\b|\bwhat is requested here\b"
    r"|\bit is your turn\b|\bstay in character\b|\bthe (?:system|user) prompt\b"
    # the rules, told back as a note on the line ("You've already addressed the user's question
    # in-character, so no need to mention that.", SmolLM2-135M in bench_models, measured)
    r"|\bin-character\b|\bthe user'?s? (?:question|message|request)\b"
    # the persona's framing, told back ("You are a companion in a group of friends with various
    # personalities.", "You are a companion in this role-play, ...": SmolLM2-135M, measured)
    r"|\ba companion in (?:a|this|the|our) (?:group|role[- ]?play)\b|\bother ai companions\b"
    # a snake_case identifier: a tool's name ("- speak_with_voice: I am Juniper.", SmolLM2-135M,
    # measured); nobody says one
    r"|\b[a-z]+(?:_[a-z0-9]+)+\b"
    r"|\bautomated feedback\b|\bapplication(?:'s)? validation\b|\bprevious response\b|\bserver error\b"
    # this check's own reasons, sent back with a refused line, then read aloud (measured)
    r"|\bnot a line of (?:yours|your own)\b|\bsay something new\b|\bin your own (?:words|voice)\b"
    r"|\bsay only the words\b|\brepeats what (?:you already said|was already said)\b"
    r"|\bnot said, because\b|\bnew sentences of your own\b"
    # the second try's own words (models/second_try.py), read aloud (measured)
    r"|\byour first try\b|\bwas not used\b|\bsay something different\b|\bonly your words\b"
    r"|\bthe conversation is (?:ending|over|winding down)\b",
    re.IGNORECASE,
)
"""The instructions' own vocabulary: a character talks about cakes, not about its tools; nor
about the retry's framing, which SmolLM2-135M read aloud ("Your previous response failed the
application's validation (this is automated feedback, ...)", pydantic-ai's words)."""
_BRACKETED = re.compile(r"^\s*\([^()]*\)[\s.!?]*$")
"""A whole line in brackets: a note or a stage direction ("(Growling)", "(Your first try was not
used)", measured), not words said."""
_LIST_MARK = re.compile(r"^\s*[-*•]\s")
"""A line that starts as an item of a list ("- speak_with_voice.", measured): notes, not speech."""
_UNFINISHED = re.compile(r"[,:;(\[{-]\s*$")
"""A line cut off where it goes on ("Hello everyone," was the first line of a longer answer)."""
_ROLE_LABEL = re.compile(r"^\s*(?:user|sender|assistant|system|ai|bot|a|q)\s*:", re.IGNORECASE)
"""A chat role as a label ("User: 3 Users", "Sender: Thank you", "A: ...": measured)."""
_TAG = re.compile(r"</?[A-Za-z][\w:-]*>")
"""Markup of the request (``<pyai:retry_feedback>`` came back as a whole line; ``<tool_call>``)."""
_LETTER = re.compile(r"[^\W\d_]")
"""A letter of any script: a line without one (``1.``, the mark of a numbered list a small model
began, voiced as a sentence of its own) has no words to say."""
_HISTORY_NUMBER = re.compile(r"(?:^|\n)\s*\d{1,3}\.\s+\S+[^\n]*:")
"""A numbered history line (``3. Aya: ...``)."""
_NUMBER_LABEL = re.compile(r"^\s*(?:\(\d{1,3}\)\s*\d{0,3}|\d{1,3})\s*:(?:\s|$)")
"""A number as a line's label, the history's numbering garbled (``(1) 2: "Ladies and ..."``,
measured)."""
_CONTRACTIONS = (
    (re.compile(r"\bcan['\u2019]t\b|\bcannot\b"), "can not"),
    (re.compile(r"\bwon['\u2019]t\b"), "will not"),
    (re.compile(r"\blet['\u2019]s\b"), "let us"),
    (re.compile(r"\b(it|that|this|there|here|what|who|where|when|how|why|he|she)['\u2019]s\b"), r"\1 is"),
    (re.compile(r"n['\u2019]t\b"), " not"),
    (re.compile(r"['\u2019]re\b"), " are"),
    (re.compile(r"['\u2019]m\b"), " am"),
    (re.compile(r"['\u2019]ve\b"), " have"),
    (re.compile(r"['\u2019]ll\b"), " will"),
    (re.compile(r"['\u2019]d\b"), " would"),
)
"""Contractions written out for comparing: "You're a guardian of facts, and I'm the one who
created it." copies "You are a guardian of facts, and I am the one who created that." (measured).
A pronoun's "'s" is "is" (a name's stays a possessive): "It's my own. It is my own." is one
sentence said twice (SmolLM2 behind llama.cpp's server, measured)."""
_CJK_CHARS = r"\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK = re.compile(f"[{_CJK_CHARS}]")
_CJK_OR_RUN = re.compile(f"[{_CJK_CHARS}]|[^\\W{_CJK_CHARS}]+")
"""A CJK character, or a run of other word characters: "juniperは" is two words, not eight
(each letter of a name a word made a Japanese question that named Juniper a copy of another
line that named her: 6 of its 17 runs of words were the name's letters)."""
_WORD = re.compile(r"\w+")

Kind = Literal["ok", "artifact", "copy"]

_ASK_AGAIN = "Answer the last message with one or two new sentences of your own."
"""The request that follows a refusal: short and plain, since a small model reads its feedback
aloud ("That is not a line of your own voice." came back as a line)."""


@dataclass(frozen=True, slots=True)
class LineContext:
    """What a line is checked against."""

    earlier: Sequence[str] = ()
    """Lines already said in the conversation (by anyone, the person included), oldest first."""
    ids: Iterable[str] = ()
    """The ids of the conversation's companions and people: never part of a spoken line."""
    names: Iterable[str] = ()
    """The display names of the conversation's companions: a line that starts with one as a
    label (``Ostra: ...``, ``(Juniper) ...``) is the record's format, not speech."""
    prompt_texts: Sequence[str] = ()
    """Texts whose wording belongs to the prompt, not to the character (the card's role, the
    instructions the triggers chose)."""
    speaker_lines: Sequence[str] = field(default=())
    """The speaker's own earlier lines (also in ``earlier``): named in the verdict's reason."""
    speaker_name: str = ""
    """The speaker's display name: any other name of ``names`` it gives as its own ("I'm
    Ostra" from Pim) is another companion's line in its mouth."""

    @classmethod
    def of(
        cls,
        said: Sequence[Message],
        speaker: str,
        present: Mapping[str, str],
        prompt_texts: Sequence[str],
    ) -> LineContext:
        """The context of ``speaker``'s next line after the messages ``said`` (oldest first), in a
        conversation with ``present`` (names by id; the senders and recipients of ``said`` are
        added)."""
        people = {m.params.from_ for m in said} | {t for m in said for t in m.params.to}
        return cls(
            earlier=[m.params.message for m in said],
            ids=sorted({*present, *people, speaker}),
            names=sorted(set(present.values())),
            prompt_texts=prompt_texts,
            speaker_lines=[m.params.message for m in said if m.params.from_ == speaker],
            speaker_name=present.get(speaker, ""),
        )


@dataclass(frozen=True, slots=True)
class LineVerdict:
    """``ok``, or why the text is not the character's line (``artifact``: the prompt read aloud;
    ``copy``: what was already said). ``reason`` is written for the model and the log."""

    kind: Kind
    reason: str = ""
    similar_to: str = ""
    """The earlier line (clipped) a copy repeats."""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


OK = LineVerdict("ok")


def check_line(text: str, context: LineContext, said_before: Sequence[str] = ()) -> LineVerdict:
    """Whether ``text`` (a whole line or one sentence) may be said in this conversation, after
    ``said_before``, the sentences of the same line already said (a line being streamed)."""
    text = text[:_TEXT_LIMIT]
    artifact = _artifact(text, context)
    if artifact:
        return LineVerdict("artifact", f"{NOT_SAID} {artifact}. {_ASK_AGAIN}")
    words = _said_words(text)
    if _loops(words):
        return LineVerdict("copy", f"{NOT_SAID} says the same words over and over. {_ASK_AGAIN}")
    pieces = sentences(text)
    piece_words = [_said_words(p) for p in pieces]  # read once: each check below compares them
    again = _said_again(pieces, piece_words, said_before)
    if again:
        shown = clip(again, 120)
        return LineVerdict("copy", f"{NOT_SAID} says \u201c{shown}\u201d twice. {_ASK_AGAIN}", shown)
    # one's own sentences told again are counted over the whole line, the sentences of it
    # already said included: a streamed sentence is judged as it would be inside its line
    before = list(said_before)
    # a sentence after the line's first? (after a first clause alone it is the rest of the first)
    later = any(not piece.rstrip().endswith(tuple(CLAUSE_MARKS)) for piece in before)
    retold = _retold([*before, *pieces], [*map(_said_words, before), *piece_words], context.speaker_lines)
    if retold:
        return _copy(retold, mine=True)
    size = _size(words)
    if size < _EXACT_SIZE:
        return OK
    own = {" ".join(_said_words(line[:_TEXT_LIMIT])) for line in context.speaker_lines}
    # Each long sentence of the text, too, against the others' lines: a line that copies one
    # long sentence of another's and adds its own ending is still a copy (measured: SmolLM2-135M
    # did just that). One's own sentence said again later in a new line is left to the model (the
    # offline one tells a fact again in its goodbye); one's own line, never, nor a line that
    # opens with one's own sentence again (SmolLM2-135M opened three lines in a row with the same
    # two sentences, each line different enough as a whole; a streamed line's first sentence is
    # refused as a copy before anyone hears it, and the whole line is judged the same way).
    parts = [(w, _size(w)) for w in piece_words if _size(w) >= _SENTENCE_SIZE]
    parts = parts if len(pieces) > 1 else []
    opening = piece_words[0] if len(pieces) > 1 else []
    runs = _runs(words) if size >= _SPLICE_SIZE else set()
    for line in reversed(list(context.earlier)[-_EARLIER_LIMIT:]):
        whole = _said_words(line[:_TEXT_LIMIT])
        mine = " ".join(whole) in own
        if mine and later:
            continue  # one's own sentence later in a line: _retold has judged it, as in a whole line
        if _copies(words, size, whole, _NEAR_SIZE):
            return _copy(line, mine)
        if runs and not mine and len(runs & _runs(whole)) >= _SPLICE_SHARE * len(runs):
            return _copy(line, mine)  # another's sentences spliced and reworded
        for candidate in sentences(line):
            other = _said_words(candidate)
            if (
                _copies(words, size, other, _SENTENCE_SIZE)
                or (not mine and any(_copies(w, n, other, _SENTENCE_SIZE) for w, n in parts))
                or (mine and any(w == opening and _copies(w, n, other, _SENTENCE_SIZE) for w, n in parts))
            ):
                return _copy(candidate, mine)
    return OK


def check_said(text: str, context: LineContext) -> tuple[str, LineVerdict]:
    """A whole line judged as it would be said: as a whole (:func:`check_line`), then sentence by
    sentence, each after those before it, as a streamed line is before each sentence is voiced.
    What may be said of it, and the verdict of what may not: ``(text, OK)``; the sentences before
    the first one refused, and its verdict; or ``("", verdict)`` when the line or its first
    sentence is refused, or what is before the refused one is too short to be a line.

    A line written whole (a model that does not stream, a card's ``speak``) is said as a voiced
    one would be: a line whose sentences were refused one at a time when voiced was published
    whole when written whole (SmolLM2-135M in the demo, ``speak``: Pim opened three lines with
    "You're a friend.", and Juniper said Pim's "But not chocolate, but chocolate and cheese." again;
    ``scripts/bench_models.py --runs 2 --server-cache``, 2026-12-07, measured)."""
    verdict = check_line(text, context)
    if not verdict.ok:
        return "", verdict
    pieces = split_sentences(text[:_TEXT_LIMIT])
    said: list[str] = []
    for piece in pieces:
        if _WORD.search(piece):
            # an over-long sentence cut at a clause is not one that "stops mid-sentence"
            verdict = check_line(piece.rstrip(CLAUSE_MARKS), context, said)
            if not verdict.ok:
                kept = join_sentences(said)
                # an interjection alone ("Oh!") is no line: written whole, the line can be asked
                # for again, which a voiced one, heard already, could not
                return (kept if _size(_said_words(kept)) >= _EXACT_SIZE else ""), verdict
        said.append(piece)
    return text, OK


def _loops(words: Sequence[str]) -> bool:
    """Whether ``words`` say one word :data:`_LOOP_WORD` times running, or one phrase of up to
    :data:`_LOOP_SPAN` words :data:`_LOOP_PHRASE` times running: a model caught in a loop."""
    for span in range(1, _LOOP_SPAN + 1):
        needed = _LOOP_WORD if span == 1 else _LOOP_PHRASE
        for start in range(len(words) - span * needed + 1):
            unit = words[start : start + span]
            if all(words[start + k * span : start + (k + 1) * span] == unit for k in range(1, needed)):
                return True
    return False


def _said_again(pieces: Sequence[str], piece_words: Sequence[list[str]], said_before: Sequence[str]) -> str:
    """The first of ``pieces`` (sentences of a line; ``piece_words``, their words) that repeats
    one said before it in the same line (``said_before``, then the pieces before it): the same
    words from :data:`_EXACT_SIZE`, or nearly from :data:`_SENTENCE_SIZE` ("A song in a place.
    It's a song in a place. A song in a place.", measured); empty when none. A line says each
    thing once."""
    earlier = [_said_words(p) for p in said_before]
    for piece, words in zip(pieces, piece_words, strict=True):
        size = _size(words)
        if any(_copies(words, size, other, _SENTENCE_SIZE) for other in earlier):
            return piece
        earlier.append(words)
    return ""


def _retold(pieces: Sequence[str], piece_words: Sequence[list[str]], own: Sequence[str]) -> str:
    """The second sentence of ``pieces`` (a line's; ``piece_words``, their words) that repeats
    one of the speaker's earlier lines (``own``), counting sentences of :data:`_SENTENCE_SIZE`
    words or more; empty when none. One sentence told again inside a new line is the speaker's
    to choose (a fact retold in a goodbye); two are its earlier line said again ("The stars. I've
    been a part of your story, I can't imagine a story I wouldn't write. I'm so glad to have been
    a part of your journey. ...", Ostra's fourth line and her seventh, SmolLM2 behind llama.cpp's
    server, measured: the opening too short to count, the line as a whole not near enough). A
    streamed line's sentence checked alone is refused at the first (a text that is one's earlier
    sentence is a copy)."""
    earlier = [w for line in own[-_EARLIER_LIMIT:] for w in map(_said_words, sentences(line[:_TEXT_LIMIT]))]
    earlier = [w for w in earlier if _size(w) >= _SENTENCE_SIZE]
    retold = 0
    for piece, words in zip(pieces, piece_words, strict=True) if earlier else ():
        size = _size(words)
        if size >= _SENTENCE_SIZE and any(_copies(words, size, other, _SENTENCE_SIZE) for other in earlier):
            retold += 1
            if retold >= 2:
                return piece
    return ""


def _copy(said: str, mine: bool) -> LineVerdict:
    whose = "you already said" if mine else "was already said"
    shown = clip(said, 120)
    return LineVerdict("copy", f"{NOT_SAID} repeats what {whose} (\u201c{shown}\u201d). {_ASK_AGAIN}", shown)


def _runs(words: Sequence[str]) -> set[tuple[str, ...]]:
    """The runs of :data:`_RUN` words of ``words``."""
    return {tuple(words[i : i + _RUN]) for i in range(len(words) - _RUN + 1)}


def _copies(words: list[str], size: float, other: list[str], near_from: float) -> bool:
    """Whether ``words`` repeat ``other``: the same words (from :data:`_EXACT_SIZE`), or a
    near-copy when both have at least ``near_from`` words."""
    if not other:
        return False
    if words == other:
        return size >= _EXACT_SIZE
    if size < near_from or _size(other) < near_from:
        return False
    matcher = SequenceMatcher(None, words, other, autojunk=False)
    if matcher.real_quick_ratio() < COPY_SIMILARITY or matcher.quick_ratio() < COPY_SIMILARITY:
        return False
    return matcher.ratio() >= COPY_SIMILARITY


def _artifact(text: str, context: LineContext) -> str:
    """What of the prompt ``text`` carries, in words for the model; empty when nothing."""
    if text.strip() and not _LETTER.search(text):
        return "has no words, only numbers or marks"
    if _LABELS.search(text):
        return "reads a heading of your instructions aloud"
    if _JSON.search(text):
        return "is JSON, not speech"
    if _TAG.search(text):
        return "is markup of your instructions"
    if len(_LETTER_LABEL.findall(text)) >= 3:
        return "is a script of labelled lines, not words said"
    if _ROLE_LABEL.search(text) or _NUMBER_LABEL.search(text):
        return "starts with a label, as the record does"
    if _ARROW.search(text) or _HISTORY_NUMBER.search(text) or _ID_IN_PARENS.search(text):
        return "copies the format of the conversation's record"
    if _UNFINISHED.search(text):
        return "stops mid-sentence"
    if _BRACKETED.search(text):
        return "is a note in brackets, not words said"
    head = text.lstrip()
    for name in context.names:
        label = (
            rf"\(\s*{re.escape(name)}\b[^)\n]{{0,60}}\)|\(\s*{re.escape(name)}\s*:"
            rf"|{re.escape(name)}\s*(?:\([^)]*\))?\s*:"
        )
        if name and re.match(label, head, re.IGNORECASE):
            return f"starts with the label {name!r}, as the record does"
        # a name alone in brackets later in the line is a label too ("... (Ostra). I am so glad
        # you're happy ... (Pim) The way you talk ...", SmolLM2-135M in the demo, measured)
        if name and re.search(rf"\(\s*{re.escape(name)}\s*\)", text, re.IGNORECASE):
            return f"puts the label {name!r} in brackets, as the record does"
    other = _claims_another_name(text, context)
    if other:
        return f"says it is {other}, another companion: speak as yourself"
    folded = text.casefold()
    for cid in context.ids:
        if len(cid) >= 4 and cid.casefold() in folded:
            return f"says the id {cid!r}: call people by their names"
    if _LIST_MARK.search(text):
        return "is an item of a list, not words said"
    if _TOOL_TALK.search(text):
        return "talks about your instructions and tools"
    words = normalized_words(text)
    if len(words) >= _ECHO_WORDS:
        runs = {" ".join(words[i : i + _ECHO_WORDS]) for i in range(len(words) - _ECHO_WORDS + 1)}
        for source in context.prompt_texts:
            theirs = normalized_words(source[:_TEXT_LIMIT])
            joined = " ".join(theirs)
            if len(theirs) >= _ECHO_WORDS and any(run in joined for run in runs):
                return "repeats the wording of your instructions"
    return ""


_SELF_NAMING: Final = (("i", "am"), ("my", "name", "is"), ("私", "は"))
"""Words with which a speaker names itself, as :func:`normalized_words` writes them."""


def _claims_another_name(text: str, context: LineContext) -> str:
    """The name of another companion of the conversation that ``text`` gives as the speaker's
    own ("I'm Ostra, the library's archivist." said by Pim: measured, SmolLM2-135M); empty when
    none. Only with the speaker's own name known, so a name shared by two is never refused."""
    mine = context.speaker_name.casefold()
    if not mine:
        return ""
    words = normalized_words(text)
    for name in context.names:
        theirs = normalized_words(name)
        if not theirs or name.casefold() == mine:
            continue
        for opening in _SELF_NAMING:
            run = [*opening, *theirs]
            for i in range(len(words) - len(run) + 1):
                after = words[i + len(run) : i + len(run) + 1]
                if words[i : i + len(run)] == run and after != ["s"]:  # not "I'm Ostra's friend"
                    return name
    return ""


_PERSONS: Final = {
    "i": "P", "you": "P", "we": "P", "me": "P", "us": "P",
    "my": "PP", "your": "PP", "our": "PP", "mine": "PP", "yours": "PP", "ours": "PP",
    "am": "be", "are": "be", "is": "be", "was": "were", "myself": "PS", "yourself": "PS",
}  # fmt: skip
"""Who says it, folded away when lines are compared for copies: "I'm the one making the comment"
copies "You're the one making the comment" (measured, SmolLM2-135M)."""


def begins_an_earlier_sentence(context: LineContext) -> Callable[[str], bool]:
    """Whether a text begins the way a sentence already said in ``context`` began: the same first
    words, or nearly (:data:`COPY_SIMILARITY`), over the shorter of the two and at least three
    words. The earlier sentences are read once, here: the answer is asked as a line streams.

    A first clause voiced before its sentence is complete is too short for the copy check, and
    each piece judged alone passes where the whole sentence would not (SmolLM2-135M, measured:
    "I'm just a moment of your actions," before a copy of its line before; "I was just a chat
    with you," then "I've been gone for a bit.", a near-copy of its sentence before). Such a
    clause waits for its sentence, which the check then judges whole; a false alarm costs only
    the clause's head start."""
    openings = [_said_words(s) for line in context.earlier[-_EARLIER_LIMIT:] for s in sentences(line)]

    def begins(text: str) -> bool:
        words = _said_words(text[:_TEXT_LIMIT])
        for other in openings:
            n = min(len(words), len(other))
            if n >= 3 and (
                words[:n] == other[:n]
                or SequenceMatcher(None, words[:n], other[:n], autojunk=False).ratio() >= COPY_SIMILARITY
            ):
                return True
        return False

    return begins


def _said_words(text: str) -> list[str]:
    """:func:`normalized_words` with the speaker's and the listener's person folded together."""
    return list(_said_words_of(text))


@functools.lru_cache(maxsize=_WORDS_CACHED)
def _said_words_of(text: str) -> tuple[str, ...]:
    return tuple(_PERSONS.get(word, word) for word in _normalized(text))


def normalized_words(text: str) -> list[str]:
    """The words of ``text`` for comparing: NFKC, case-folded, contractions written out,
    punctuation gone; each CJK character is a word of its own (those scripts put no spaces
    between words)."""
    return list(_normalized(text))


@functools.lru_cache(maxsize=_WORDS_CACHED)
def _normalized(text: str) -> tuple[str, ...]:
    flat = unicodedata.normalize("NFKC", text).casefold()
    for contraction, written in _CONTRACTIONS:
        flat = contraction.sub(written, flat)
    out: list[str] = []
    for word in _WORD.findall(flat):
        if _CJK.search(word):
            out.extend(_CJK_OR_RUN.findall(word))
        else:
            out.append(word)
    return tuple(out)


def _size(words: Sequence[str]) -> float:
    return sum(0.5 if _CJK.match(w) else 1.0 for w in words)


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` that hold a word, cut as a streamed line is cut
    (:func:`companion.lines.sentences.split_sentences`: closing quotes kept, abbreviations and
    decimals not cut), so a line and its sentences are judged alike."""
    return list(_sentences_of(text[:_TEXT_LIMIT]))


@functools.lru_cache(maxsize=_WORDS_CACHED)
def _sentences_of(text: str) -> tuple[str, ...]:
    return tuple(p for p in split_sentences(text) if _WORD.search(p))
