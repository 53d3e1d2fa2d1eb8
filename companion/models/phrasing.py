"""Replies in character for the offline model: what was said, what the instructions ask, who
the companion is, put into one line.

A line has up to five parts, each chosen from what the message is (a question, a greeting, a
goodbye, a feeling, a statement about something) and what the matched instructions ask
(introduce yourself, sign off, ask a question, correct, apologise, share a tip, offer a new
topic):

1. an opening that reacts to the message, naming the noun phrase it is about when there is one
   (said back whole, "my"/"your" swapped, never quoted);
2. for a question, an answer: the companion's fact (story, personality, sample) most related to
   the question's words, framed for the question's form (favourite, yes/no, why, what...);
3. what the instruction asks (an introduction, a correction citing a place from the story, a
   tip in the card's units, a new topic from the source the instruction names);
4. a follow-up question to someone else present, when the instruction asks for one (never to
   the speaker itself);
5. the closing stage's words (winding down, or goodbye).

Before them, what a knowledge tool found this turn (a dice roll's total): a result kept to
itself is no result to the person who asked. A sad, scared or cross line gets a gentle reaction
and a question back instead of parts 2 to 4, and the companions stay gentle after it.

Templates come in English and Japanese; the message's language decides which (a Japanese
message gets Japanese from an English card), and the card's facts are told in its own language
only (in the other one, the gist of its topics). Nothing of a companion's earlier lines in the
conversation is said again: no sentence, no fact, no template's frame with other words in it
(:func:`.repeats.said_before`, :func:`_unsaid`). The tone (lively, calm, dry, shy, warm) comes from the
personality and only changes interjections and punctuation. Every choice among templates and
facts goes through the caller's seeded generator.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from companion.models.hearing import AUX, FEELINGS, GLAD, Heard, is_sombre, wellbeing
from companion.models.lexicon import (
    Language,
    concepts_in,
    content_stems,
    cue_concepts,
    numbers,
    sentences,
    spread,
    things_in,
    topical_word,
)
from companion.models.persona import Fact, Persona
from companion.models.phrasebook import ACTIVITIES, EN, INTERJECTIONS, JA, UNITS_JA
from companion.models.repeats import is_phrase, plain, said_before
from companion.protocol import ClosingStage

__all__ = ["Plan", "compose", "plan_of"]

# --- what the instructions ask -------------------------------------------------------------------------

_INTENTS: Final = (
    (
        "farewell",
        r"good ?bye|sign off|farewell|close the conversation|say bye|wrap up|parting"
        r"|さようなら|別れ|締めくく",
    ),
    ("introduce", r"introduc|yourself|自己紹介|名乗"),
    ("correct", r"\bcorrect|fix the (?:claim|mistake)|set .* straight|訂正"),
    ("apologise", r"apologi[sz]|\bsorry\b|謝"),
    ("tip", r"\btip\b|advice|how to|コツ"),
    ("new_topic", r"new topic|change the subject|another topic|new subject|話題を変"),
    ("detail", r"detail|\bfact\b|trivia|footnote|豆知識"),
    ("ask", r"\bask\b|question|質問|聞いて|尋ね"),
    ("excite", r"excite|enthusias|energy|cheer|ワクワク"),
    ("brief", r"brief|short|one sentence|簡潔|短く"),
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the matched instructions ask of the line."""

    intents: frozenset[str]
    query: str
    """The instructions' words: they steer which fact is told."""
    like: str | None = None
    """"like handing over the night watch": a farewell's image, as a gerund phrase."""
    role: str | None = None
    """"as the library's archivist": how an introduction names the companion."""
    source: str | None = None
    """"from your logbook of stars": where a new topic comes from, said as "my logbook of stars"."""
    ask_clause: str | None = None
    """"ask someone what they would bake": the question to ask, as "What would you bake"."""
    ties: tuple[str, ...] = ()
    """"tie it to the sea or the night sky": what a follow-up question ties the topic to."""
    unit: str | None = None
    with_fact: bool = False
    one_sentence: bool = False
    thing_concepts: tuple[str, ...] = ()
    """Concepts of things the instruction is about ("the food that was mentioned")."""
    things: tuple[str, ...] = field(default=())
    """Things named in the card's parameters this turn (e.g. ``foods_mentioned``)."""


