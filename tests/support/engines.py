"""Helpers for the engine tests: cards for groups of any size and models with fault hooks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from companion.card.model import CardSettings, CompanionCard, Condition, Events, Execute, LoadedCard
from companion.models.base import (
    CompanionModel,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
)
from companion.protocol import Metadata
from support.recorders import Sink

NAMES = ("Aki", "Bea", "Cai", "Dov", "Eun", "Fay", "Gil", "Hal", "Ida", "Jun", "Kit", "Lev")

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "already_replied": {"type": "boolean", "description": "Has this companion spoken already?"},
        "energy": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["already_replied", "energy"],
}


STORIES = (
    "grew up by a harbour and collects stories from travellers.",
    "keeps bees on a city roof and names every queen.",
    "repairs clocks in a market stall and hums while working.",
    "once walked the length of a river to find where it starts.",
    "bakes bread at dawn for a whole village street.",
    "maps caves and keeps a lamp for every one of them.",
    "paints ships in bottles for sailors who never came home.",
    "sells maps of towns that have changed their names.",
    "teaches a choir of fishermen on Thursday nights.",
    "grows lemons in a greenhouse made of old windows.",
    "drives the last night tram and counts its passengers.",
    "trains pigeons to carry recipes between two islands.",
)


def make_card(
    index: int,
    *,
    max_turns: int | None = 8,
    threshold: float = 0.6,
    actions: tuple[str, ...] = ("speak",),
    knowledge: tuple[str, ...] = ("companions",),
    params: dict[str, Any] | None = None,
    conditions: Sequence[tuple[str, str]] | None = None,
) -> LoadedCard:
    """A small English card; companion ``index`` of a group. ``conditions`` (expression,
    instruction) replace its two, which read the parameter ``already_replied``."""
    name = NAMES[index % len(NAMES)] + ("" if index < len(NAMES) else str(index))
    cid = f"companion_{name.lower()}"
    speak = actions[0]
    card = CompanionCard(
        metadata=Metadata(
            id=cid,
            name=name,
            personality=f"{name} is warm, curious and a little stubborn.",
            # Each its own story (one per name): companions with one story would say one line (a copy).
            story=f"{name} {STORIES[index % len(STORIES)]}",
            sample=f"Hi, I'm {name}! Tell me something I don't know yet.",
        ),
        role="You are a friendly member of a small group chat. Keep replies short.",
        actions=list(actions),
        knowledge=list(knowledge),
        events=Events(
            params=params or PARAMS,
            conditions=[
                Condition(expression=expression, execute=[Execute(instruction=instruction, tool=speak)])
                for expression, instruction in (
                    conditions
                    if conditions is not None
                    else (
                        ("already_replied == false", "Introduce yourself."),
                        ("true", "Continue the conversation."),
                    )
                )
            ],
        ),
        settings=CardSettings(max_turns=max_turns, repetition_threshold=threshold),
    )
    return LoadedCard.from_card(card)


Hook = Callable[[Any], Awaitable[None]]


class HookedModel:
    """Delegates to ``inner``; each hook runs first (it may raise, block or kill the node)."""

    def __init__(
        self,
        inner: CompanionModel,
        *,
        on_states: Hook | None = None,
        on_params: Hook | None = None,
        on_speak: Hook | None = None,
        params_override: dict[str, Any] | None = None,
    ) -> None:
        self.inner = inner
        self.on_states = on_states
        self.on_params = on_params
        self.on_speak = on_speak
        self.params_override = params_override

    @property
    def name(self) -> str:
        return f"hooked({self.inner.name})"

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        if self.on_states is not None:
            await self.on_states(request)
        return await self.inner.decide_states(request)

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        if self.on_params is not None:
            await self.on_params(request)
        if self.params_override is not None:
            return dict(self.params_override)
        return await self.inner.fill_params(request)

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        if self.on_speak is not None:
            await self.on_speak(request)
        await self.inner.speak(request, call_tool)


class EndlessSpeaker:
    """A model that prepares replies: parameters at once; ``decisions`` as its states once
    :attr:`release` is set (each call counted); a speech that never ends (counted, and its
    cancellation too)."""

    speculates = True
    name = "endless"

    def __init__(self, decisions: Sequence[StateDecision] = ()) -> None:
        self.decisions = list(decisions)
        self.release = trio.Event()
        self.states = 0
        self.speaking = 0
        self.cancelled = 0

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        self.states += 1
        await self.release.wait()
        return list(self.decisions)

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        return {}

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        self.speaking += 1
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled += 1
            raise


class EchoSink(Sink):
    """A publisher for one engine driven by hand: it records what the engine publishes and hands
    it back to the engine, as every transport does (the echo rule of ``companion.ports``)."""

    def __init__(self, me: str) -> None:
        super().__init__()
        self.me = me
        self.engine: Any = None

    async def publish(self, topic: str, envelope: Any) -> None:
        await super().publish(topic, envelope)
        if self.engine is not None:
            from companion.ports import Inbound

            await self.engine.handle(Inbound(topic, envelope, self.me))


def solo(
    card: LoadedCard,
    model: CompanionModel,
    *,
    store: Any = None,
    timings: Any = None,
    sink: EchoSink | None = None,
) -> tuple[Any, EchoSink, list[Any]]:
    """One engine driven by hand (start its run in a nursery): ``(engine, its echoing sink, its events)``.
    It sees only itself in its directory."""
    from companion.engine.driver import ConversationEngine, EngineTimings

    me = card.card.metadata.id
    sink = sink or EchoSink(me)
    events: list[Any] = []
    engine = ConversationEngine(
        card,
        model,
        sink,
        {me: card.card.metadata},
        store=store,
        timings=timings or EngineTimings.offline(),
        observer=events.append,
    )
    sink.engine = engine
    return engine, sink, events


async def converse_over_http(
    base_url: str, timings: Any, max_turns: int | None, timeout: float
) -> tuple[Any, list[LoadedCard]]:
    """Three companions of one OpenAI-compatible endpoint at ``base_url`` (a fake server whose
    answers the caller pushed), each model checked at start-up as a node does, from one
    "Hello, everyone!" to ``terminal`` within ``timeout``: ``(the group, the cards)``. Every
    reply is addressed to companions that exist, and no one spoke twice at once."""
    from companion.app.group import MemoryGroup
    from companion.models.providers import ProviderModel, resolve_config
    from companion.models.servers import EndpointMemory

    memory = EndpointMemory()
    config = resolve_config("openai", "fake-1", base_url=base_url, environ={})
    async with MemoryGroup(timings=timings) as group:
        cards = [make_card(index, max_turns=max_turns) for index in range(3)]
        for card in cards:
            model = ProviderModel(config, memory)
            await model.check()
            await group.add(card, model)
        await group.say("Hello, everyone!")
        with trio.fail_after(timeout):
            assert await group.wait_until(lambda t: t.over, timeout), "no terminal: the conversation stalled"
    replies = [e for e in group.transcript.events if e.kind == "message" and e.in_reply_to]
    ids = {card.card.metadata.id for card in cards} | {"user_demo"}
    assert all(e.recipients and set(e.recipients) <= ids for e in replies), [e.recipients for e in replies]
    assert group.transcript.double_speech == {}
    return group, cards
