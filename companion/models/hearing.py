"""What a line says, as far as the offline model can tell: its kind (a question, a greeting, a
goodbye, a feeling, a statement), its language, the noun phrase it is about, and for a question
its form (favourite, yes/no, why, what it has been doing...), so that :mod:`.phrasing` can
answer it. English and Japanese; names of the people present are never what a line is about,
nor a greeting or a time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from companion.models.lexicon import (
    Language,
    concepts_in,
    content_stems,
    has_cjk,
    is_question,
    sentences,
    topic_phrase,
    topical_word,
    words,
)
from companion.models.persona import Persona

__all__ = [
    "AUX",
    "FEELINGS",
    "GLAD",
    "Heard",
    "asks",
    "hear",
    "is_sombre",
    "name_pattern",
    "reply_language",
    "wellbeing",
]

FEELINGS: Final = (  # the feelings a reaction answers, the most pressing first
    "sad", "angry", "afraid", "flustered", "sleepy", "proud", "excited", "surprised", "amused",
    "wistful", "tender", "happy",
)  # fmt: skip
GLAD: Final = ("proud", "excited", "happy")
_WH: Final = ("what", "why", "how", "who", "where", "when", "which")
AUX: Final = {
    "do": ("I do", "I don't"),
    "does": ("It does", "It doesn't"),
    "did": ("I did", "I didn't"),
    "are": ("I am", "I'm not"),
    "were": ("I was", "I wasn't"),
    "have": ("I have", "I haven't"),
    "can": ("I can", "I can't"),
    "could": ("I could", "I couldn't"),
    "would": ("I would", "I wouldn't"),
    "will": ("I will", "I won't"),
    "should": ("I should", "I shouldn't"),
}
_I_AUX: Final = {"are": "am", "were": "was", "'re": "'m"}
_SWAP_ME: Final = {"your": "my", "yours": "mine", "yourself": "myself", "you": "me"}
_SWAP_BOTH: Final = {**_SWAP_ME, "my": "your", "mine": "yours", "myself": "yourself", "me": "you"}


@dataclass(frozen=True, slots=True)
class Heard:
    """What the message is, as far as the offline model can tell."""

    text: str
    language: Language
    sender_name: str | None
    """The sender's display name when it is a companion (people at a client are not named)."""
    kind: str
    """``question``, ``greeting``, ``farewell``, ``feeling``, ``statement``, ``flat`` or ``empty``."""
    feeling: str | None
    topic: str | None
    """The noun phrase the message is about, ready to say back ("my favourite cake")."""
    head: str | None
    """The last word of ``topic`` ("cake")."""
    concepts: Mapping[str, float]
    stems: frozenset[str]
    form: str | None = None
    """For a question: ``favourite``, ``yesno``, ``wellbeing``, ``about-me``, or its wh-word."""
    aux: str | None = None
    """For a yes/no question to "you": its auxiliary ("do", "are")."""
    echo: str | None = None
    """A short question said back in the first person ("What would I bake?")."""
    yes: str | None = None
    """A yes/no question to "you" answered yes in the first person ("I have seen your cat")."""
    no: str | None = None
    """The same answered no ("I haven't seen your cat")."""
    said_concepts: Mapping[str, float] = field(default_factory=dict)
    """Concepts of the whole message (``concepts`` are the question's, for a question)."""