def plan_of(instructions: Sequence[str], params: Mapping[str, object] | None = None) -> Plan:
    """The plan of the matched instructions (the speaking tool's first)."""
    text = " ".join(i.strip() for i in instructions if i.strip())
    folded = text.casefold()
    intents = frozenset(name for name, pattern in _INTENTS if re.search(pattern, folded))
    like = _match(r"\b(?:like|as if|as though)\s+((?:[a-z]+ing)\b[^,.;]*)", text)
    if like:
        like = re.split(r"\s+(?:with|in one|and then)\b", like)[0].strip()
    role = _match(r"\bas\s+((?:the|a|an)\s+[^,.;]+)", text)
    if role and like and role in like:
        role = None
    source = _match(r"\bfrom\s+(your\s+[^,.;]+)", text)
    if source:
        source = "my " + source.split(" ", 1)[1]
    ask_clause = None
    clause = re.search(
        r"\bask\s+(?:someone|somebody|others|them|the others|everyone|a friend)?\s*"
        r"(what|how|why|which|where|when|who|whether|if)\s+(they|he|she)\s+(would|will|could|do|did|are|like|think)\s+([^,.;]+)",
        folded,
    )
    if clause:
        wh, _, aux, rest = clause.groups()
        if wh in ("whether", "if"):
            ask_clause = f"Would you {rest.strip()}"
        else:
            ask_clause = f"{wh.capitalize()} {aux} you {rest.strip()}"
    ties: tuple[str, ...] = ()
    tie = _match(r"\btie (?:it|this|them) (?:to|with|in with)\s+([^,.;]+)", text)
    if tie:
        ties = tuple(t.strip() for t in re.split(r"\s+or\s+|\s+and\s+", tie) if t.strip())
    unit = _match(
        r"\bin\s+(grams|kilograms|cups|minutes|degrees|spoons|litres|liters|ounces|pounds)\b", folded
    )
    things_about = cue_concepts(text)
    thing_concepts = tuple(c for c in ("food", "animals", "rooms", "colours") if c in things_about)
    named: list[str] = []
    for value in (params or {}).values():
        if isinstance(value, list):
            named.extend(v for v in value if isinstance(v, str) and v.strip())
    return Plan(
        intents,
        text,
        like,
        role,
        source,
        ask_clause,
        ties,
        unit,
        bool(re.search(r"\bwith one\b.*\b(fact|footnote|detail|tip)\b", folded)),
        "one sentence" in folded,
        thing_concepts,
        tuple(named),
    )


def _match(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text, re.I)
    return found.group(1).strip() if found else None


# --- composing -----------------------------------------------------------------------------------------


