"""A reply prepared before its slot (``Speaker.prepare``) ends by itself: at its deadline, or
when the engine is told the turn went elsewhere; in neither case does anything go out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from companion.conversation.events import Speak
from companion.protocol import Message
from support.engines import EchoSink, EndlessSpeaker, make_card, solo


def _expected(me: str) -> Speak:
    message = Message.create("user_demo", [me], "How is the sea tonight?", id="m-1")
    return Speak("m-1", message, "none", 1, ("user_demo",), ("user_demo",), ())


@asynccontextmanager
async def _preparing(limit: float) -> AsyncIterator[tuple[Any, EchoSink, list[Any], EndlessSpeaker]]:
    """One engine whose speaker has just prepared its reply to ``m-1`` (at most ``limit`` s)."""
    card = make_card(0, max_turns=None)
    model = EndlessSpeaker()
    engine, sink, events = solo(card, model)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        effect = _expected(card.card.metadata.id)
        assert engine._speaker.prepare(effect, [effect.message], {}, nursery, limit)
        await trio.testing.wait_all_tasks_blocked()
        assert model.speaking == 1 and model.cancelled == 0
        yield engine, sink, events, model
        nursery.cancel_scope.cancel()
    assert not sink.on("messages") and not sink.on("queries")  # no line, no speak query


async def test_a_prepared_reply_nobody_adopts_ends_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _preparing(5.0) as (_engine, _sink, _events, model):
        await trio.sleep(4.9)
        assert model.cancelled == 0
        await trio.sleep(0.2)
        assert model.cancelled == 1


async def test_a_prepared_reply_for_an_older_message_is_dropped_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _preparing(60.0) as (engine, _sink, events, model):
        engine._speaker.keep_prepared("m-1", "")  # still its turn: kept
        await trio.testing.wait_all_tasks_blocked()
        assert model.cancelled == 0
        engine._speaker.keep_prepared("m-2", "a newer message")
        await trio.testing.wait_all_tasks_blocked()
        assert model.cancelled == 1
    dropped = [e for e in events if e.kind == "reply_prepared_dropped"]
    assert [e.fields["reason"] for e in dropped] == ["a newer message"]
