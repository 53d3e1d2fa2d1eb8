"""The history window a real model's prompt quotes: its start stays put while the conversation
grows, and moves in one step when it would quote too much (so a server's prompt cache keeps the
conversation, turn after turn)."""

from __future__ import annotations

import pytest

from companion.models.window import HistoryWindow
from companion.protocol import Message


def conversation(length: int) -> list[Message]:
    """``length`` messages, a person's question and a companion's answer in turn."""
    return [
        Message.create("user_1", ["companion_a"], f"question {n}", id=f"m{n}")
        if n % 2 == 0
        else Message.create("companion_a", ["user_1"], f"answer {n}", id=f"m{n}")
        for n in range(length)
    ]


def quoted_ids(window: HistoryWindow, key: str, said: list[Message]) -> list[str]:
    return [m.params.id for m in window.quoted(key, said, said[-1])]


def test_a_short_conversation_is_quoted_whole() -> None:
    said = conversation(5)
    assert quoted_ids(HistoryWindow(12), "a", said) == ["m0", "m1", "m2", "m3"]


def test_the_start_stays_while_the_window_grows_then_moves_to_the_recent_half() -> None:
    window = HistoryWindow(12)
    starts = []
    for length in range(1, 31):
        said = conversation(length)
        quoted = quoted_ids(window, "a", said)
        assert len(quoted) <= 11 and "m" + str(length - 1) not in quoted
        assert quoted == [f"m{n}" for n in range(length - 1 - len(quoted), length - 1)]  # no gap
        starts.append(quoted[0] if quoted else None)
    # a sliding window would start elsewhere on every message past the eleventh
    moves = [n for n in range(1, len(starts)) if starts[n] != starts[n - 1] and starts[n - 1] is not None]
    assert moves == [12, 18, 24]


def test_the_engines_history_is_cut_from_the_end_but_the_window_keeps_its_anchor() -> None:
    """The engine hands the model its most recent 20 messages: the front of what it hands slides,
    the window's start does not."""
    window = HistoryWindow(12)
    full = conversation(40)
    assert quoted_ids(window, "a", full[:26][-20:])[0] == "m14"
    assert quoted_ids(window, "a", full[:28][-20:])[0] == "m21"  # too many: the recent half
    first = quoted_ids(window, "a", full[:30][-20:])
    second = quoted_ids(window, "a", full[:32][-20:])
    assert first[0] == second[0] == "m21" and second[: len(first)] == first


def test_each_key_has_its_own_window() -> None:
    window = HistoryWindow(12)
    said = conversation(20)
    assert quoted_ids(window, "leader", said[:14])[0] == "m2"
    assert quoted_ids(window, "speaker", said)[0] == "m8"
    assert quoted_ids(window, "leader", said[:16])[0] == "m9"  # its own anchor, moved in one step


def test_a_forgotten_anchor_quotes_the_most_it_may() -> None:
    window = HistoryWindow(12)
    said = conversation(30)
    window.quoted("a", said[:20], said[19])
    assert quoted_ids(window, "a", said[24:])[0] == "m24"  # its anchor is gone: from the front
    assert len(quoted_ids(window, "b", said)) == 11


def test_past_tasks_are_kept_by_speaker_and_bounded() -> None:
    window = HistoryWindow(12)
    window.ask("a", "", "a task with nobody heard before it")  # no user turn to quote it in
    assert window.asked("a") == {}
    for n in range(20):
        window.ask("a", f"user_1: question {n}", f"user_1: question {n}\n\ntask {n}")
    asked = window.asked("a")
    assert len(asked) == window.most and asked["user_1: question 19"].endswith("task 19")
    assert "user_1: question 0" not in asked and window.asked("b") == {}


def test_a_window_needs_room_for_an_earlier_message() -> None:
    with pytest.raises(ValueError, match="at least one earlier message"):
        HistoryWindow(1)