@dataclass
class _Line:
    persona: Persona
    heard: Heard
    plan: Plan
    rng: random.Random
    closing: ClosingStage
    ask_to: str | None
    used: frozenset[str]
    failed: tuple[str, ...] = ()
    spoken: tuple[str, ...] = ()
    """My earlier lines in this conversation, :func:`.repeats.plain` (names masked): never said again."""
    names: tuple[str, ...] = ()
    learned: tuple[tuple[str, object], ...] = ()
    before: frozenset[str] = frozenset()
    """The sentences of my earlier lines, :func:`.repeats.plain`."""
    sombre: bool = False
    """The person's last line was sad, scared or cross: no cheering, whoever spoke since."""
    others: tuple[str, ...] = ()
    """The others' lines of this conversation, :func:`.repeats.plain`: their wording is not echoed when
    another will do."""
    said: list[str] = field(default_factory=list)
    told: set[str] = field(default_factory=set)
    must_ask: bool = False
    """Nothing new to tell: the line ends with a question instead."""

    @property
    def language(self) -> Language:
        return self.heard.language

    @property
    def templates(self) -> Mapping[str, tuple[str, ...]]:
        return JA if self.language == "ja" else EN

    def pick(self, slot: str, **fields: str) -> str:
        """A template of ``slot`` filled with ``fields``: one I have not said in this conversation
        if there is one (the same frame with other words in it counts as said)."""
        pool = self.templates.get(slot) or EN[slot]
        usable = [t for t in pool if _fits(t, fields)] or list(pool)
        fresh = [t for t in usable if not said_before(t, self.spoken)]
        unheard = [t for t in fresh if not said_before(t, self.others)]
        template = self.rng.choice(unheard or fresh or usable)
        return _fill(template, fields)

    def pick_new(self, slot: str, **fields: str) -> str:
        """Like :meth:`pick`, but empty once every template of ``slot`` has been said: a part
        the line can do without (a second tip in the same words is no tip)."""
        return self.fresh(slot, **fields) or ""

    def fresh(self, slot: str, others_ok: bool = True, /, **fields: str) -> str | None:
        """Like :meth:`pick`, but ``None`` once every template of ``slot`` has been said (by me,
        or with ``others_ok`` false by anyone: words another said are then no fallback)."""
        pool = self.templates.get(slot) or EN[slot]
        usable = [t for t in pool if _fits(t, fields) and not said_before(t, self.spoken)]
        unheard = [t for t in usable if not said_before(t, self.others)]
        if not others_ok:
            usable = unheard
        return _fill(self.rng.choice(unheard or usable), fields) if usable else None

    def voc(self, chance: float = 0.5) -> str:
        name = self.heard.sender_name
        if not name or self.rng.random() >= chance:
            return ""
        return f"{name}、" if self.language == "ja" else f", {name}"

    def fact(self, query: str = "", *, need: bool = True, least: float = 0.0) -> Fact | None:
        """The fact most related to the message (and ``query``) that I have not told in this
        conversation nor in this line (a story told twice is a phrase repeated); ``None`` when
        none is left or none relates by ``least`` (unless ``need``)."""
        own = set(self.heard.stems) | content_stems(query)
        about = spread({**concepts_in(query), **self.heard.concepts})
        about.pop("question", None)
        about.pop("greeting", None)
        facts = self.persona.facts_in(self.language)
        pool = [f for f in facts if f.text not in self.told and f.text not in self.used]
        if not pool:
            return None
        scored = []
        for index, fact in enumerate(pool):
            score = fact.relevance(own, about)
            scored.append((score, self.rng.random() * 0.5, -index, fact))
        scored.sort(key=lambda s: (s[0] + s[1], s[2]), reverse=True)
        score, _, _, best = scored[0]
        if score <= least and not need:
            return None
        self.told.add(best.text)
        return best

    def relates(self) -> float:
        about = spread(dict(self.heard.concepts))
        about.pop("question", None)
        about.pop("greeting", None)
        facts = self.persona.facts_in(self.language)
        return max((f.relevance(self.heard.stems, about) for f in facts), default=0.0)


def compose(
    persona: Persona,
    heard: Heard,
    plan: Plan,
    *,
    rng: random.Random,
    closing: ClosingStage = "none",
    ask_to: str | None = None,
    used: Sequence[str] = (),
    failed: Sequence[str] = (),
    spoken: Sequence[str] = (),
    names: Sequence[str] = (),
    learned: Sequence[tuple[str, object]] = (),
    sombre: bool = False,
    heard_before: Sequence[str] = (),
) -> str:
    """One reply in ``persona``'s voice to ``heard``, doing what ``plan`` asks.

    ``ask_to`` is the display name of someone present (never the speaker) to ask a follow-up
    question; ``used`` are facts the companion told in this conversation (told again only if
    nothing else fits); ``failed`` describes instructed actions that were refused or failed this
    turn (the line says so); ``spoken`` are my earlier lines of this conversation: no sentence of
    them is said again, nor the same frame with other words in it; ``names`` are the names of
    everyone present (masked when lines are compared); ``learned`` are ``(tool, output)`` of the
    knowledge tools called this turn: their results are said; ``sombre`` says the person's last
    line was sad, scared or cross (the companions stay gentle until they say otherwise);
    ``heard_before`` are the others' lines (their wording is avoided when another will do).
    """
    masked = tuple(plain(s, names) for s in spoken)
    line = _Line(
        persona,
        heard,
        plan,
        rng,
        closing,
        ask_to,
        frozenset(used),
        tuple(failed),
        masked,
        tuple(names),
        tuple(learned),
        frozenset(plain(s, names) for old in spoken for s in sentences(old)),
        sombre or is_sombre(heard),
        tuple(plain(s, names) for s in heard_before),
    )
    if closing == "closing" or "farewell" in plan.intents:
        _farewell(line)
    else:
        _reply(line)
        if closing == "pre-closing":
            line.said.append(line.fresh("pre-closing") or "")
    text = _unsaid(_voice(line), line)
    if not text:  # everything I meant to say, I had said: something new, or a question
        fact = line.fact()
        line.said = [fact.text] if fact is not None else [_follow_up(line) or line.pick("flat", voc="")]
        text = _unsaid(_voice(line), line) or _voice(line)
    return text


