"""What counts as taking leave (companion.lines.farewell): every farewell the offline model says,
the goodbyes people and small models write, and none of the look-alikes a conversation is full
of (a false goodbye begins closing a conversation that was not ending)."""

from __future__ import annotations

import pytest

from companion.lines.farewell import takes_leave
from companion.models.phrasebook import EN, JA


@pytest.mark.parametrize(
    "line",
    [
        line.format(like="shutting a rare book", voc=", Pim")
        for book in (EN, JA)
        for key in ("farewell", "farewell_like", "farewell_again")
        for line in book[key]
    ],
)
def test_every_farewell_of_the_phrasebook_takes_leave(line: str) -> None:
    assert takes_leave(line)


@pytest.mark.parametrize(
    "line",
    [
        "Good night, all!",
        "Consider this me handing over the night watch: good night, everyone.",
        "It was lovely. Goodbye!",
        "Good-bye, friends.",
        "See you tomorrow!",
        "I have to go now. Thanks for the chat.",
        "Well, I'd better be off.",
        "Take care, Juniper.",
        "Farewell, my friends.",
        "Talk to you later!",
        "Until next time, then.",
        "おやすみなさい！",
        "じゃあね、また明日。",
        "今日はありがとう。さようなら。",
    ],
)
def test_goodbyes_take_leave(line: str) -> None:
    assert takes_leave(line)


@pytest.mark.parametrize(
    "line",
    [
        "Good morning, everyone!",
        "I can see you love the sea.",
        "Tell me about it later.",
        "I take care of the garden every spring.",
        "I had a good night's sleep, thanks.",
        "We had a good night at the harbour.",
        "Goodbye to summer, hello autumn.",
        "We threw a farewell party for the old lighthouse keeper.",
        "You have to go see the tide pools.",
        "I'm off to the market tomorrow.",
        "Are you leaving already? Bye for now?",
        "Good night already? What time is it there?",
        "It took so long to bake.",
        "",
        "またいつか海に行きたいな。",
    ],
)
def test_look_alikes_do_not(line: str) -> None:
    assert not takes_leave(line)


def test_a_flood_is_read_only_at_its_head() -> None:
    assert not takes_leave("word " * 10_000 + "Good night!")
    assert takes_leave("Good night! " + "word " * 10_000)
