"""A reply leaves only once its "replied" mark is on disk.

A node that is killed as its reply goes out, started again and chosen again for the same message
(gossip replays it; the leader's states array names it) must not answer it twice. The mark is
committed by the store's worker thread; these tests give that thread the disks users have: a
slow one (an SD card, a busy laptop) and one that stops committing (full, unplugged). They run on
the real clock: a mock clock takes the wait for the worker thread for idleness and skips the
turn's deadlines.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from companion.conversation.rules import META_IN_REPLY_TO
from companion.engine.driver import EngineTimings
from companion.memory import Inbound
from companion.models.scripted import ScriptedModel
from companion.protocol import MESSAGES, Message
from companion.store.sqlite import Store
from support.engines import EchoSink, make_card, solo

TIMINGS = EngineTimings.offline()
SLOW_COMMIT = 0.3
"""Seconds each commit of the slow disk takes (the first ones of a reply are well inside it)."""


def marked_on_disk(path: Path, message_id: str) -> bool:
    """What a node started again on this file would read: the committed "replied" mark."""
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT 1 FROM seen WHERE kind = 'replied' AND id = ?", (message_id,)).fetchone()
    finally:
        db.close()
    return row is not None


class DiskWatchingSink(EchoSink):
    """Notes, as each of the companion's replies is handed to the network, whether the mark of
    the message it answers was already committed."""

    def __init__(self, me: str, path: Path) -> None:
        super().__init__(me)
        self.path = path
        self.marked_when_sent: list[bool] = []

    async def publish(self, topic: str, envelope: Any) -> None:
        if topic == MESSAGES and envelope.params.from_ == self.me:
            answered = (envelope.params.metadata or {}).get(META_IN_REPLY_TO, "")
            self.marked_when_sent.append(marked_on_disk(self.path, answered))
        await super().publish(topic, envelope)


def slowed(store: Store, delay: float, failing: list[bool]) -> None:
    """Make each commit of ``store``'s writer take ``delay`` seconds, and fail as a full disk does
    (``sqlite3.OperationalError``, nothing written) while ``failing[0]`` is set."""
    writer = store._writer
    commit = writer._commit

    def slow_commit(batch: Any) -> Exception | None:
        time.sleep(delay)
        if failing[0]:
            return sqlite3.OperationalError("database or disk is full")
        return commit(batch)

    writer._commit = slow_commit  # type: ignore[method-assign]


def engine_on(store: Store) -> tuple[Any, DiskWatchingSink, list[Any]]:
    card = make_card(0, max_turns=None)
    sink = DiskWatchingSink(card.card.metadata.id, store.path)
    engine, _, events = solo(card, ScriptedModel(0), store=store, timings=TIMINGS, sink=sink)
    return engine, sink, events


@pytest.mark.parametrize("delay", [0.0, SLOW_COMMIT])
async def test_the_mark_is_committed_before_the_reply_goes_out(tmp_path: Path, delay: float) -> None:
    with Store.in_directory(tmp_path) as store:
        slowed(store, delay, [False])
        engine, sink, _ = engine_on(store)
        me = engine.me.id
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            for text in ("Are you there?", "And now?", "One more."):
                count = len(sink.on(MESSAGES))
                await engine.handle(Inbound(MESSAGES, Message.create("user_x", [me], text), "peer"))
                await sink.until_sent(MESSAGES, count + 1, timeout=10)
            nursery.cancel_scope.cancel()
        assert sink.marked_when_sent == [True, True, True]


async def test_a_disk_that_will_not_commit_keeps_the_companion_silent_then_it_answers_again(
    tmp_path: Path,
) -> None:
    failing = [True]
    with Store.in_directory(tmp_path) as store:
        slowed(store, 0.0, failing)
        engine, sink, events = engine_on(store)
        me = engine.me.id
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            first = Message.create("user_x", [me], "Are you there?")
            await engine.handle(Inbound(MESSAGES, first, "peer"))
            with trio.fail_after(TIMINGS.reply_timeout):  # the turn ends unanswered
                while "turn_unanswered" not in [e.kind for e in events]:
                    await trio.sleep(0.02)
            assert sink.on(MESSAGES) == []
            failed = next(e for e in events if e.kind == "store_failed")
            assert failed.fields["call"] == "mark_replied" and "not committed" in failed.fields["error"]
            failing[0] = False  # the disk has room again
            second = Message.create("user_x", [me], "Hello?")
            await engine.handle(Inbound(MESSAGES, second, "peer"))
            replies = await sink.until_sent(MESSAGES, 1, timeout=10)
            await trio.sleep(TIMINGS.publish_timeout)  # nothing else goes out (the first stays unanswered)
            nursery.cancel_scope.cancel()
        assert [(r.params.metadata or {})[META_IN_REPLY_TO] for r in replies] == [second.params.id]
        assert sink.marked_when_sent == [True]
        assert "store_recovered" in [e.kind for e in events]