def _reply(line: _Line) -> None:
    heard, plan = line.heard, line.plan
    introduce = "introduce" in plan.intents and not _named_myself(line) and not is_sombre(heard)
    if line.learned:
        line.said.extend(_results(line))
    if heard.kind == "question":
        if "greeting" in heard.said_concepts:
            line.said.append(line.pick("greeting", voc=line.voc()))
        if is_sombre(heard) and heard.feeling:
            line.said.append(line.pick(heard.feeling, voc=""))  # "lost since Tuesday": sympathy first
    elif heard.kind == "feeling" and "apologise" in plan.intents:
        pass  # "No harm done" and then "sorry, my mistake" contradict each other
    elif line.learned:
        pass  # the result is the reaction
    elif not (introduce and heard.kind in ("greeting", "flat", "empty") and _intro(line)):
        line.said.append(_opening(line))
        if (
            heard.kind == "feeling"
            and heard.feeling in ("sad", "wistful")
            and heard.topic
            and not set(concepts_in(heard.topic)) & set(FEELINGS)
        ):
            line.said.append(line.pick("tell_me", topic=heard.topic))
    if introduce:
        intro = _intro(line)
        if heard.kind in ("greeting", "flat", "empty") and intro:
            line.said.append(intro)
            line.told.update(f.text for f in line.persona.facts if f.text in intro)
        else:
            role = f", {plan.role}" if plan.role and line.language == "en" else ""
            line.said.append(line.pick("introduce", name=line.persona.name, role=role))
    if heard.kind == "question":
        line.said.append(_answer(line))
    _tried(line)
    body = _instructed(line)
    if heard.kind == "feeling" and heard.feeling in GLAD and not heard.sender_name and not body:
        # good news from a person: share it, and ask them about it
        line.said.append(line.fresh("glad_ask") or "")
        return
    if is_sombre(heard) and heard.kind == "feeling":
        # someone is sad or scared: no tip, no story of mine, no cheerful question; ask them
        question = line.fresh("comfort")
        if question:
            line.said.append(question)
        return
    if body:
        line.said.append(body)
    elif heard.kind != "question" and "brief" not in plan.intents and not line.learned:
        # while someone is sad, only a fact that has to do with it
        query = "" if line.sombre else plan.query
        fact = line.fact(query, need=introduce and not line.sombre, least=1.0 if line.sombre else 0.0)
        if fact is not None:
            linked = fact.relevance(heard.stems, spread(dict(heard.concepts))) > 0
            slot = "related" if linked and not introduce else "told"
            line.said.append(line.pick(slot, fact=_lower_first(fact.text), Fact=fact.text))
            body = fact.text
    wanted = "ask" in plan.intents or ("excite" in plan.intents and not line.sombre) or line.must_ask
    if wanted or (heard.kind not in ("question", "farewell") and line.rng.random() < (0.3 if body else 0.6)):
        question = _follow_up(line)
        if question:
            line.said.append(question)


def _opening(line: _Line) -> str:
    heard = line.heard
    voc = line.voc()
    topic = heard.topic or ""
    fields = {"voc": voc, "topic": topic, "Topic": _upper_first(topic)}
    if heard.kind == "greeting":
        return line.pick("wellbeing" if wellbeing(heard.text) else "greeting", **fields)
    if heard.kind == "farewell":
        return line.pick("farewell_heard", **fields)
    if heard.kind == "empty":
        return line.pick("empty", **fields)
    if heard.kind == "feeling" and heard.feeling:
        return line.pick(heard.feeling, **fields)
    if topic:
        if "weather" in concepts_in(topic):
            return line.pick("weather", **fields)
        if line.sombre:
            return line.pick("flat" if heard.sender_name else "gentle", **fields)
        if line.persona.relevance(topic) >= 2:
            return line.pick("known", **fields)
        return line.pick("topical", **fields)
    return line.pick("flat", **fields)


