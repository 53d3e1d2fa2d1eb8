"""The offline demo's first impression: ten opening lines (questions, feelings, Japanese, a tool
request) run as ``companion demo --in-memory`` runs them (real engines, real action runtime, real
CEL triggers, the shipped cards and cards a user writes). Each first reply answers its line, in
its language; every reply is in the language of the message it answers; no companion says the
same phrase twice in a conversation."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import trio.testing

from companion.card.model import LoadedCard, load_card
from companion.conversation.transcript import TranscriptEvent
from companion.models.lexicon import sentences
from companion.models.persona import persona_of
from support.cards import write_card
from support.scripted import (
    DOT_CARD,
    KANA,
    ROLLED,
    SORA_CARD,
    check_conversation,
    converse,
    is_english,
    is_japanese,
    real_cards,
    replies,
)


def _first(events: Sequence[TranscriptEvent]) -> TranscriptEvent:
    return replies(events)[0]


Check = Callable[[TranscriptEvent], bool]

OPENINGS: list[tuple[str, str, Check]] = [
    ("What's your favourite cake?", "en", lambda r: "cake" in r.text.casefold()),
    (  # the page's opening line: what they have been doing, not "that's one for someone else"
        "Hello everyone! What are you all up to today?",
        "en",
        lambda r: (
            re.search(r"someone else|not my field|outside what I know|wouldn.t know", r.text, re.I) is None
        ),
    ),
    (
        "I feel sad today.",
        "en",
        # a sad reaction, shown as sad, with no cheering
        lambda r: r.emotion == "sad" and "!" not in r.text and "?" in r.text,
    ),
    (
        "Have you seen my cat? She's been lost since Tuesday.",
        "en",
        lambda r: re.search(r"\bI have(?:n't| not)? seen your cat\b", r.text) is not None,
    ),
    ("Do you like rain?", "en", lambda r: re.search(r"\bI (?:do|don't) like rain\b", r.text) is not None),
    # no weights, no science: an honest answer from what the companion has seen
    (
        "Why do stars twinkle?",
        "en",
        lambda r: re.search(r"\b(because|science|wondered|don't know|no idea)\b", r.text, re.I) is not None,
    ),
    (
        "I'm so happy, I passed my exam!",
        "en",
        lambda r: r.emotion == "happy" and re.search(r"well done|earned|something", r.text, re.I) is not None,
    ),
    (
        "今日は何をしていたの？",
        "ja",
        lambda r: re.search(r"(して|眺めて|見て|過ごして)いたよ", r.text) is not None,
    ),
    ("こんにちは！みんな元気？", "ja", lambda r: "元気" in r.text),
    ("悲しいことがあったんだ。", "ja", lambda r: r.emotion == "sad" and "！" not in r.text),
]


def _names(cards: Sequence[LoadedCard]) -> list[str]:
    return [c.card.metadata.name for c in cards]


@pytest.mark.parametrize(("opening", "language", "answers"), OPENINGS, ids=[o[0] for o in OPENINGS])
async def test_each_first_reply_answers_its_line_in_its_language_and_nothing_repeats(
    autojump_clock: trio.testing.MockClock, opening: str, language: str, answers: Check
) -> None:
    cards = real_cards()
    names = _names(cards)
    events, _, over = await converse(cards, opening)
    assert over
    first = _first(events)
    assert (is_japanese if language == "ja" else is_english)(first.text, names), first.text
    assert answers(first), (first.text, first.emotion)
    check_conversation(events, opening, names)


async def test_a_tool_request_reaches_the_tool_s_input_and_its_result_the_words(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The tenth opening: "two six-sided dice" is two dice of six sides, and what they show is
    said."""
    dot = load_card(write_card(tmp_path, "dot", DOT_CARD))
    ROLLED.clear()
    events, _, _ = await converse([dot], "Dot, roll two six-sided dice!", first_only=True)
    first = _first(events)
    assert len(ROLLED) == 1
    dice, rolled = ROLLED[0]
    assert (dice.count, dice.sides) == (2, 6)
    assert re.search(rf"\b{rolled.total}\b", first.text), (first.text, rolled)
    assert all(re.search(rf"\b{roll}\b", first.text) for roll in rolled.rolls), (first.text, rolled)


@pytest.mark.parametrize(
    "opening",
    [
        "What's your favourite cake?",
        "今日は何をしていたの？",
        "I feel sad today.",
        "こんにちは！",
        "なぜ空は青いの？",
    ],
)
async def test_japanese_and_english_cards_answer_in_the_language_they_are_spoken_to(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, opening: str
) -> None:
    """A Japanese card (its story in the third person, a quote with a full stop inside) beside
    an English one: each reply is in the language of the message it answers, the Japanese card's
    own story is told as 私, its quote whole, a greeting never the topic."""
    sora = load_card(write_card(tmp_path, "sora", SORA_CARD))
    cards = [sora, *(c for c in real_cards() if c.card.metadata.id == "companion_pim")]
    names = _names(cards)
    events, _, over = await converse(cards, opening)
    assert over
    first = _first(events)
    language = "ja" if KANA.search(opening) else "en"
    assert (is_japanese if language == "ja" else is_english)(first.text, names), first.text
    check_conversation(events, opening, names)


def test_a_japanese_card_s_story_is_told_in_the_first_person_with_its_quotes_whole(tmp_path: Path) -> None:
    """The card says 彼女は and quotes 「…。」 with a full stop inside: the companion says 私は,
    and the quote stays one sentence (a full stop inside 「」 ends nothing)."""
    sora = load_card(write_card(tmp_path, "sora", SORA_CARD)).card
    facts = [f.text for f in persona_of(sora.metadata, sora.role).facts]
    assert "私は毎晩、屋上から星を眺める。" in facts
    assert "私の口癖は「今日もいい星空だね。」だ。" in facts
    assert not [f for f in facts if "彼女" in f or f.count("「") != f.count("」")]
    assert sentences("「まだ。」と「もう。」」だ。次。") == ["「まだ。」と「もう。」」だ。", "次。"]


@pytest.mark.parametrize(
    ("opening", "emotion", "unfitting"),
    [
        ("My grandmother passed away last week.", "sad", r"well done|celebrate|!"),
        ("I lost my keys again!", "sad", r"well done|celebrate|!"),
        ("I'm angry at my boss.", "angry", r"well done|celebrate|!"),
        ("I got a new puppy!", "happy", r"sorry|sounds hard"),
        ("最近、悲しいんだ。", "sad", r"！|すごい"),
    ],
)
async def test_a_feeling_gets_a_fitting_reaction_and_emotion(
    autojump_clock: trio.testing.MockClock, opening: str, emotion: str, unfitting: str
) -> None:
    """ "Passed away" is no exam passed, a loss is no cause for exclamation marks: the first
    reply shows the feeling the line calls for."""
    events, _, _ = await converse(real_cards(), opening, first_only=True)
    first = _first(events)
    assert first.emotion == emotion, (first.text, first.emotion)
    assert not re.search(unfitting, first.text, re.I), first.text
