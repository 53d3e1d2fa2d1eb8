"""The engine's side of a message's preview: the next leader's states call and the likely
speaker's prepared reply start from it, held; the message itself takes them over when it is the
same, and otherwise (another text, or no message within a speaking slot) they are cancelled and
nothing of them goes out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import trio
import trio.testing

from companion.conversation.rules import META_CLOSING, META_IN_REPLY_TO, META_TURN
from companion.engine.driver import ConversationEngine
from companion.models.base import StateDecision
from companion.ports import Inbound
from companion.protocol import MESSAGES, PREVIEWS, Message
from companion.timings import EngineTimings
from support.engines import EchoSink, EndlessSpeaker, make_card

TIMINGS = EngineTimings(states_timeout=5.0, takeover_after=15.0, speak_timeout=20.0, reply_timeout=30.0)
SPEAKER, NEXT = make_card(0, max_turns=None), make_card(1, max_turns=None)
A, B = SPEAKER.card.metadata.id, NEXT.card.metadata.id
USER = "user_demo"


def _line(text: str = "The shelf holds three old maps. Shall we look?") -> Message:
    meta = {"emotion": "calm", META_IN_REPLY_TO: "m-ask", META_TURN: 1, META_CLOSING: "none"}
    return Message.create(A, [USER, B], text, metadata=meta, id="m-line")


class SerialSpeaker(EndlessSpeaker):
    """The model of a server that answers one request at a time (llama-cpp-python): it prepares
    no reply beside the states call, but does from a preview (the server is idle while a line is
    voiced); its parameters come once :attr:`params_release` is set."""

    speculates = False
    works_ahead = True
    serial = True

    def __init__(self, decisions: list[StateDecision]) -> None:
        super().__init__(decisions)
        self.params_release = trio.Event()
        self.params = 0

    async def fill_params(self, request: Any) -> dict[str, Any]:
        self.params += 1
        await self.params_release.wait()
        return {}


@asynccontextmanager
async def _next_speaker(
    pipeline: bool = True, model: EndlessSpeaker | None = None
) -> AsyncIterator[tuple[ConversationEngine, EchoSink, list[Any], EndlessSpeaker]]:
    """B's engine, which A's line addresses alone: B leads its turn and is its likely speaker."""
    model = model or EndlessSpeaker([StateDecision(B, "speak", 5, True)])
    sink = EchoSink(B)
    events: list[Any] = []
    directory = {A: SPEAKER.card.metadata, B: NEXT.card.metadata}
    timings = replace(TIMINGS, pipeline=pipeline)
    engine = ConversationEngine(NEXT, model, sink, directory, timings=timings, observer=events.append)
    sink.engine = engine
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield engine, sink, events, model
        nursery.cancel_scope.cancel()


def kinds(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.kind == kind]


async def test_the_message_takes_over_the_work_its_preview_started() -> None:
    async with _next_speaker() as (engine, sink, events, model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        assert (model.states, model.speaking) == (1, 1)  # both started while the line is voiced
        assert not sink.on("states") and not sink.on("queries") and not sink.on("messages")
        await engine.handle(Inbound(MESSAGES, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        assert kinds(events, "states_ahead_adopted")
        assert (model.states, model.speaking, model.cancelled) == (1, 1, 0)  # nothing asked twice
        model.release.set()
        await trio.testing.wait_all_tasks_blocked()
        [states] = sink.on("states")
        assert [s.params.from_ for s in states if s.params.selected] == [B]
        assert kinds(events, "reply_prepared_adopted")  # the speech begun from the preview is B's reply
        assert (model.speaking, model.cancelled) == (1, 0)


async def test_a_message_that_differs_from_its_preview_starts_afresh() -> None:
    async with _next_speaker() as (engine, sink, events, model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        await engine.handle(Inbound(MESSAGES, _line("The shelf holds three old maps."), A))
        await trio.testing.wait_all_tasks_blocked()
        assert kinds(events, "states_ahead_dropped") and not kinds(events, "states_ahead_adopted")
        assert model.states == 2  # asked again, for the message as it came
        assert model.cancelled == 1 and model.speaking == 2
        assert not sink.on("states") and not sink.on("queries")


async def test_a_preview_whose_message_never_comes_is_dropped_after_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _next_speaker() as (engine, sink, events, model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.sleep(TIMINGS.reply_timeout - 0.1)
        assert not kinds(events, "states_ahead_dropped")
        await trio.sleep(0.2)
        [dropped] = kinds(events, "states_ahead_dropped")
        assert "did not arrive" in dropped.fields["reason"]
        assert model.cancelled == 1  # its own deadline or the drop: never adopted
        assert not sink.on("states") and not sink.on("queries") and not sink.on("messages")
        assert engine.conversation.turn is None  # the conversation never moved


async def test_without_pipelining_a_preview_starts_nothing() -> None:
    async with _next_speaker(pipeline=False) as (engine, _sink, _events, model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        assert (model.states, model.speaking) == (0, 0)


async def test_a_held_states_call_keeps_its_deadline_from_the_preview(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _next_speaker() as (engine, sink, events, model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.sleep(1.0)
        await engine.handle(Inbound(MESSAGES, _line(), A))
        await trio.sleep(TIMINGS.states_timeout - 1.1)
        assert not sink.on("states")
        await trio.sleep(0.2)  # the model never answered: rule-based states, at the preview's deadline
        [states] = sink.on("states")
        assert [s.params.from_ for s in states] == [B] and model.states == 1
        assert kinds(events, "states_model_timeout")


async def test_stopping_drops_the_states_asked_from_a_preview() -> None:
    async with _next_speaker() as (engine, sink, events, _model):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        await engine.stop(grace=1.0)
        assert [e.fields["reason"] for e in kinds(events, "states_ahead_dropped")] == ["stopping"]
        assert not sink.on("states")


async def test_a_serial_model_prepares_from_a_preview_its_parameters_before_its_speech() -> None:
    """While A's line is voiced the serial server is idle: B's states, parameters and speech are
    asked then, the speech only once the parameters came (side by side it would only queue, and
    be written again if they chose other instructions than the guess)."""
    model = SerialSpeaker([StateDecision(B, "speak", 5, True)])
    async with _next_speaker(model=model) as (engine, sink, events, _):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        assert (model.states, model.params, model.speaking) == (1, 1, 0)
        model.params_release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert model.speaking == 1
        await engine.handle(Inbound(MESSAGES, _line(), A))
        model.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert kinds(events, "states_ahead_adopted") and kinds(events, "reply_prepared_adopted")
        assert (model.states, model.params, model.speaking, model.cancelled) == (1, 1, 1, 0)
        assert not kinds(events, "reply_prepared_again")
        assert not sink.on("messages")  # the speech never ends here: nothing said before its slot


async def test_a_slot_that_comes_before_the_prepared_speech_says_so() -> None:
    """The message came while the prepared reply still waited for its parameters: the slot and
    the preparation wait for the same answer, and whichever wakes first asks for the speech, once.
    When the slot does, the preparation is dropped for that reason, not for asking another reply
    (it asked none)."""
    model = SerialSpeaker([StateDecision(B, "speak", 5, True)])
    async with _next_speaker(model=model) as (engine, _sink, events, _):
        await engine.handle(Inbound(PREVIEWS, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        await engine.handle(Inbound(MESSAGES, _line(), A))
        model.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert (model.params, model.speaking) == (1, 0)  # both wait for the parameters
        model.params_release.set()
        await trio.testing.wait_all_tasks_blocked()
        dropped = [e.fields["reason"] for e in kinds(events, "reply_prepared_dropped")]
        # one speech goes on (a preparation dropped as it woke was cancelled before it asked)
        assert (model.params, model.speaking - model.cancelled) == (1, 1)
        assert kinds(events, "reply_prepared_adopted") or dropped == [
            "the slot came before the prepared speech was asked for"
        ]


async def test_a_serial_model_prepares_nothing_beside_the_states_call() -> None:
    """Without a preview the message's states call is on the server: a reply prepared beside it
    would queue there, and the first words would wait for both."""
    model = SerialSpeaker([StateDecision(B, "speak", 5, True)])
    model.params_release.set()
    async with _next_speaker(model=model) as (engine, _sink, events, _):
        await engine.handle(Inbound(MESSAGES, _line(), A))
        await trio.testing.wait_all_tasks_blocked()
        assert (model.states, model.params, model.speaking) == (1, 0, 0)
        assert not kinds(events, "reply_prepared")
        model.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert (model.params, model.speaking) == (1, 1)  # the slot asks them, one after the other
