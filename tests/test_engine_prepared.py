"""A reply prepared before its slot (``Speaker.prepare``) ends by itself: at its deadline, or
when the engine is told the turn went elsewhere; in neither case does anything go out. A
prepared speech its parameters replaced never speaks, however late its cancellation reaches it.
A stop keeps it for a slot already open for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from companion.conversation.events import Speak
from companion.engine.driver import EngineTimings
from companion.models.base import ParamsRequest, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from companion.ports import Inbound
from companion.protocol import MESSAGES, Message
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


INTRODUCTION = "I'm Aki, and the sea at night is my favourite thing."
CONTINUATION = "The tide is turning, can you hear it?"


class LateCancelledSpeaker:
    """States and parameters when the test gives them; each speech calls its tool inside a body
    that the caller's cancellation reaches only when the test lets it (``shield`` lifted), as a
    model on trio-asyncio's loop sees it: the loop forwards a cancellation into its body a
    scheduling step later. The speech the parameters choose calls its tool when the test says."""

    speculates = True
    name = "late-cancelled"

    def __init__(self, me: str) -> None:
        self.me = me
        self.states_given = trio.Event()
        self.params_given = trio.Event()
        self.chosen_may_speak = trio.Event()
        self.asked: list[str] = []
        self.bodies: list[trio.CancelScope] = []

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        await self.states_given.wait()
        return [StateDecision(self.me, "speak", 7, False)]

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        await self.params_given.wait()
        return {"already_replied": False, "energy": 3}

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        instruction = request.instructions[0]
        self.asked.append(instruction.instruction)
        introduce = instruction.instruction == "Introduce yourself."
        if introduce:
            await self.chosen_may_speak.wait()
        line = INTRODUCTION if introduce else CONTINUATION
        with trio.CancelScope(shield=True) as body:
            self.bodies.append(body)
            await call_tool(instruction.tool, {"message": line, "to": ["user_demo"], "emotion": "happy"})


async def test_a_guess_the_parameters_replaced_never_speaks_when_its_cancellation_comes_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The card's order holds for a prepared reply: parameters, then the conditions, then the
    instructions. The guess (no parameters yet: "Continue the conversation.") waits in its tool
    call for the slot when the parameters choose "Introduce yourself."; the slot adopts the
    second speech, and the guess, cancelled but not reached yet, must not say its line (it did,
    about one run in 80, in the provider test over HTTP)."""
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    model = LateCancelledSpeaker(me)
    engine, sink, events = solo(card, model)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        opening = Message.create("user_demo", [me], "Who are you?")
        await engine.handle(Inbound(MESSAGES, opening, "peer"))
        await trio.testing.wait_all_tasks_blocked()
        assert model.asked == ["Continue the conversation."]  # the guess waits in its tool call
        model.params_given.set()
        await trio.testing.wait_all_tasks_blocked()
        assert model.asked == ["Continue the conversation.", "Introduce yourself."]
        (guess,) = model.bodies
        model.states_given.set()  # the slot is this companion's: it adopts the second speech
        await trio.testing.wait_all_tasks_blocked()
        assert not sink.on(MESSAGES)
        guess.shield = False  # the guess's cancellation arrives
        model.chosen_may_speak.set()
        await sink.until_sent(MESSAGES, 1, timeout=10)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [m.params.message for m in sink.on(MESSAGES)] == [INTRODUCTION]
    kinds = [e.kind for e in events if e.kind.startswith("reply_prepared")]
    assert kinds == ["reply_prepared", "reply_prepared_again", "reply_prepared_adopted"]


class HeldSpeaker:
    """Prepares replies (``speculates``); states and parameters at once; each speech is counted
    and says its line once the test lets it."""

    speculates = True
    name = "held-speaker"

    def __init__(self, me: str) -> None:
        self.me = me
        self.speeches = 0
        self.may_speak = trio.Event()

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        return [StateDecision(self.me, "speak", 7, False)]

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        return {"already_replied": False, "energy": 3}

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        self.speeches += 1
        await self.may_speak.wait()
        tool = request.instructions[0].tool
        await call_tool(tool, {"message": INTRODUCTION, "to": ["user_demo"], "emotion": "happy"})


async def test_a_stop_leaves_the_prepared_reply_to_the_slot_already_open_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop that comes once this companion's slot has opened, before the slot took its
    prepared reply over (here it paces itself first): the slot is a reply in flight, which a
    stop gives its grace, and it adopts the reply prepared for it. Dropped instead, the slot
    asked the model for the same reply again (seen end to end: on a server that answers one
    request at a time it queued behind the cancelled one, still being written)."""
    card = make_card(0, max_turns=None, conditions=[("true", "Continue the conversation.")])
    me = card.card.metadata.id
    model = HeldSpeaker(me)
    engine, sink, events = solo(card, model, timings=EngineTimings.offline(pace=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        opening = Message.create("user_demo", [me], "Who are you?")
        await engine.handle(Inbound(MESSAGES, opening, "peer"))
        with trio.fail_after(10):
            while not any(e.kind == "speaker_chosen" for e in events):
                await trio.sleep(0.01)
        assert model.speeches == 1  # the prepared one, waiting to speak
        stopped = trio.Event()

        async def stop() -> None:
            await engine.stop(grace=5.0)
            stopped.set()

        nursery.start_soon(stop)
        await trio.sleep(0.5)  # stopping, the slot still pacing itself
        model.may_speak.set()
        with trio.fail_after(30):
            await stopped.wait()
        nursery.cancel_scope.cancel()
    assert model.speeches == 1
    assert [m.params.message for m in sink.on(MESSAGES) if m.params.from_ == me] == [INTRODUCTION]
    kinds = [e.kind for e in events if e.kind.startswith("reply_prepared")]
    assert kinds == ["reply_prepared", "reply_prepared_adopted"]
