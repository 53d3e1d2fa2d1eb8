"""The engine's stop (``ConversationEngine.stop``) while a streamed line is being voiced, past the
grace: the line is cut short so its reply publishes what was heard; a model that then never hands
its line over is withdrawn within the publish deadline, so the stop still ends in bounded time."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from companion.actions.builtins import VOICE_TOOL
from companion.models.base import ParamsRequest, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from companion.ports import Inbound
from companion.protocol import MESSAGES, QUERIES, Message
from support.engines import make_card, solo


class StuckStreamer:
    """Streams its line's first sentence to the live line, then neither writes more nor hands
    the line over (a model server that stopped sending)."""

    streams_speech = True
    name = "stuck-streamer"

    def __init__(self, me: str) -> None:
        self.me = me

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        return [StateDecision(self.me, "speak", 7, False)]

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        return {}

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        assert request.live is not None
        request.live.grow(VOICE_TOOL, "Fine. Calm seas tonight")
        await trio.sleep_forever()


async def test_a_line_cut_short_whose_model_never_hands_it_over_is_withdrawn_in_bounded_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    card = make_card(0, max_turns=None, actions=(VOICE_TOOL,))
    me = card.card.metadata.id
    engine, sink, events = solo(card, StuckStreamer(me))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await engine.handle(Inbound(MESSAGES, Message.create("user_x", [me], "How is the sea?"), "peer"))
        with trio.fail_after(30):
            while not sink.on(QUERIES):  # "Fine." is being said: nobody answers it
                await trio.sleep(0.05)
        started = trio.current_time()
        with trio.fail_after(30):
            await engine.stop(grace=1.0)
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    kinds = [e.kind for e in events]
    assert kinds.count("voice_line_cut_short") == 1
    assert [e.fields["reason"] for e in events if e.kind == "withdrawn"] == ["stopping"]
    assert [m for m in sink.on(MESSAGES) if m.params.from_ == me] == []
    assert took <= 1.0 + 2 * engine.timings.publish_timeout + 0.01
