"""Who a companion is, as the offline model can say it: its card read into first-person facts,
a tone, and the places, units and things it knows.

A card describes its companion in the third person ("Kept the Marrow Point light for thirty
winters", "Ostra catalogued the east wing..."). The scripted model answers questions with these
sentences, so they are turned into what the companion would say itself ("I kept the Marrow
Point light for thirty winters"). Sentences that only list adjectives ("Calm, unhurried and
dryly funny") are not facts: they set the tone and are never quoted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from companion.models.lexicon import (
    CONCEPTS,
    Language,
    clean,
    concepts_in,
    content_stems,
    first_concept,
    is_question,
    language_of,
    sentences,
    spread,
    things_in,
    word_set,
    words,
)
from companion.models.phrasebook import GIST
from companion.protocol import Metadata

__all__ = ["Fact", "Persona", "persona_of"]

_IRREGULAR_PAST: Final = word_set(
    """kept built bought made grew took gave left found lost met ran sat spent taught told wrote came
    went became began knew saw won fell felt held heard led read said sold sent stood thought
    understood wore brought caught fought flew drove rode swam sang slept woke"""
)
_MODAL_STARTS: Final = word_set("cannot can can't will won't never always often rarely still")
_VERB_FOLLOWERS: Final = word_set(
    """in on at to with everything all a an the his her its their more less about up out over through
    every one too often always never little much like for from by into around each no nothing
    something anything some"""
)
_COMMON_VERBS: Final = word_set(
    """loves likes hates talks listens asks measures celebrates apologises apologizes knows keeps
    collects watches writes reads sings works lives enjoys prefers speaks tells notices remembers
    forgets believes wants needs makes takes gives cares worries hums counts bakes cooks dreams
    wonders thinks plays paints grows tends sorts catalogues catalogs logs records softens corrects
    teaches learns sees hears feels hopes tries says runs walks waits laughs smiles answers explains
    shares visits misses finds"""
)
_NOT_VERB_S: Final = ("ss", "us", "is", "was", "has", "ous", "ics")
_CONJUNCTIONS: Final = word_set("""and when but because so then while after before until if as or""")
_OBJECT_FOLLOWERS: Final = word_set(
    """and or to with in on at for from by about than as again too herself himself itself"""
)
_UNITS: Final = (
    "grams", "kilograms", "kilos", "cups", "spoons", "teaspoons", "tablespoons", "minutes",
    "seconds", "degrees", "millilitres", "milliliters", "litres", "liters", "ounces", "pounds",
    "metres", "meters", "miles", "pinches",
)  # fmt: skip
_PLACE = re.compile(r"\b(?:the\s+)?[A-Z][\w'’]+(?:\s+(?:&\s+)?[A-Z][\w'’]*\.?)+")
_INTRO_MARKERS: Final = ("i'm ", "i am ", "my name", "私は", "わたし", "僕は", "俺は")
_TONES: Final = (
    ("lively", ("excited", "happy")),
    ("calm", ("calm",)),
    ("dry", ("dry", "amused")),
    ("shy", ("flustered", "afraid")),
    ("warm", ("tender",)),
)


@dataclass(frozen=True, slots=True)
class Fact:
    """One thing the companion can say about itself, ready to say."""

    text: str
    source: str
    """``story``, ``personality`` or ``sample``."""
    stems: frozenset[str]
    concepts: frozenset[str]

    def relevance(self, own: Iterable[str], about: Mapping[str, float]) -> float:
        """How much this fact has to do with words (stems) and concepts of a line."""
        shared = len(self.stems & set(own))
        related = sum(min(weight, 1.0) for concept, weight in about.items() if concept in self.concepts)
        return shared + 2.0 * related


@dataclass(frozen=True, slots=True)
class Persona:
    """A companion as its card describes it, read once per card."""

    id: str
    name: str
    language: Language
    facts: tuple[Fact, ...]
    tone: str
    """``lively``, ``calm``, ``dry``, ``shy``, ``warm`` or ``plain``: how lines are voiced."""
    places: tuple[str, ...]
    """Proper-noun places from the story ("the Halden City Library")."""
    units: tuple[str, ...]
    """Measuring words the card uses ("grams")."""
    things: Mapping[str, tuple[str, ...]]
    """Things the card names, by concept ("food": ("flour", "butter", "cake"))."""
    intro: str | None
    """The sample's own self-introduction, when it has one ("Hello! I'm kyoko.")."""
    sample: str
    topics: tuple[str, ...] = ()
    """What the card is about ("baking", "sky"...), the most named first."""
    gist: tuple[Fact, ...] = ()
    """Facts in the other language (:data:`.phrasebook.GIST`, by ``topics``): what the companion
    says of itself when a message is not in its card's language."""
    traits: tuple[Fact, ...] = ()
    """The personality and the sample read as facts: what a message may relate to (a baker
    hears "grams"), never said."""

    def facts_in(self, language: Language) -> tuple[Fact, ...]:
        """The facts to tell in ``language``: the card's own, or the gist in the other one."""
        return self.facts if language == self.language else self.gist

    def relevance(self, text: str) -> float:
        """How much a line has to do with this companion (the best fact's relevance)."""
        own = content_stems(text)
        about = spread(concepts_in(text))
        about.pop("question", None)
        return max((f.relevance(own, about) for f in (*self.facts, *self.traits)), default=0.0)