def _answer(line: _Line) -> str:
    """An answer to the question: a frame for its form around the most related fact."""
    heard, persona = line.heard, line.persona
    topic = heard.topic or ""
    voc = line.voc(0.35)
    fact = line.fact(line.plan.query if "new_topic" in line.plan.intents else "")
    if line.sombre and heard.sender_name and heard.form in ("opinion", "what", "open", "about"):
        # a companion asks me about the person's trouble: no verdict on it, a kind word
        return line.pick("hope", voc=voc)
    if heard.form in ("doing", "best_day"):
        topic_of_mine = persona.topics[0] if persona.topics else ""
        doing = ACTIVITIES[line.language].get(topic_of_mine, ACTIVITIES[line.language][""])
        said = line.pick(heard.form, doing=doing, Doing=_upper_first(doing))
        return said  # the day, not the life story
    if heard.form == "yesno" and heard.yes and heard.no:
        related = line.relates()
        said = line.pick(
            "yes_said" if related >= 1 else "no_said",
            Said=_upper_first(heard.yes if related >= 1 else heard.no),
            said=heard.yes if related >= 1 else heard.no,
        )
        return f"{said} {fact.text}" if fact and related >= 1 else said
    if fact is None and heard.form not in ("wellbeing", "yesno"):
        line.must_ask = True  # everything I know is said: ask instead of telling it again
        return line.pick("exhausted", voc=voc, topic=topic or ("that" if line.language == "en" else "それ"))
    text = fact.text if fact else ""
    related = line.relates()
    if not text:  # nothing left to tell: the answer's frame alone
        if heard.form == "wellbeing":
            return line.pick("wellbeing", voc=voc)
        return line.pick("yesno_open_bare", voc=voc)
    fields = {
        "voc": voc,
        "topic": topic,
        "Topic": _upper_first(topic) or "That",
        "head": heard.head or topic,
        "fact": _lower_first(text),
        "Fact": text,
        "name": persona.name,
        "Echo": heard.echo or (f"{_upper_first(topic)}?" if topic else ""),
    }
    form = heard.form
    if form == "wellbeing":
        return " ".join(p for p in (line.pick("wellbeing", **fields), text) if p)
    if form == "about-me":
        return line.pick("about_me", **fields)
    if form == "favourite":
        fields["Topic"] = _upper_first(topic) or "A favourite"
        concept = next((c for c in persona.things if c in heard.concepts), None)
        things = [t for t in persona.things.get(concept or "", ()) if t != (heard.head or "").casefold()]
        if things and line.language == persona.language:  # the card's things are in its words
            return line.pick("fav_known", thing=line.rng.choice(things), **fields)
        if related >= 1:
            return line.pick("fav_related", **fields)
        head = heard.head or "it"
        fields["Fact_and_head"] = f"{text.rstrip('.!?。')}, and {head} never came into it." if text else ""
        if line.language == "ja":
            fields["Fact_and_head"] = text
        return line.pick("fav_none", **fields)
    if form == "yesno":
        if heard.aux in AUX:
            yes, no = AUX[heard.aux]
            fields.update(
                aux_yes=yes, aux_no=no, aux_no_low=no[:1].lower() + no[1:] if not no.startswith("I") else no
            )
            return line.pick("yes" if related >= 1 else "no", **fields)
        if line.language == "ja":  # 「好き？」: yes when it is mine to like
            return line.pick("yes" if related >= 1 else "no", **fields)
        return line.pick("yesno_open", **fields)
    if form == "why":
        if not re.search(r"\byou\b|あなた|きみ|君", heard.text, re.I):  # "why do stars twinkle?"
            return line.pick("why_world" if related >= 1 else "why_unknown", **fields)
        return line.pick("why", **fields)
    if form == "about":
        return line.pick("about", **fields)
    if form == "opinion":
        if not topic:
            return line.pick("opinion_open", **fields)
        return line.pick("opinion_related" if related >= 1 else "opinion_unrelated", **fields)
    thing = _thing_for(line)
    if heard.echo and thing and form in ("what", "which"):
        return line.pick("would_thing", thing=thing, **fields)  # "What would I bake? Cake."
    if re.match(r"(the \w+ (?:part|thing|moment) of )?my\b", topic, re.I):
        return line.pick("personal", **fields)  # "the best part of my day": mine to answer
    if related >= 1:
        return line.pick("answer_related", **fields)
    if heard.echo:
        return line.pick("answer_unrelated_echo", **fields)
    return line.pick("answer_unrelated", **fields)