def hear(
    text: str,
    *,
    sender_name: str | None,
    names: Sequence[str],
    me: Persona,
    from_companion: bool = False,
    context: str = "",
) -> Heard:
    """Read ``text`` (already cleaned) for the parts of a reply. A companion's line is read for
    the known thing it talks about, not for its framing ("Here's my butter tip" is about butter).
    ``context`` is the line before it: "What's yours?" or "What do you think?" is about that."""
    skip = [*names, me.name]
    language: Language = reply_language(text, me.language, skip)
    said = _without_names(text, skip)
    found = concepts_in(text)
    question = any(is_question(s) for s in sentences(text)) and (
        not from_companion or asks(text, me.name)
    )  # a companion's question to someone else is not mine to answer
    focus = _last_question(said) if question else said
    own = frozenset(content_stems(focus) - {n.casefold() for n in skip})
    if from_companion and language == "en":
        topic = topical_word(focus if question else said, skip)
    elif from_companion:  # a companion's Japanese line: only a thing it names, not its framing
        topic = topic_phrase(focus if question else said, skip)
        topic = topic if topic and set(concepts_in(topic)) - {"question"} else None
    else:
        topic = topic_phrase(focus if question else said, skip, swap=True)
    if topic is not None and language == "en" and re.search(r"[\u3040-\u9fff]", topic):
        topic = None  # an English companion does not say back Japanese words
    if topic is not None and language == "ja" and not re.search(r"[\u3040-\u9fff]", topic):
        topic = None  # nor a Japanese one English words
    if topic is not None and {"greeting", "farewell"} & set(concepts_in(topic)):
        topic = None  # "Greetings, friends!" is a greeting, not a thing to talk about
    head = words(topic)[-1] if topic and words(topic) else topic
    feeling = next((f for f in FEELINGS if found.get(f, 0) >= 1), None)
    greeted = "greeting" in found and not from_companion  # companions greet people, not each other
    if not text.strip():
        kind = "empty"
    elif "farewell" in found:
        kind = "farewell"
    elif question and not (greeted and wellbeing(text)):
        kind = "question"
    elif greeted:
        kind = "greeting"
    elif feeling is not None:
        kind = "feeling"
    elif topic:
        kind = "statement"
    else:
        kind = "flat"
    form = aux = echo = None
    yes_no: tuple[str, str] | None = None
    if question:
        form, aux = _question_form(focus, skip)
        echo = _echo_question(focus, skip)
        yes_no = _yes_no(focus, skip) if form == "yesno" else None
        if topic is None and _BACK_REFERENCE.search(focus.casefold()):
            # "What do you think?" is about what was said just before it: the same line's
            # statements, else the line before
            statements = " ".join(s for s in sentences(said) if not is_question(s))
            favourite = re.search(r"\b(?:my|your)\s+(favou?rite\s+[a-z]+)", f"{statements} {context}", re.I)
            if favourite:
                form, topic = "favourite", f"my {favourite.group(1)}"
            else:
                topic = (
                    topical_word(statements, skip)
                    or topic_phrase(statements, skip, swap=True)
                    or topical_word(_without_names(context, skip), skip)
                )
                form = "opinion"
            echo = None
            head = words(topic)[-1] if topic and words(topic) else head
    return Heard(
        text,
        language,
        sender_name,
        kind,
        feeling,
        topic,
        head,
        concepts_in(focus) if question else found,
        own,
        form,
        aux,
        echo,
        yes_no[0] if yes_no else None,
        yes_no[1] if yes_no else None,
        found,
    )


_BACK_REFERENCE: Final = re.compile(
    r"\b(what's yours|and yours|and you|what about you|how about you|what do you think|your take"
    r"|you think so|on your mind)\b"
)


def reply_language(text: str, card: Language, names: Sequence[str] = ()) -> Language:
    """The language a reply to ``text`` is in: the message's own (kana or kanji: Japanese; Latin
    words: English), whatever the card is written in; the card's when the message has no words.
    ``names`` are not words of any language ("What do you make of it, ソラ?" is English)."""
    for name in names:
        if name.strip():
            text = text.replace(name, " ")
    if has_cjk(text):
        return "ja"
    return "en" if words(text) else card


def _without_names(text: str, names: Sequence[str]) -> str:
    """``text`` without the names it calls people by ("Ostra, what..." -> "what...") and without
    self-introductions ("I'm Ostra, the archivist."): neither is what a line is about."""
    for name in names:
        if not name.strip():
            continue
        quoted = re.escape(name)
        text = re.sub(rf"(^|[.!?]\s+){quoted},\s*(\w)", lambda m: m.group(1) + m.group(2).upper(), text)
        text = re.sub(rf",\s*{quoted}(?=\s*[.!?]|$)", "", text)
    named = "|".join(re.escape(n) for n in names if n.strip()) or "(?!)"
    intro = re.compile(
        rf"(?:I should introduce myself\b|(?:.*:\s*)?(?:I'm|I am|My name is)\s+(?:{named})\b)", re.I
    )
    kept = [s for s in sentences(text) if not intro.match(s)]
    return " ".join(kept)


def asks(text: str, name: str) -> bool:
    """Whether a question of ``text`` names ``name`` ("What would you bake, Juniper?")."""
    pattern = name_pattern(name)
    return any(is_question(s) and pattern.search(s.casefold()) for s in sentences(text))


@functools.lru_cache(maxsize=512)
def name_pattern(name: str) -> re.Pattern[str]:
    """``name``, case-folded, as a whole name: not inside a Latin word, but followed by a
    Japanese particle as often as not ("Ostraは"). Remembered (bounded): every line of a turn
    is compared with every name present."""
    return re.compile(rf"(?<![a-z0-9_]){re.escape(name.casefold())}(?![a-z0-9_])")


