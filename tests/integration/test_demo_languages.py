"""`companion demo` as a user runs it, three companion processes on 127.0.0.1 with the offline
model and the English cards of cards/, spoken to in Japanese: the first reply answers the
question in Japanese, every reply is in the language of the message it answers, and no companion
says the same phrase twice before the conversation closes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from companion.conversation.transcript import TranscriptEvent
from support.cli import run_companion
from support.scripted import check_conversation, is_japanese

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_a_japanese_question_to_english_cards_is_answered_in_japanese_to_the_end() -> None:
    opening = "今日は何をしていたの？"
    done = run_companion(
        ["demo", "--json", "--pace", "0.1", "--timeout", "120", "--say", opening],
        cwd=REPO,
        timeout=240,
        warm=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert (events[-1]["event"], events[-1]["reason"]) == ("end", "terminal")
    said = [
        TranscriptEvent(
            "message",
            e["speaker"],
            tuple(e["recipients"]),
            e["text"],
            e["emotion"],
            closing=e["closing"],
            message_id=e["message_id"],
            in_reply_to=e["in_reply_to"],
        )
        for e in events
        if e["event"] == "message"
    ]
    names = ["Juniper", "Ostra", "Pim"]
    first = next(e for e in said if e.in_reply_to)
    assert is_japanese(first.text, names) and "いたよ" in first.text, first.text
    check_conversation(said, opening, names)