def persona_of(meta: Metadata, role: str = "") -> Persona:
    """The persona of a card's metadata (cached: cards do not change while a node runs)."""
    return _persona(meta.id, meta.name, meta.personality, meta.story, meta.sample, role)


@functools.lru_cache(maxsize=256)
def _persona(cid: str, name: str, personality: str, story: str, sample: str, role: str) -> Persona:
    name, personality, story, sample, role = (clean(t) for t in (name, personality, story, sample, role))
    language = language_of(personality, story, sample)
    pronoun = _pronoun(f"{story} {personality}")
    facts: list[Fact] = []
    for sentence in sentences(story):
        if language == "ja":
            said = _first_person_ja(sentence, name)
        else:
            said = _first_person(sentence, name, pronoun, habit=False)
        if said:
            facts.append(_fact(said, "story"))
    traits: list[Fact] = []
    if language == "en":  # Japanese personalities are adjectives: tone, nothing to relate to
        for sentence in sentences(personality):
            said = _first_person(sentence, name, pronoun, habit=True)
            if said:
                traits.append(_fact(said, "personality"))
    for sentence in sentences(sample):
        count = len(words(sentence)) if language == "en" else len(sentence) // 3
        if count >= 4 and not is_question(sentence) and "greeting" not in concepts_in(sentence):
            traits.append(_fact(sentence, "sample"))
    tone = _tone(personality) or _tone(role) or "plain"
    everything = f"{story} {personality} {sample}"
    places = tuple(dict.fromkeys(p for p in _PLACE.findall(story) if name not in p))
    units = tuple(u for u in _UNITS if re.search(rf"\b{u}\b", f"{everything} {role}", re.I))
    things = {c.name: tuple(things_in(c.name, [everything])) for c in CONCEPTS if c.things}
    folded = sample.casefold()
    intro = None
    if name.casefold() in folded or any(m in folded for m in _INTRO_MARKERS):
        kept = [s for s in sentences(sample) if not is_question(s)]
        intro = ("" if language == "ja" else " ").join(kept) or None
    topics = _topics(f"{story} {personality} {sample}")
    other: Language = "en" if language == "ja" else "ja"
    gist = [_fact(text, "gist") for topic in (*topics, "")[:3] for text in GIST[other].get(topic, ())]
    return Persona(
        cid,
        name,
        language,
        tuple(facts),
        tone,
        places,
        units,
        {k: v for k, v in things.items() if v},
        intro,
        sample,
        topics,
        tuple(dict.fromkeys(gist)),
        tuple(traits),
    )


_TOPICS: Final = ("baking", "sky", "sea", "books", "history", "music", "animals", "weather", "food")


def _topics(text: str) -> tuple[str, ...]:
    """The topics ``text`` names, the most telling first (baking before food)."""
    found = concepts_in(text)
    return tuple(t for t in _TOPICS if found.get(t, 0) >= 1)


def _tone(text: str) -> str | None:
    """The tone of the first tone word in ``text`` ("Sardonic, precise and secretly kind" is dry)."""
    concept = first_concept(text, [c for _, concepts in _TONES for c in concepts])
    return next((tone for tone, concepts in _TONES if concept in concepts), None)


def _fact(text: str, source: str) -> Fact:
    text = text.strip()
    if text and text[-1] not in ".!?。！？":
        text += "。" if language_of(text) == "ja" else "."
    about = spread(concepts_in(text))
    about.pop("question", None)
    return Fact(
        text, source, frozenset(content_stems(text)), frozenset(c for c, w in about.items() if w >= 0.5)
    )


def _pronoun(text: str) -> str | None:
    """The pronoun a card uses for its companion (she, he, it, they), if it uses one."""
    folded = f" {text.casefold()} "
    counts = {
        "she": folded.count(" she ") + folded.count(" her "),
        "he": folded.count(" he ") + folded.count(" his ") + folded.count(" him "),
        "it": folded.count(" its "),
    }
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else None


def _de_s(word: str) -> str:
    """The first-person form of a third-person verb ("watches" -> "watch", "carries" -> "carry")."""
    low = word.casefold()
    irregular = {"is": "am", "has": "have", "does": "do", "goes": "go", "'s": "'m"}
    if low in irregular:
        return irregular[low]
    if low.endswith(_NOT_VERB_S) or not low.endswith("s") or len(low) < 3:
        return word
    if low.endswith("ies") and len(low) > 4:
        return word[:-3] + "y"
    if low.endswith(("ches", "shes", "sses", "xes", "zzes", "oes")):
        return word[:-2]
    return word[:-1]


_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]+|\s+")


