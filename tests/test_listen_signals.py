"""What the terminal client shows while companions think, when they give up, and at the end.

The signals are ``action.send`` envelopes as companions publish them (``companion.thinking``,
``companion.yield``); every test feeds the session the bytes a bridge delivers and the time
they arrived, as the shell does.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from companion.conversation.signals import THINKING_DEADLINE, one_line
from companion.listen.core import END_MARKER, ListenSession, Show
from companion.protocol import Action, Message, Metadata, State, encode
from support.cards import metadata as md

JUNIPER = md("juniper", name="Juniper")
PIM = md("pim", name="Pim")
HOSTILE = (
    '<img src=x onerror="alert(1)">\x1b[2J\x1b]0;pwned\x07 line1\nline2\r\u202egnp.exe\u2066' + "z" * 5000
)


def session() -> ListenSession:
    counter = itertools.count(1)
    s = ListenSession("user_mika", new_id=lambda: f"id-{next(counter)}")
    s.set_companions([JUNIPER, PIM])
    return s


def thinking(sender: str, in_reply_to: str) -> bytes:
    return encode(Action.create(sender, "companion.thinking", {"in_reply_to": in_reply_to}))


def gave_up(sender: str, in_reply_to: str, reason: str, detail: Any = None) -> bytes:
    params: dict[str, Any] = {"in_reply_to": in_reply_to, "reason": reason}
    if detail is not None:
        params["detail"] = detail
    return encode(Action.create(sender, "companion.yield", params))


def reply(sender: str, in_reply_to: str | None, text: str, **metadata: Any) -> bytes:
    meta = {**metadata, **({"in_reply_to": in_reply_to} if in_reply_to else {})}
    return encode(Message.create(sender, ["user_mika"], text, meta or None))


def states(*stages: str, speak: bool = True) -> bytes:
    array = [
        State.create(cid, "speak" if speak else "listen", 5.0 - i, False, stage)  # type: ignore[arg-type]
        for i, (cid, stage) in enumerate(zip(("companion_juniper", "companion_pim"), stages, strict=False))
    ]
    return json.dumps([s.model_dump(mode="json", by_alias=True) for s in array]).encode()


def status_of(effects: list[Any]) -> list[str]:
    return [e.text for e in effects if isinstance(e, Show) and e.kind == "status"]


def lines_of(effects: list[Any]) -> list[str]:
    return [e.text for e in effects if isinstance(e, Show) and e.kind != "status"]


def test_thinking_counts_up_once_a_second_until_the_reply() -> None:
    s = session()
    assert s.next_tick(0.0) is None  # nobody thinks: the clock sleeps
    assert s.on_frame(thinking("companion_juniper", "m-1"), now=100.0) == [
        Show("Juniper is thinking… (0 s)", "status")
    ]
    assert s.next_tick(100.0) == 101.0
    assert status_of(s.tick(101.0)) == ["Juniper is thinking… (1 s)"]
    assert s.tick(101.5) == []  # no change between seconds: nothing redrawn
    assert s.next_tick(101.5) == 102.0
    assert status_of(s.tick(112.0)) == ["Juniper is thinking… (12 s)"]
    # a repeated signal for the same message keeps the count going
    assert s.on_frame(thinking("companion_juniper", "m-1"), now=112.5) == []
    assert status_of(s.tick(113.0)) == ["Juniper is thinking… (13 s)"]
    # someone else's reply does not end Juniper's thinking
    assert status_of(s.on_frame(reply("companion_pim", "m-0", "Hm."), now=113.2)) == []
    effects = s.on_frame(reply("companion_juniper", "m-1", "Clear skies."), now=113.5)
    # (a reply to people alone, and nobody else at work: the conversation is over)
    assert effects == [Show("", "status"), Show("Juniper → you: Clear skies.", "message"), Show(END_MARKER)]
    assert s.next_tick(113.5) is None and s.status == ""


def test_two_speakers_thinking_share_the_status_line() -> None:
    s = session()
    s.on_frame(thinking("companion_juniper", "m-1"), now=0.0)
    assert status_of(s.on_frame(thinking("companion_pim", "m-1"), now=0.4)) == [
        "Juniper is thinking… (0 s) · Pim is thinking… (0 s)"
    ]
    assert s.next_tick(0.4) == 1.0
    assert status_of(s.tick(1.0)) == ["Juniper is thinking… (1 s) · Pim is thinking… (0 s)"]
    assert status_of(s.tick(1.4)) == ["Juniper is thinking… (1 s) · Pim is thinking… (1 s)"]
    # any message from a speaker ends its thinking, stamped or not (aikyo stamps nothing)
    assert status_of(s.on_frame(reply("companion_pim", None, "Me first."), now=2.0)) == [
        "Juniper is thinking… (2 s)"
    ]


def test_a_failed_speaker_is_one_line_with_its_reason_and_detail() -> None:
    s = session()
    s.on_frame(thinking("companion_juniper", "m-1"), now=0.0)
    detail = "the server ignored the forced tool call"
    effects = s.on_frame(gave_up("companion_juniper", "m-1", "model_error", detail), now=7.0)
    assert effects == [
        Show("", "status"),
        Show(
            "Juniper could not answer: the model failed (the server ignored the forced tool call); "
            "the turn passes to the next companion",
            "error",
        ),
    ]
    assert s.next_tick(7.0) is None


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("model_error", "the model failed"),
        ("timeout", "the model timed out"),
        ("crashed", "it crashed while preparing its reply"),
        ("no_reply", "the model gave no reply"),
        ("overloaded", "it gave up (overloaded)"),  # a reason this client does not know yet
        ("\x1b[31m", "it gave up ([31m)"),
        ("", "it gave up (no reason given)"),
    ],
)
def test_every_reason_in_plain_words(reason: str, words: str) -> None:
    (line,) = lines_of(session().on_frame(gave_up("companion_pim", "m-1", reason), now=0.0))
    assert line == f"Pim could not answer: {words}; the turn passes to the next companion"


def test_a_yield_for_another_message_leaves_the_thinking_alone() -> None:
    s = session()
    s.on_frame(thinking("companion_juniper", "m-2"), now=0.0)
    effects = s.on_frame(gave_up("companion_juniper", "m-1", "timeout"), now=1.5)
    assert status_of(effects) == ["Juniper is thinking… (1 s)"]  # the tick it was due anyway
    assert lines_of(effects) == [
        "Juniper could not answer: the model timed out; the turn passes to the next companion"
    ]
    assert s.status == "Juniper is thinking… (1 s)"


def test_hostile_detail_and_names_are_one_bounded_line_without_control_characters() -> None:
    s = ListenSession("user_mika")
    evil = Metadata(
        id="companion_evil", name="Ev\x1b[2Jil\nName" + "n" * 500, personality="p", story="s", sample="x"
    )
    s.set_companions([evil])
    (status,) = status_of(s.on_frame(thinking("companion_evil", "m-1"), now=0.0))
    assert status.startswith("Ev [2Jil Name") and status.endswith("… is thinking… (0 s)")
    (line,) = lines_of(s.on_frame(gave_up("companion_evil", "m-1", "crashed", HOSTILE), now=1.0))
    assert all(ch not in line for ch in "\x1b\x07\n\r\u202e\u2066")
    detail = line.split(" (", 1)[1].rsplit("); the turn passes", 1)[0]
    assert detail.startswith('<img src=x onerror="alert(1)"> [2J ]0;pwned line1 line2 gnp.exe z')
    assert len(detail) == 200 and detail.endswith("…")
    # lone surrogates (valid JSON escapes) never reach the screen
    raw = json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "action.send",
            "params": {
                "from": "companion_evil",
                "name": "companion.yield",
                "params": {"in_reply_to": "m-2", "reason": "timeout", "detail": "a\ud800b"},
            },
        }
    )
    # the frame is refused whole, as the edge refuses it (invalid_unicode): nothing reaches the screen
    assert lines_of(s.on_frame(raw, now=2.0)) == []
    (line,) = lines_of(s.on_frame(gave_up("companion_evil", "m-2", "timeout", "a b"), now=3.0))
    assert "(a b)" in line


def test_malformed_signals_are_counted_and_dropped_not_shown() -> None:
    s = session()
    bad = [
        Action.create("companion_juniper", "companion.thinking", {}),
        Action.create("companion_juniper", "companion.thinking", {"in_reply_to": 7}),
        Action.create("companion_juniper", "companion.thinking", {"in_reply_to": "x" * 201}),
        Action.create("user_mallory", "companion.thinking", {"in_reply_to": "m-1"}),  # not a companion
        Action.create("companion_juniper", "companion.yield", {"in_reply_to": "m-1"}),  # no reason
        Action.create("companion_juniper", "companion.yield", {"in_reply_to": "m-1", "reason": 3}),
    ]
    for action in bad:
        assert s.on_frame(encode(action), now=0.0) == []
    assert s.dropped_signals == len(bad) and s.next_tick(0.0) is None
    # the next good one still works
    assert status_of(s.on_frame(thinking("companion_juniper", "m-1"), now=1.0)) == [
        "Juniper is thinking… (0 s)"
    ]
    # other actions are shown as before
    assert lines_of(s.on_frame(encode(Action.create("companion_pim", "wave", {})), now=1.0)) == [
        "* Pim: wave"
    ]


def test_the_same_yield_twice_is_shown_once() -> None:
    s = session()
    first = s.on_frame(gave_up("companion_pim", "m-1", "timeout"), now=0.0)
    assert len(lines_of(first)) == 1
    assert s.on_frame(gave_up("companion_pim", "m-1", "timeout"), now=0.1) == []
    assert len(lines_of(s.on_frame(gave_up("companion_pim", "m-2", "timeout"), now=0.2))) == 1


def test_thinking_has_a_deadline() -> None:
    s = session()
    s.on_frame(thinking("companion_juniper", "m-1"), now=10.0)
    assert status_of(s.tick(10.0 + THINKING_DEADLINE - 1)) == ["Juniper is thinking… (299 s)"]
    assert s.next_tick(10.0 + THINKING_DEADLINE - 1) == 10.0 + THINKING_DEADLINE
    effects = s.tick(10.0 + THINKING_DEADLINE)
    assert effects == [Show("", "status"), Show("(no word from Juniper after 300 s of thinking)")]
    assert s.next_tick(10.0 + THINKING_DEADLINE) is None


def test_many_thinkers_are_bounded() -> None:
    s = session()
    for i in range(100):
        s.on_frame(thinking(f"companion_c{i:03}", "m-1"), now=0.0)
    assert s.status == (
        "c068 is thinking… (0 s) · c069 is thinking… (0 s) · c070 is thinking… (0 s) · and 29 more"
    )


def test_a_states_array_that_chooses_nobody_at_terminal_ends_the_conversation_once() -> None:
    s = session()
    assert lines_of(s.on_frame(states("closing", "closing"), now=0.0)) == []  # someone still speaks
    assert lines_of(s.on_frame(states("terminal", "terminal", speak=False), now=0.0)) == []  # nobody wants to
    s.on_frame(thinking("companion_pim", "m-9"), now=0.0)
    effects = s.on_frame(states("terminal", "terminal"), now=0.5)
    assert effects == [Show("", "status"), Show(END_MARKER)]  # and nobody thinks any more
    assert s.on_frame(states("terminal", "terminal"), now=1.0) == []  # another leader's array
    assert lines_of(s.on_frame(gave_up("companion_pim", "m-9", "terminal"), now=1.0)) == [
        "Pim has nothing more to say; the turn passes to the next companion"
    ]
    # a person's line starts a new conversation, which ends with its own marker
    s.on_input("one more thing", now=2.0)
    assert lines_of(s.on_frame(states("terminal", "terminal"), now=3.0)) == [END_MARKER]


def test_a_terminal_yield_is_one_companions_limit_and_the_array_ends_the_conversation() -> None:
    """Cards may have different limits: a ``terminal`` yield says only that this companion is
    done (the others may go on); the end is the leader's (or the closer's) terminal array."""
    s = session()
    s.on_frame(thinking("companion_juniper", "m-5"), now=0.0)
    effects = s.on_frame(gave_up("companion_juniper", "m-5", "terminal", "detail not shown"), now=3.0)
    assert effects == [
        Show("", "status"),
        Show("Juniper has nothing more to say; the turn passes to the next companion"),
    ]
    # Pim, whose card allows more, goes on; then the closing array ends it, once
    more = Message.create(
        "companion_pim", ["user_mika", "companion_juniper"], "One more thing!", {"in_reply_to": "m-5"}
    )
    assert lines_of(s.on_frame(encode(more), now=3.5)) == ["Pim → you, Juniper: One more thing!"]
    assert lines_of(s.on_frame(states("terminal", "terminal"), now=4.0)) == [END_MARKER]
    assert s.on_frame(states("terminal", "terminal"), now=4.5) == []
    # so does a companion opening a new one itself (a message that answers nothing)
    s.on_frame(reply("companion_juniper", None, "Look, a comet!"), now=6.0)
    assert lines_of(s.on_frame(gave_up("companion_pim", "m-6", "terminal"), now=6.5)) == [
        "Pim has nothing more to say; the turn passes to the next companion"
    ]
    assert lines_of(s.on_frame(states("terminal", "terminal"), now=7.0)) == [END_MARKER]
    # a reply within the ended conversation does not
    s.on_frame(reply("companion_pim", "m-7", "Where?"), now=7.5)
    assert s.on_frame(states("terminal", "terminal"), now=8.0) == []


def test_one_line() -> None:
    assert one_line("  a\n\tb\x00c  ", 10) == "a b c"
    assert one_line("abcdefghijkl", 5) == "abcd…"
    assert one_line("\u202eabc\u2069", 10) == "abc"
