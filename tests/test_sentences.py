"""The sentence splitter: where a voice may pause, decided the same however the line arrives."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.lines.sentences import FIRST_CLAUSE_CHARS, SentenceSplitter, join_sentences, split_sentences


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
        ("I am Dr. Smith. Hi.", ["I am Dr. Smith.", "Hi."]),
        ("Use tea, e.g. green tea. Or not.", ["Use tea, e.g. green tea.", "Or not."]),
        ("Pi is 3.14 today. Really.", ["Pi is 3.14 today.", "Really."]),
        ("It costs $2.50, approx. five yen. Ok.", ["It costs $2.50, approx. five yen.", "Ok."]),
        ('"Really?" she asked. Yes.', ['"Really?" she asked.', "Yes."]),
        ('He said "go." Then left.', ['He said "go."', "Then left."]),
        ("(It rained.) We stayed.", ["(It rained.)", "We stayed."]),
        ("Wait... What? No!? Yes.", ["Wait...", "What?", "No!?", "Yes."]),
        ("J. R. R. Tolkien wrote it. No. I did.", ["J. R. R. Tolkien wrote it.", "No.", "I did."]),
        ("Neither do I. Bye.", ["Neither do I.", "Bye."]),
        ("It was in 2024. Then 2025.", ["It was in 2024.", "Then 2025."]),
        ("Hi.\nBye", ["Hi.", "Bye"]),
        ("first line\nsecond line", ["first line", "second line"]),
        (
            "こんにちは。元気ですか？「はい。」そうです",
            ["こんにちは。", "元気ですか？", "「はい。」", "そうです"],
        ),
        ("今日は晴れ！明日は雨。", ["今日は晴れ！", "明日は雨。"]),
        ("Good. 次は日本語。", ["Good.", "次は日本語。"]),
        ("no end at all", ["no end at all"]),
        ("", []),
        ("   ", []),
        ("... !!", []),
        ("Hello.   ", ["Hello."]),
    ],
)
def test_sentences_of_a_whole_line(text: str, sentences: list[str]) -> None:
    assert split_sentences(text) == sentences


def test_a_run_on_line_is_cut_at_a_clause_break_before_the_bound() -> None:
    text = "one, two, three, four, five, six, seven, eight, nine, ten and so on and on"
    pieces = split_sentences(text, max_chars=30)
    assert all(len(p) <= 30 for p in pieces)
    assert pieces[0] == "one, two, three, four, five,"
    assert " ".join(pieces) == text


def test_a_word_longer_than_the_bound_is_cut_at_the_bound() -> None:
    assert split_sentences("x" * 25, max_chars=10) == ["x" * 10, "x" * 10, "x" * 5]


def test_a_sentence_is_handed_out_once_its_end_is_certain() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("Hello there.") == []  # "Hello there.com" or "Hello there..." may follow
    assert splitter.feed("Hello there. ") == []  # "Hello there. and" would not end it
    assert splitter.feed("Hello there. H") == ["Hello there."]
    assert splitter.feed("Hello there. How") == []
    assert splitter.said == "Hello there."
    assert splitter.finish("Hello there. How are you") == ["How are you"]
    assert splitter.said == "Hello there. How are you"


def test_japanese_ends_without_waiting_for_a_space() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("はい。") == []  # "はい。」" may follow
    assert splitter.feed("はい。そ") == ["はい。"]


def test_a_text_that_goes_back_on_what_was_handed_out_stops_the_splitter() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("One. Two") == ["One."]
    assert splitter.feed("Uno. Dos. Tres") == []
    assert splitter.diverged
    assert splitter.finish() == []
    assert splitter.said == "One."


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceSplitter(max_chars=3)


_ALPHABET = st.sampled_from(
    [*"abcAB 12.!?,\n\"')」。？、…", "Dr.", "e.g.", " I.", "3.5", "こんにちは", "Well"]
)
_TEXTS = st.lists(_ALPHABET, max_size=60).map("".join)


def _squeezed(text: str) -> str:
    return "".join(text.split())


@settings(max_examples=300, deadline=None)
@given(
    text=_TEXTS,
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    first_clause=st.sampled_from([None, 8, 16]),
    alone=st.sampled_from([lambda _c: True, lambda c: len(c) % 2 == 0]),
)
def test_any_chunking_gives_the_sentences_of_the_whole(
    text: str, cuts: list[int], first_clause: int | None, alone: Callable[[str], bool]
) -> None:
    """The property streaming rests on: sentences do not depend on how the text arrived."""
    splitter = SentenceSplitter(max_chars=24, first_clause=first_clause, clause_alone=alone)
    got: list[str] = []
    for cut in sorted(c % (len(text) + 1) for c in cuts):
        got += splitter.feed(text[:cut])
    got += splitter.finish(text)
    assert got == SentenceSplitter(max_chars=24, first_clause=first_clause, clause_alone=alone).finish(text)


@pytest.mark.parametrize(
    ("line", "pieces"),
    [
        ("I've been in your shoes, my friend. Yes.", ["I've been in your shoes,", "my friend.", "Yes."]),
        # a first clause too short to say alone waits for the next break
        (
            "You know, I've been doing it for years, and I forget.",
            ["You know, I've been doing it for years,", "and I forget."],
        ),
        # only the line's first piece: later sentences stay whole
        ("Hi. I have been doing it, and so on.", ["Hi.", "I have been doing it, and so on."]),
        ("It was 1,000 kilos of butter, exactly.", ["It was 1,000 kilos of butter,", "exactly."]),
        (
            "今日は海がとても静かで気持ちがいいですね、散歩に行こう。",
            ["今日は海がとても静かで気持ちがいいですね、", "散歩に行こう。"],
        ),
        ("Yes, I agree.", ["Yes, I agree."]),
        # inside an aside or a quotation: not a clause of the line's own
        (
            "(I will give you your turn next, then mine.) Go.",
            ["(I will give you your turn next, then mine.)", "Go."],
        ),
        ('"The sea is wide tonight, she said." Yes.', ['"The sea is wide tonight, she said."', "Yes."]),
    ],
)
def test_the_first_clause_of_a_line_may_be_voiced_alone(line: str, pieces: list[str]) -> None:
    assert SentenceSplitter(first_clause=FIRST_CLAUSE_CHARS).finish(line) == pieces
    assert join_sentences(pieces) == line


def test_a_first_clause_that_may_not_go_alone_waits_for_its_sentence() -> None:
    splitter = SentenceSplitter(first_clause=FIRST_CLAUSE_CHARS, clause_alone=lambda c: "moment" not in c)
    line = "I'm just a moment of your actions, I'll do it again, then more. Yes."
    assert splitter.finish(line) == [
        "I'm just a moment of your actions, I'll do it again, then more.",
        "Yes.",
    ]


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS)
def test_nothing_is_lost_and_no_sentence_is_too_long(text: str) -> None:
    pieces = split_sentences(text, max_chars=24)
    assert all(0 < len(p) <= 24 for p in pieces)
    assert all(p == p.strip() and any(ch.isalnum() for ch in p) for p in pieces)
    kept = _squeezed("".join(pieces))
    # Only pieces without a letter or digit (stray punctuation between sentences) are dropped.
    assert len(kept) <= len(_squeezed(text))
    assert [ch for ch in kept if ch.isalnum()] == [ch for ch in _squeezed(text) if ch.isalnum()]


@settings(max_examples=200, deadline=None)
@given(text=_TEXTS)
def test_said_is_a_prefix_of_the_line(text: str) -> None:
    splitter = SentenceSplitter(max_chars=24)
    for end in range(0, len(text) + 1, 3):
        splitter.feed(text[:end])
        assert text.startswith(splitter.said) or text.strip().startswith(splitter.said)