def _first_person(sentence: str, name: str, pronoun: str | None, *, habit: bool) -> str | None:
    """A card sentence as the companion would say it, or ``None`` if it is only tone.

    ``habit`` marks personality sentences: there "is warm and curious" is tone, not a fact.
    The companion's name and pronoun become I/me/my; a sentence that starts with its verb
    ("Kept the light...", "Talks in metaphors...") gets an "I"; verbs that follow "I" and the
    verbs listed after the first lose their third-person "s".
    """
    tokens = _TOKEN.findall(sentence)
    own = name.casefold()
    subjects = {own} | ({pronoun} if pronoun in ("she", "he", "it") else set())
    possessives = {f"{own}'s"} | ({"she": {"her"}, "he": {"his"}, "it": {"its"}}.get(pronoun or "", set()))
    out: list[str] = []
    converted = main_subject = after_i = False
    for index, token in enumerate(tokens):
        if token.isspace():
            out.append(token)
            continue
        low = token.casefold().replace("’", "'")
        nxt, prev = _next_word(tokens, index), _prev_word(tokens, index)
        opening = prev is None or prev in (".", "!", "?")
        if after_i and token[:1].isalpha():
            token = _de_s(token)
            low = token.casefold()
        after_i = False
        if low in possessives:
            if low == "her" and (nxt is None or not nxt[:1].isalpha() or nxt.casefold() in _OBJECT_FOLLOWERS):
                out.append("me")
            else:
                out.append("My" if opening else "my")
            converted = True
        elif low in subjects and (low != "it" or _verbish(nxt)):
            objective = (
                prev is not None
                and prev[:1].isalpha()
                and prev.casefold() not in _CONJUNCTIONS
                and not _verbish(nxt)
            )
            out.append("me" if objective else "I")
            after_i = not objective
            main_subject = main_subject or (not objective and (prev is None or prev == ","))
            converted = True
        elif low in ("she's", "he's", f"{own}'s") and low.split("'")[0] in subjects:
            out.append("I'm")
            converted = True
        elif (pronoun, low) in (("he", "him"), ("she", "her")):
            out.append("me")
            converted = True
        elif low in ("herself", "himself", "itself") and low.startswith(
            {"she": "her", "he": "him", "it": "it"}.get(pronoun or "", "-")
        ):
            out.append("myself")
            converted = True
        else:
            out.append(token)
    text = "".join(out)
    first_words = [t for t in tokens if t[:1].isalpha()]
    if first_words and not main_subject and first_words[0].casefold() not in subjects:
        first = first_words[0].casefold()
        second = first_words[1].casefold() if len(first_words) > 1 else ""
        if (
            first in _IRREGULAR_PAST
            or first in _MODAL_STARTS
            or (first.endswith("ed") and second in _VERB_FOLLOWERS)
            or (first.endswith("s") and (first in _COMMON_VERBS or second in _VERB_FOLLOWERS))
        ):
            lead = first_words[0]
            at = text.index(lead)
            verb = first if first in _IRREGULAR_PAST | _MODAL_STARTS else _de_s(first)
            text = f"{text[:at]}I {verb}{text[at + len(lead) :]}"
            converted = True
    if not converted:
        return None if habit else text  # tone, or a fact about the world as it is
    text = _coordinated_verbs(text)
    if habit and re.match(r"I (am|'m)\b", text):
        return None  # "Aki is warm, curious and a little stubborn": tone, not a fact
    return text[:1].upper() + text[1:]


def _verbish(word: str | None) -> bool:
    """Whether ``word`` looks like a verb (after a subject): "is", "carried", "speaks"."""
    if word is None:
        return False
    low = word.casefold()
    return (
        low in ("is", "was", "has", "had", "does", "did", "can", "cannot", "will", "would", "never", "simply")
        or low in _IRREGULAR_PAST
        or low.endswith(("s", "ed"))
    )


def _next_word(tokens: list[str], index: int) -> str | None:
    for token in tokens[index + 1 :]:
        if not token.isspace():
            return token
    return None


def _prev_word(tokens: list[str], index: int) -> str | None:
    for token in reversed(tokens[:index]):
        if not token.isspace():
            return token
    return None


_COORDINATED = re.compile(r"(,\s+(?:and\s+)?|(?<=[a-rt-z])\s+and\s+)([a-z]+s)\b(\s+\w+)?")


def _coordinated_verbs(text: str) -> str:
    """Verbs listed after the first keep the first person: "I listen ..., and asks" -> "ask"."""

    def fix(match: re.Match[str]) -> str:
        joint, verb, after = match.group(1), match.group(2), match.group(3) or ""
        follower = after.strip().casefold()
        if verb in _COMMON_VERBS or follower in _VERB_FOLLOWERS:
            return f"{joint}{_de_s(verb)}{after}"
        return match.group(0)

    return _COORDINATED.sub(fix, text)


_JA_SELF: Final = re.compile(r"(?:彼女|彼)(?=[はがのもをにと])")


def _first_person_ja(sentence: str, name: str) -> str | None:
    """A Japanese card sentence in the companion's own voice: its name and the card's 彼女 / 彼
    become 私 (a card tells its companion's story in the third person; the companion tells its
    own in the first)."""
    text = sentence
    for particle in "はがのもをにと":
        text = text.replace(f"{name}{particle}", f"私{particle}")
    return _JA_SELF.sub("私", text).strip() or None