def _last_question(text: str) -> str:
    asked = [s for s in sentences(text) if is_question(s)]
    return asked[-1] if asked else text


def wellbeing(text: str) -> bool:
    folded = text.casefold()
    return any(
        p in folded for p in ("how are you", "how's it going", "how are things", "how have you been", "元気")
    )


def _question_form(text: str, names: Sequence[str]) -> tuple[str, str | None]:
    sentence = _last_question(text)
    folded = sentence.casefold()
    own = [w for w in words(sentence) if w not in {n.casefold() for n in names}]
    if wellbeing(sentence):
        return "wellbeing", None
    if _DOING.search(folded) or any(p in sentence for p in _DOING_JA):
        return "doing", None
    if re.search(r"\bbest (?:part|bit|thing) (?:of|about) your day\b", folded):
        return "best_day", None
    if re.search(r"\b(favou?rite|like best|love most)|好きな|一番好き", folded):
        return "favourite", None
    if re.search(
        r"\b(who are you|about yourself|what do you do(?: for a living)?\W*$|your story|introduce yourself)"
        r"|誰|だれ|自己紹介|あなたのこと",
        folded,
    ):
        return "about-me", None
    if "好き" in sentence:  # 「星は好き？」: do you like it, yes or no
        return "yesno", None
    if re.search(r"なぜ|どうして|なんで", sentence):
        return "why", None
    if own[:1] and own[0] in AUX and len(own) > 1 and own[1] == "you":
        return "yesno", own[0]
    if own[:1] and own[0] in ("is", "was", "isn't", "does", "did", "can", "could"):
        return "yesno", None
    if re.search(
        r"\b(what do you (?:think|make) of|what do you think about|how do you feel about|what about"
        r"|what do you think)\b",
        folded,
    ) or any(p in sentence for p in ("どう思う", "どうかな", "どう？")):
        return "opinion", None
    wh = next((w for w in own[:3] if w in _WH), None)
    if wh is None and own[:2] == ["tell", "me"]:
        return "about", None
    return wh or "open", None


_DOING: Final = re.compile(
    r"\bwhat (?:have|are|were) you(?: all| two| both| guys| lot)? (?:been )?(?:doing|up to)\b"
    r"|\bwhat did you do (?:today|tonight|yesterday|all day|this)\b|\bhow (?:was|has been|is) your day\b"
)
_DOING_JA: Final = ("何をしてい", "何してた", "何してる", "何をしてた", "どんな一日", "何してい")


def _yes_no(text: str, names: Sequence[str]) -> tuple[str, str] | None:
    """A short "(aux) you ...?" question answered in the first person, yes and no ("Have you
    seen my cat?" -> "I have seen your cat", "I haven't seen your cat"), else ``None``."""
    sentence = _last_question(text)
    for name in names:
        sentence = re.sub(rf",?\s*\b{re.escape(name)}\b\s*,?", " ", sentence, flags=re.I)
    tokens = re.sub(r"[?？!.]", " ", sentence).split()
    low = [t.casefold() for t in tokens]
    if not 3 <= len(tokens) <= 10 or low[0] not in AUX or low[1] != "you":
        return None
    rest = " ".join(_SWAP_BOTH.get(t.casefold(), t) for t in tokens[2:])
    yes, no = AUX[low[0]]
    return f"{yes} {rest}", f"{no} {rest}"


def _echo_question(text: str, names: Sequence[str]) -> str | None:
    """A short "(wh) (aux) you ...?" question said back in the first person, else ``None``."""
    sentence = _last_question(text)
    for name in names:
        sentence = re.sub(rf",?\s*\b{re.escape(name)}\b\s*,?", " ", sentence, flags=re.I)
    sentence = " ".join(sentence.replace("?", " ").replace("？", " ").split()).strip(" ,")
    tokens = sentence.split()
    if not 3 <= len(tokens) <= 9:
        return None
    low = [t.casefold() for t in tokens]
    if low[0] not in _WH or low[1] not in (*AUX, "are", "were") or low[2] != "you":
        return None
    rest = [_SWAP_ME.get(t.casefold(), t) for t in tokens[3:]]
    aux = _I_AUX.get(low[1], low[1])
    return " ".join([tokens[0].capitalize(), aux, "I", *rest]) + "?"


def is_sombre(heard: Heard) -> bool:
    """Whether the line is sad, scared, cross or wistful: no cheering, no exclamations."""
    return heard.feeling in ("sad", "afraid", "angry", "wistful")
