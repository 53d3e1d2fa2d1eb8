"""The bystander's transcript and the demo's pieces that need no sockets: why each speaker was
chosen, double speech, reordering, rendering, the child-process protocol, the in-memory run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from companion.app.demo import (
    DemoOptions,
    _Child,
    _converse,
    _end_event,
    _read_child,
    _stop_children,
    _wait_child,
    _Watcher,
    default_cards,
    kickoff_text,
    names_of,
    run_in_memory,
)
from companion.app.group import USER_ID
from companion.card.model import load_card
from companion.conversation.rules import (
    META_CLOSING,
    META_IN_REPLY_TO,
    META_TURN,
    StateDecision,
    finalize_states,
    turn_tag,
)
from companion.conversation.transcript import Transcript, TranscriptEvent, render_text
from companion.memory import Inbound
from companion.protocol import MESSAGES, PREVIEWS, Message, State
from support.cards import metadata

REPO = Path(__file__).resolve().parents[1]
A, B, C = "companion_a", "companion_b", "companion_c"
ACTIVE = [A, B, C]


def _reply(sender: str, to: list[str], answers: Message, turn: int, closing: str = "none") -> Message:
    meta = {META_IN_REPLY_TO: answers.params.id, META_TURN: turn, META_CLOSING: closing, "emotion": "happy"}
    return Message.create(sender, to, f"{sender} speaks", metadata=meta)


def _states(message: Message, speaker: str, closing: str = "none") -> list[State]:
    addressed = [cid for cid in message.params.to if cid.startswith("companion_")]
    decisions = [StateDecision(cid, "speak" if cid == speaker else "listen", 6, False) for cid in addressed]
    return finalize_states(decisions, addressed, floor=closing, tag=turn_tag(message)).states  # type: ignore[arg-type]


def test_each_reply_is_explained_by_the_decision_before_it() -> None:
    transcript = Transcript()
    opening = Message.create(USER_ID, ACTIVE, "Hello!")
    [line] = transcript.feed(opening, ACTIVE)
    assert (line.kind, line.speaker, line.why) == ("message", USER_ID, "opened the conversation")
    [decision] = transcript.feed(_states(opening, B), ACTIVE)
    assert (decision.kind, decision.speaker, decision.reason) == ("decision", B, "wants_to_speak")
    assert transcript.feed(_states(opening, C), ACTIVE) == []  # one verdict per message
    reply = _reply(B, [USER_ID, A, C], opening, 1)
    [line] = transcript.feed(reply, ACTIVE)
    assert line.why == decision.why and line.emotion == "happy" and line.turn == 1
    assert line.to_json()["event"] == "message" and line.to_json()["in_reply_to"] == opening.params.id
    assert transcript.feed(reply, ACTIVE) == []  # duplicates add nothing
    assert transcript.reply_count == 1 and transcript.double_speech == {}


def test_double_speech_and_a_speaker_the_rule_did_not_choose_are_flagged() -> None:
    transcript = Transcript()
    opening = Message.create(USER_ID, ACTIVE, "Hello!")
    transcript.feed(opening, ACTIVE)
    transcript.feed(_states(opening, A), ACTIVE)
    transcript.feed(_reply(A, [B, C], opening, 1), ACTIVE)
    [rogue] = transcript.feed(_reply(C, [A, B], opening, 1), ACTIVE)
    assert transcript.double_speech == {opening.params.id: [A, C]}
    assert "although the rule chose companion_a" in rogue.why
    assert "crossed a newer message" in rogue.why


def test_states_that_overtake_their_message_still_explain_it() -> None:
    transcript = Transcript()
    opening = Message.create(USER_ID, ACTIVE, "Hello!")
    early = _states(opening, C)
    assert transcript.feed(early, ACTIVE) == []
    lines = transcript.feed(opening, ACTIVE)
    assert [e.kind for e in lines] == ["message", "decision"] and lines[1].speaker == C


def test_a_reply_that_overtook_its_message_and_the_end() -> None:
    transcript = Transcript()
    opening = Message.create(USER_ID, ACTIVE, "Hello!")
    first = _reply(A, [USER_ID, B, C], opening, 1, "closing")
    transcript.feed(opening, ACTIVE)
    second = _reply(B, [A, C], first, 2, "closing")
    transcript.feed(second, ACTIVE)  # first is still on the way
    [late] = transcript.feed(first, ACTIVE)
    assert "its reply overtook it" in late.why
    assert transcript.current is second
    lines = transcript.feed(_states(second, C, "terminal"), ACTIVE)
    assert [e.kind for e in lines] == ["decision", "end"] and transcript.over
    assert lines[1].reason == "terminal" and lines[1].closing == "terminal"


def test_render_text_is_readable() -> None:
    names = {A: "Aki", B: "Bea", USER_ID: "User"}
    message = TranscriptEvent(
        "message",
        A,
        (USER_ID, B),
        "Hi!",
        "happy",
        f"{A} is selected with importance 8",
        "closing",
        3,
        "m",
        "p",
    )
    assert render_text(message, names) == (
        "Aki → User, Bea  [happy, turn 3, closing]\n    “Hi!”\n    why: Aki is selected with importance 8"
    )
    nobody = TranscriptEvent("decision", None, why="no active companion wants to speak", reason="nobody")
    assert render_text(nobody, names) == "    (nobody speaks: no active companion wants to speak)"
    assert render_text(TranscriptEvent("decision", A, reason="selected"), names) is None
    end = TranscriptEvent("end", None, closing="terminal", turn=7, reason="terminal")
    assert render_text(end, names) == "— the conversation closed (terminal) after 7 replies"
    cap = TranscriptEvent("end", None, why="the turn cap of 2 replies", reason="turn_cap")
    assert render_text(cap, names) == "— stopped (turn_cap): the turn cap of 2 replies"


def test_end_events_for_cap_and_timeout() -> None:
    transcript = Transcript()
    assert _end_event(transcript, True, 5).reason == "turn_cap"
    assert _end_event(transcript, False, 5).reason == "timeout"


def test_cards_names_and_opening_line(tmp_path: Path) -> None:
    cards = default_cards(REPO / "cards")
    assert len(cards) == 3 and all(p.suffix in (".yaml", ".yml", ".toml") for p in cards)
    loaded = [load_card(p) for p in cards]
    names = names_of(loaded)
    assert names[USER_ID] == "User" and all(names[c.card.metadata.id] == c.card.metadata.name for c in loaded)
    assert kickoff_text(loaded).startswith("Hello everyone")
    ja = loaded[0].card.model_copy(
        update={"metadata": loaded[0].card.metadata.model_copy(update={"sample": "こんにちは!"})}
    )
    assert kickoff_text([type(loaded[0]).from_card(ja)]).startswith("みなさん")
    with pytest.raises(FileNotFoundError, match="no card files"):
        default_cards(tmp_path)


class _Lines(trio.abc.ReceiveStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self._chunks.pop(0) if self._chunks else b""

    async def aclose(self) -> None:
        pass


async def test_a_child_reports_its_peer_addresses_and_directory() -> None:
    child = _Child(Path("x.yaml"), process=None, log_path=Path("x.log"))  # type: ignore[arg-type]
    chunks = [
        b"companion_x peer 12D3KooWabc\n  /ip4/127.0.0.1/tcp/4001\n",
        b"companion_x sees companion_x\ncompanion_x sees companion_",
        b"x,companion_y\n",
    ]
    await _read_child(child, _Lines(chunks))
    assert (child.companion_id, child.peer_id) == ("companion_x", "12D3KooWabc")
    assert child.addrs == ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWabc"]
    assert child.directory == {"companion_x", "companion_y"}


async def test_the_in_memory_demo_reaches_terminal(autojump_clock: trio.testing.MockClock) -> None:
    cards = [load_card(p) for p in default_cards(REPO / "cards")]
    events: list[TranscriptEvent] = []
    end = await run_in_memory(cards, seed=3, max_replies=30, timeout=600, emit=events.append)
    assert end.reason == "terminal" and events[-1] == end
    assert [e.kind for e in events].count("end") == 1
    replies = [e for e in events if e.kind == "message" and e.in_reply_to]
    assert 2 <= len(replies) <= 12 and replies[-1].closing == "closing"


async def _child(code: str, tmp_path: Path, nursery: trio.Nursery) -> _Child:
    process = await trio.lowlevel.open_process([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child = _Child(Path("card.yaml"), process, tmp_path / "card.log")
    assert process.stdout is not None
    nursery.start_soon(_read_child, child, process.stdout)
    return child


async def test_a_child_that_exits_early_is_reported_with_its_log(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        child = await _child("import sys; sys.exit(3)", tmp_path, nursery)
        with pytest.raises(RuntimeError, match=r"exited with 3 before start listening; its log: .*card\.log"):
            await _wait_child(child, lambda c: bool(c.addrs), 20, "start listening")


async def test_a_silent_child_times_out_and_is_stopped(tmp_path: Path) -> None:
    code = "import time; print('companion_x peer P', flush=True); time.sleep(60)"
    async with trio.open_nursery() as nursery:
        child = await _child(code, tmp_path, nursery)
        with pytest.raises(TimeoutError, match=r"did not start listening within 0\.5 s"):
            await _wait_child(child, lambda c: bool(c.addrs), 0.5, "start listening")
        assert child.peer_id == "P"
        with trio.fail_after(15):
            await _stop_children([child], grace=5)
        assert child.process.returncode == -signal.SIGTERM


async def test_a_child_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('companion_x sees companion_x', flush=True); time.sleep(60)"
    )
    async with trio.open_nursery() as nursery:
        child = await _child(code, tmp_path, nursery)
        await _wait_child(child, lambda c: bool(c.directory), 20, "ignore SIGTERM")
        with trio.fail_after(15):
            await _stop_children([child], grace=0.5)
        assert child.process.returncode == -signal.SIGKILL


async def test_the_opening_line_is_resent_until_answered_then_given_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[Message] = []

    class Bridge:
        async def publish(self, topic: str, envelope: Message) -> None:
            sent.append(envelope)

    watcher = _Watcher(Transcript(), {}, lambda event: None)
    opening = Message.create(USER_ID, ACTIVE, "Hello?")
    options = DemoOptions(cards=[], timeout=10.0)
    end = await _converse(Bridge(), watcher, opening, options)
    assert (end.kind, end.reason) == ("end", "timeout") and "no companion answered" in end.why
    assert len(sent) >= 3 and {m.params.id for m in sent} == {opening.params.id}


async def test_the_demo_shows_a_line_when_its_message_comes_not_its_preview() -> None:
    shown: list[TranscriptEvent] = []
    watcher = _Watcher(Transcript(), {A: metadata("a")}, shown.append)
    opening = Message.create(USER_ID, [A], "Hello?", id="m-open")
    await watcher.handle(Inbound(MESSAGES, opening, USER_ID))
    line = _reply(A, [USER_ID], opening, 1)
    await watcher.handle(Inbound(PREVIEWS, line, A))
    assert [e.text for e in shown if e.kind == "message"] == ["Hello?"]
    await watcher.handle(Inbound(MESSAGES, line, A))
    assert [e.text for e in shown if e.kind == "message"] == ["Hello?", f"{A} speaks"]