def _thing_for(line: _Line) -> str | None:
    """A thing of mine the question is about ("What would you bake?": something from my card's
    foods), in the reply's language; ``None`` when my card names none."""
    if line.language != line.persona.language:
        return None
    about = spread(dict(line.heard.concepts))
    for concept, things in line.persona.things.items():
        if about.get(concept, 0) >= 0.3 and things:
            heard = (line.heard.head or "").casefold()
            pool = [t for t in things if t != heard]
            return line.rng.choice(pool) if pool else None
    return None


def _instructed(line: _Line) -> str | None:
    """What the instruction asks beyond a reply, or ``None``."""
    plan, persona, heard = line.plan, line.persona, line.heard
    intents = plan.intents
    unit = plan.unit or (persona.units[0] if persona.units else None)
    amount = str(_amount(line, unit))
    if unit and line.language == "ja":
        unit = UNITS_JA.get(unit, unit)
    if "correct" in intents:
        claim = _claim(heard)
        place = persona.places[0] if persona.places else "a good reference book"
        parts = [
            line.pick_new("correct", voc=line.voc(), claim=f"{claim} " if claim else "that "),
            line.pick_new("cite", place=place, Place=_upper_first(place)),
        ]
        return " ".join(parts)
    if "apologise" in intents:
        parts = [line.pick_new("apologise", voc=line.voc())]
        retry = line.pick_new("retry", amount=amount, unit=unit) if unit else line.pick_new("retry_plain")
        parts.append(retry)
        return " ".join(parts)
    if "tip" in intents:
        thing = _thing(line)
        if unit:
            return line.pick_new("tip", thing=thing, amount=_upper_first(amount), unit=unit)
        return line.pick_new("tip_plain", thing=thing)
    if "new_topic" in intents and not line.sombre:  # no change of subject on someone's sorrow
        fact = line.fact(plan.query)
        if fact is None:
            return None
        fields = {"fact": _lower_first(fact.text), "Fact": fact.text}
        if plan.source and line.language == "en":
            return line.pick_new("new_topic", source=plan.source, **fields)
        return line.pick_new("new_topic_plain", **fields)
    if "detail" in intents and heard.kind != "question" and not line.sombre:
        fact = line.fact(plan.query)
        if fact is None:
            return None
        return line.pick_new("detail", fact=_lower_first(fact.text), Fact=fact.text)
    return None


def _follow_up(line: _Line) -> str | None:
    """A question for someone else present (``ask_to``), or ``None`` when nobody is there."""
    who = line.ask_to
    if not who:
        return None
    heard, plan = line.heard, line.plan
    topic = heard.topic or ""
    if not topic and line.language == "en":
        mine = topical_word(" ".join(line.told)) if line.told else None
        if mine:
            topic = mine if mine.split()[0] in ("a", "an", "the") else f"the {mine}"
    if topic.startswith(("my ", "My ")) and line.language == "en":
        topic = "the " + topic.split(" ", 1)[1]  # "my favourite cake" is not theirs to judge
    fields = {"who": who, "Who": who, "topic": topic}
    if plan.ask_clause and line.language == "en" and not line.sombre:
        asked = line.fresh("ask_clause", clause=plan.ask_clause, **fields)
        if asked:
            return asked
    folded = topic.casefold()
    ties = [t for t in plan.ties if t.casefold() not in folded and folded not in t.casefold()]
    slots = [
        ("ask_fav", heard.form == "favourite"),
        ("ask_help", line.sombre),
        ("ask_tie", bool(topic and ties and line.language == "en" and not line.sombre)),
        ("ask_topic", bool(topic)),
        ("ask_open", True),
    ]
    # The first kind of question nobody has asked in these words yet, else the first I have not:
    # another's question asked again word for word is a parrot's, and the engine says only
    # sentences nobody said (companion.lines.check).
    for others_ok in (False, True):
        for slot, fits in slots:
            asked = (
                line.fresh(slot, others_ok, tie=line.rng.choice(ties) if ties else "", **fields)
                if fits
                else None
            )
            if asked:
                return asked
    return None


