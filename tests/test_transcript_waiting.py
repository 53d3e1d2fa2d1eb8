"""The bystander's transcript while a speaker prepares its reply and when it gives up: the
signals as they arrive from the network (``action.send`` on ``actions``, signed by their
publisher), the lines a person reads, and hostile signals that must not reach a screen raw."""

from __future__ import annotations

from companion.app.group import USER_ID
from companion.conversation.events import THINKING_SIGNAL, YIELD_SIGNAL
from companion.conversation.rules import META_IN_REPLY_TO, META_TURN, StateDecision, finalize_states, turn_tag
from companion.conversation.transcript import THINKING_EVERY, THINKING_SHOWN_AFTER, Transcript, render_text
from companion.protocol import Action, Message, State

J, OS, P = "companion_juniper", "companion_ostra", "companion_pim"
ACTIVE = [J, OS, P]
NAMES = {J: "Juniper", OS: "Ostra", P: "Pim", USER_ID: "User"}


def _reply(sender: str, to: Message, text: str) -> Message:
    return Message.create(sender, [USER_ID], text, metadata={META_IN_REPLY_TO: to.params.id, META_TURN: 1})


def _states_for(message: Message, speaker: str) -> list[State]:
    decisions = [
        StateDecision(c, "speak" if c == speaker else "listen", 7 if c == speaker else 1, False)
        for c in ACTIVE
    ]
    return finalize_states(decisions, ACTIVE, floor="none", tag=turn_tag(message)).states


def _opened(t0: float = 100.0) -> tuple[Transcript, Message]:
    transcript = Transcript()
    opening = Message.create(USER_ID, ACTIVE, "Hello!")
    transcript.feed(opening, ACTIVE, now=t0)
    return transcript, opening


def _thinking(speaker: str, message: Message) -> Action:
    return Action.create(speaker, THINKING_SIGNAL, {"in_reply_to": message.params.id})


def _yield(speaker: str, message: Message, reason: str, detail: str | None = None) -> Action:
    params = {"in_reply_to": message.params.id, "reason": reason}
    if detail is not None:
        params["detail"] = detail
    return Action.create(speaker, YIELD_SIGNAL, params)


def _texts(events: list) -> list[str]:  # type: ignore[type-arg]
    return [line for e in events if (line := render_text(e, NAMES)) is not None]


def test_a_slow_speaker_is_shown_thinking_after_a_while_then_every_ten_seconds() -> None:
    transcript, opening = _opened()
    assert transcript.feed(_thinking(J, opening), ACTIVE, publisher=J, now=100.0) == []
    assert transcript.deadline() == 100.0 + THINKING_SHOWN_AFTER
    assert transcript.tick(102.9) == []
    assert _texts(transcript.tick(103.2)) == ["    Juniper is thinking… (3 s)"]
    assert transcript.tick(105.0) == []
    assert transcript.deadline() == 100.0 + THINKING_SHOWN_AFTER + THINKING_EVERY
    assert _texts(transcript.tick(140.0)) == ["    Juniper is thinking… (33 s)"]  # one line, however late
    reply = Message.create(
        J, [USER_ID], "Here I am.", metadata={META_IN_REPLY_TO: opening.params.id, META_TURN: 1}
    )
    transcript.feed(reply, ACTIVE, publisher=J, now=141.0)
    assert transcript.tick(200.0) == []  # it replied: no more thinking lines


def test_a_quick_reply_needs_no_thinking_line() -> None:
    transcript, opening = _opened()
    transcript.feed(_thinking(P, opening), ACTIVE, publisher=P, now=100.0)
    reply = Message.create(
        P, [USER_ID], "Quick!", metadata={META_IN_REPLY_TO: opening.params.id, META_TURN: 1}
    )
    transcript.feed(reply, ACTIVE, publisher=P, now=100.6)
    assert transcript.tick(110.0) == [] and transcript.deadline() is None


def test_a_failure_is_one_line_with_its_reason_once() -> None:
    transcript, opening = _opened()
    transcript.feed(_thinking(OS, opening), ACTIVE, publisher=OS, now=100.0)
    signal = _yield(OS, opening, "model_error", "HTTP 500: CUDA out of memory")
    lines = transcript.feed(signal, ACTIVE, publisher=OS, now=101.0)
    assert _texts(lines) == [
        "    Ostra could not answer: the model failed (HTTP 500: CUDA out of memory); "
        "the turn passes to the next companion"
    ]
    assert lines[0].to_json()["event"] == "yield" and lines[0].to_json()["detail"].startswith("HTTP 500")
    assert transcript.feed(signal, ACTIVE, publisher=OS, now=101.5) == []  # the same yield again
    assert transcript.tick(130.0) == []  # it stopped thinking
    assert _texts(transcript.feed(_yield(P, opening, "timeout"), ACTIVE, publisher=P, now=102.0)) == [
        "    Pim could not answer: the model timed out; the turn passes to the next companion"
    ]


def test_signals_for_another_companion_and_hostile_details_do_not_reach_the_screen_raw() -> None:
    transcript, opening = _opened()
    forged = _yield(OS, opening, "model_error", "forged")
    assert transcript.feed(forged, ACTIVE, publisher=P, now=101.0) == []  # Pim signed Ostra's yield
    assert transcript.feed(_thinking(OS, opening), ACTIVE, publisher=P, now=101.0) == []
    assert transcript.tick(200.0) == []
    hostile = "\x1b[2J\x07line one\nline two\u202e" + "x" * 5000
    [line] = _texts(
        transcript.feed(_yield(J, opening, "model_error", hostile), ACTIVE, publisher=J, now=102.0)
    )
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line and "\u202e" not in line
    assert len(line) < 320 and "line one line two" in line
    assert _texts(transcript.feed(_yield(P, opening, "terminal"), ACTIVE, publisher=P, now=103.0)) == []


def test_the_next_speaker_after_a_yield_is_explained_by_it() -> None:
    transcript, opening = _opened()
    transcript.feed(_states_for(opening, OS), ACTIVE, now=100.5)
    transcript.feed(_yield(OS, opening, "model_error", "boom"), ACTIVE, publisher=OS, now=101.0)
    [line] = transcript.feed(_reply(P, opening, "Then I will."), ACTIVE, publisher=P, now=101.5)
    assert line.why.startswith("next in the speaking order: companion_ostra gave its turn up (")