def _tried(line: _Line) -> None:
    """Say that an instructed action did not go through (a refused bell is not a secret)."""
    for description in line.failed[:1]:
        if line.language == "en":
            line.said.append(line.pick("tried", what=_as_me(description)))


def _farewell(line: _Line) -> None:
    plan = line.plan
    _tried(line)
    like = _gerund_as_me(plan.like) if plan.like else ""
    said_like = bool(like) and any(like.casefold() in old for old in line.spoken)
    if like and line.language == "en" and not said_like:  # its image once; then a plain goodbye
        line.said.append(line.pick("farewell_like", like=like))
    else:
        line.said.append(line.fresh("farewell") or line.pick("farewell_again"))
    if plan.with_fact and not plan.one_sentence:
        fact = line.fact(plan.query)
        if fact is not None:
            line.said.append(line.pick("last_fact", fact=_lower_first(fact.text), Fact=fact.text))


def _voice(line: _Line) -> str:
    """The parts joined, voiced in the persona's tone."""
    parts = [p.strip() for p in line.said if p and p.strip()]
    if not parts:
        parts = [line.pick("flat", voc="")]
    language = line.language
    tone = line.persona.tone
    if (line.sombre or line.heard.feeling == "sleepy") and tone != "calm":
        tone = "warm"  # "Wow!" is no answer to "I feel sad"
    first = plain(parts[0]).split(" ")[0]
    unused = [
        i
        for i in INTERJECTIONS[language][tone]
        if not any(old.startswith(plain(i)) for old in line.spoken) and first not in _OPENERS
    ]
    if line.rng.random() < 0.45 and unused and not parts[0].startswith(("I'm ", "私は")):
        interjection = line.rng.choice(unused)
        if interjection.endswith(",") or interjection.endswith("、"):
            parts[0] = (
                f"{interjection} {_lower_first(parts[0])}" if language == "en" else interjection + parts[0]
            )
        else:
            parts.insert(0, interjection)
    if tone == "lively" and language == "en":
        parts = [p[:-1] + "!" if p.endswith(".") and not p.endswith("..") else p for p in parts]
    text = ("" if language == "ja" else " ").join(parts)
    text = re.sub(r"\s+([,.!?;:])", r"\1", text)
    text = re.sub(r"([!?.])\1{2,}", r"\1", text)
    return " ".join(text.split())


# --- small helpers -------------------------------------------------------------------------------------


def _fits(template: str, fields: Mapping[str, str]) -> bool:
    """Whether every placeholder of ``template`` has a non-empty value (``voc`` may be empty)."""
    return all(name in ("voc", "role") or fields.get(name) for name in re.findall(r"\{(\w+)\}", template))


def _fill(template: str, fields: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), ""), template)


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _lower_first(text: str) -> str:
    """``text`` to go mid-sentence: its first letter lowered unless it starts with "I" or an
    acronym ("When the light..." -> "when the light...", "I kept..." stays)."""
    if re.match(r"I\b", text) or text[:2].isupper():
        return text
    return text[:1].lower() + text[1:]


def _as_me(description: str) -> str:
    """A tool's description as something I tried: "Wave a hand at the people you talk to." ->
    "wave a hand at the people I talk to"."""
    text = description.strip().rstrip(".!。")
    return _lower_first(re.sub(r"\byou\b", "I", re.sub(r"\byour\b", "my", text)))


def _gerund_as_me(like: str) -> str:
    """ "handing over the night watch" stays; "closing your shop" becomes "closing my shop"."""
    return " ".join({"your": "my", "yours": "mine"}.get(w.casefold(), w) for w in like.split())


def _claim(heard: Heard) -> str | None:
    """The short claim a correction is about: a date, else what the line is about."""
    years = [str(int(v)) for _, v in numbers(heard.text) if 1000 <= v <= 2100 and v.is_integer()]
    if years:
        return years[-1]
    topic = heard.topic
    return topic if topic and len(topic.split()) <= 4 else None


def _thing(line: _Line) -> str:
    """The thing a tip is about: named in the parameters, the message, or its topic."""
    for concept in line.plan.thing_concepts or ("food",):
        found = things_in(concept, [line.heard.text])
        for thing in line.plan.things:
            if thing in found or not found:
                return thing
        if found:
            return found[0]
    return line.plan.things[0] if line.plan.things else (line.heard.head or "that")


def _amount(line: _Line, unit: str | None) -> int:
    written = [int(v) for _, v in numbers(line.heard.text) if 5 <= v <= 5000 and v.is_integer()]
    if written and unit and unit in line.heard.text:
        return written[0]
    return line.rng.randrange(50, 500, 10)


# --- never the same thing twice ------------------------------------------------------------------------

_OPENERS: Final = frozenset(
    plain(i).split(" ")[0] for table in INTERJECTIONS.values() for options in table.values() for i in options
) | {"ah", "oh", "well", "hmm", "mm", "wow", "ooh", "うーん", "うん", "まあ"}
"""First words that are an interjection already: a line opening with one gets no other."""


def _unsaid(text: str, line: _Line) -> str:
    """``text`` without the sentences I have said before in this conversation (names masked)."""
    if not line.spoken:
        return text
    before = line.before | set(line.spoken)
    joiner = "" if line.language == "ja" else " "
    kept = []
    for sentence in sentences(text):
        said = plain(sentence, line.names)
        if said and (
            said in before
            or (is_phrase(said) and any(said in old for old in line.spoken))
            or any(is_phrase(old) and old in said for old in line.before)
        ):
            continue
        kept.append(sentence)
    if kept and not re.search(r"\w", joiner.join(kept)):
        return ""  # an interjection alone says nothing
    return joiner.join(kept)


def _named_myself(line: _Line) -> bool:
    """Whether I told my name earlier in this conversation (once is an introduction)."""
    name = line.persona.name.casefold()
    return bool(name) and any(
        re.search(rf"(?:i'm|i am|私は|my name is)\s*{re.escape(name)}", old) for old in line.spoken
    )


def _intro(line: _Line) -> str | None:
    """The card's own self-introduction, when the reply is in the card's language."""
    return line.persona.intro if line.language == line.persona.language else None


# --- what a tool found ---------------------------------------------------------------------------------

_HEADLINE: Final = ("total", "sum", "result", "answer", "value", "count")
_MAX_ITEMS: Final = 6


def _results(line: _Line) -> list[str]:
    """One sentence per knowledge tool called this turn, saying what it found (a dice roll's
    total, a forecast): a result the companion keeps to itself is no result to the person."""
    out = []
    for tool, output in line.learned[:2]:
        said = _said_value(output, line.language)
        if said:
            what = " ".join(tool.replace("-", "_").split("_")).strip() or tool
            out.append(line.pick("result", tool=what, Tool=_upper_first(what), result=said))
    return out


def _said_value(value: object, language: Language, depth: int = 0) -> str:
    """A tool's output in a few words: its headline field first ("total 9, rolls 4 and 5")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return ("はい" if value else "いいえ") if language == "ja" else ("yes" if value else "no")
    if isinstance(value, int | float | str):
        return str(value)[:80]
    if isinstance(value, Sequence) and depth < 2:
        items = [_said_value(v, language, depth + 1) for v in list(value)[:_MAX_ITEMS]]
        items = [i for i in items if i]
        if language == "ja" or len(items) < 2:
            return "、".join(items) if language == "ja" else "".join(items)
        return ", ".join(items[:-1]) + f" and {items[-1]}"
    if isinstance(value, Mapping) and depth < 2:
        keys = sorted(
            (k for k in value if isinstance(k, str)),
            key=lambda k: _HEADLINE.index(k.casefold()) if k.casefold() in _HEADLINE else len(_HEADLINE),
        )
        parts = []
        for key in keys[:_MAX_ITEMS]:
            said = _said_value(value[key], language, depth + 1)
            if said:
                label = " ".join(key.replace("-", "_").split("_"))
                parts.append(f"{label} {said}" if language == "en" else f"{label}: {said}")
        return ", ".join(parts) if language == "en" else "、".join(parts)
    return ""
