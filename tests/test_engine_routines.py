"""Routines driven by the engine on the in-memory hub, with trio's fake clock: each trigger fires
at its time through the action runtime, a speaking routine never talks over a conversation (it
waits, and fires once it is over), a node that just started greets nobody, a flapping peer is
not greeted twice, and the tool list goes out as ``companion.tools``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from companion.actions import TOOLS_ACTION, KeyValueStore
from companion.app.group import USER_ID, MemoryGroup
from companion.card.model import LoadedCard, load_card
from companion.card.routines import Routine
from companion.conversation.rules import META_CLOSING, META_IN_REPLY_TO
from companion.engine.driver import ConversationEngine, EngineEvent, EngineTimings
from companion.engine.tools import DEFAULT_REFRESH_GAP
from companion.memory import Inbound, MemoryHub
from companion.models.scripted import ScriptedModel
from companion.protocol import ACTIONS, MESSAGES, Action, Message
from companion.store.sqlite import Store
from support.engines import make_card

TIMINGS = EngineTimings.offline()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
AKI, BEA, CAI = "companion_aki", "companion_bea", "companion_cai"


def with_routines(index: int, *routines: dict[str, Any], actions: tuple[str, ...] = ("speak",)) -> LoadedCard:
    card = make_card(index, actions=actions, max_turns=4).card
    card = card.model_copy(update={"routines": [Routine.model_validate(r) for r in routines]})
    return LoadedCard.from_card(card)


@dataclass
class Seen:
    """Every payload on the hub with the (fake) time it arrived, and the engines' events."""

    payloads: list[tuple[float, str, Any]] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)

    def messages(self, sender: str | None = None) -> list[tuple[float, Message]]:
        return [
            (at, p)
            for at, topic, p in self.payloads
            if topic == MESSAGES and isinstance(p, Message) and sender in (None, p.params.from_)
        ]

    def actions(self, name: str) -> list[tuple[float, Action]]:
        return [
            (at, p)
            for at, topic, p in self.payloads
            if topic == ACTIONS and isinstance(p, Action) and p.params.name == name
        ]

    def texts(self, sender: str) -> list[str]:
        return [m.params.message for _, m in self.messages(sender)]

    def kinds(self, kind: str) -> list[EngineEvent]:
        return [e for e in self.events if e.kind == kind]


@asynccontextmanager
async def hub_group() -> AsyncIterator[tuple[MemoryGroup, Seen]]:
    seen = Seen()
    async with (
        trio.open_nursery() as nursery,
        MemoryGroup(timings=TIMINGS, on_engine_event=seen.events.append) as group,
    ):
        spy = group.hub.endpoint("spy")

        async def watch() -> None:
            async for inbound in spy.receive_channel:
                seen.payloads.append((trio.current_time(), inbound.topic, inbound.payload))

        nursery.start_soon(watch)
        yield group, seen
        nursery.cancel_scope.cancel()


GREET = {
    "name": "greet",
    "tool": "speak",
    "on": "joined",
    "input": {"emotion": "happy"},
    "args": {"to": "[companion_id]", "message": '"Welcome, " + companion_name + "!"'},
}


def talk_overlaps(seen: Seen, routine_texts: set[str]) -> list[str]:
    """Routine messages sent while a conversation ran: one that was not closed (``terminal``)
    and whose last message is less than a reply slot old."""
    overlaps, last, closed = [], -1e9, True
    for at, message in seen.messages():
        spoken = message.params.message in routine_texts and message.params.from_ != USER_ID
        if spoken and not closed and at - last < TIMINGS.reply_timeout:
            overlaps.append(f"{message.params.message!r} at {at:.1f}, {at - last:.1f} s after talk")
        meta = message.params.metadata or {}
        last, closed = at, meta.get(META_CLOSING) == "terminal"
    return overlaps


async def test_a_newcomer_is_greeted_once_and_those_present_at_start_are_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_group() as (group, seen):
        await group.add(with_routines(0, GREET), ScriptedModel(0))
        await group.add(make_card(1, max_turns=4), ScriptedModel(1))  # there from the start
        await trio.sleep(30)
        assert seen.texts(AKI) == [], "greeted a companion that was there when it started"
        await group.add(make_card(2, max_turns=4), ScriptedModel(2))
        await trio.sleep(1)
        assert seen.texts(AKI)[:1] == ["Welcome, Cai!"]
        welcome = seen.messages(AKI)[0][1]
        assert welcome.params.to == [CAI]
        await trio.sleep(60)
        # The greeting opened a conversation: the newcomer answered it.
        answers = [m for _, m in seen.messages(CAI) if (m.params.metadata or {}).get(META_IN_REPLY_TO)]
        assert answers and (answers[0].params.metadata or {})[META_IN_REPLY_TO] == welcome.params.id
        aki = group.members[AKI]
        # Cai's connection flaps: gone for 5 s (inside the rejoin grace), then back.
        cai_meta = aki.directory.pop(CAI)
        aki.engine.directory_changed()
        await trio.sleep(5)
        aki.directory[CAI] = cai_meta
        aki.engine.directory_changed()
        await trio.sleep(150)
        assert seen.texts(AKI).count("Welcome, Cai!") == 1, "a flapping peer was greeted twice"
        # Gone for longer than the grace: a real return, greeted again.
        aki.directory.pop(CAI)
        aki.engine.directory_changed()
        await trio.sleep(TIMINGS.rejoin_grace + 5)
        aki.directory[CAI] = cai_meta
        aki.engine.directory_changed()
        await trio.sleep(150)
        assert seen.texts(AKI).count("Welcome, Cai!") == 2
    assert talk_overlaps(seen, {"Welcome, Cai!"}) == []


async def test_every_fires_on_the_clock_and_its_store_counts_across_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    card = with_routines(0, {"tool": "ping", "every": "30s"}, actions=("speak", "support.routines:ping"))
    async with hub_group() as (group, seen):
        start = trio.current_time()
        await group.add(card, ScriptedModel(0))
        await trio.sleep(95)
    pings = seen.actions("ping")
    assert [round(at - start) for at, _ in pings] == [30, 60, 90]
    assert [a.params.params["count"] for _, a in pings] == [1, 2, 3]


async def test_idle_speaks_after_silence_and_not_again_until_someone_else_speaks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nudge = {
        "tool": "speak",
        "idle": "60s",
        "input": {"message": "Is anybody there?", "to": [BEA], "emotion": "neutral"},
    }
    async with hub_group() as (group, seen):
        start = trio.current_time()
        await group.add(with_routines(0, nudge), ScriptedModel(0))
        await group.add(make_card(1, max_turns=4), ScriptedModel(1))
        await trio.sleep(59)
        assert seen.texts(AKI) == []
        await trio.sleep(2)
        first_at, first = seen.messages(AKI)[0]
        assert first.params.message == "Is anybody there?" and 60 <= first_at - start <= 61
        await trio.sleep(400)
    nudges = [(at, m) for at, m in seen.messages(AKI) if m.params.message == "Is anybody there?"]
    # Bea answered the first, so the silence after that conversation counts again: a second one,
    # each at least 60 s after anyone else's last message, never in the middle of talk.
    assert len(nudges) >= 2
    for at, _ in nudges:
        others = [t for t, m in seen.messages() if m.params.from_ != AKI and t < at]
        assert not others or at - max(others) >= 60
    assert talk_overlaps(seen, {"Is anybody there?"}) == []


async def test_a_cel_guard_picks_the_messages_an_on_message_routine_fires_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lamp = {"tool": "ping", "on": "message", "when": 'sender != me && text.contains("lamp")', "cooldown": 1}
    card = with_routines(0, lamp, actions=("speak", "support.routines:ping"))
    async with hub_group() as (group, seen):
        await group.add(card, ScriptedModel(0))
        await trio.sleep(10)
        await group.say("Good morning!")
        await trio.sleep(30)
        await group.say("Could you switch on the lamp?")
        await trio.sleep(30)
        await group.say("Thanks.")
        await trio.sleep(30)
    assert len(seen.actions("ping")) == 1


async def test_a_routine_due_during_a_conversation_waits_for_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tea = {
        "tool": "speak",
        "every": "20s",
        "max_fires": 1,
        "input": {"message": "Time for tea!", "to": [BEA], "emotion": "happy"},
    }
    async with hub_group() as (group, seen):
        start = trio.current_time()
        await group.add(with_routines(0, tea), ScriptedModel(0))
        await group.add(make_card(1, max_turns=4), ScriptedModel(1))
        await trio.sleep(15)
        await group.say("Hello you two, what shall we do today?")
        await trio.sleep(300)
    teas = [at for at, m in seen.messages(AKI) if m.params.message == "Time for tea!"]
    assert len(teas) == 1
    talk = [at for at, m in seen.messages() if m.params.message != "Time for tea!" and at < teas[0]]
    assert len(talk) >= 3, "the conversation did not run before the routine"
    assert teas[0] - start > 20, "it fired on time, over the conversation"
    assert talk_overlaps(seen, {"Time for tea!"}) == []
    assert group.transcript.double_speech == {}
    # the tea opens a new exchange on Bea's node although the last one ended (terminal)
    tea_id = next(m.params.id for _, m in seen.messages(AKI) if m.params.message == "Time for tea!")
    answers = [m for _, m in seen.messages(BEA) if (m.params.metadata or {}).get(META_IN_REPLY_TO) == tea_id]
    assert len(answers) == 1, "Bea never answered the routine's message"


async def test_a_conversation_that_starts_while_the_tool_works_defers_its_message(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hello = {"tool": "slow_hello", "every": "20s", "max_fires": 1, "input": {"to": BEA}}
    card = with_routines(0, hello, actions=("speak", "support.routines:slow_hello"))
    async with hub_group() as (group, seen):
        await group.add(card, ScriptedModel(0))
        await group.add(make_card(1, max_turns=4), ScriptedModel(1))
        await trio.sleep(21)  # fired at 20 s; its tool works until 23 s
        await group.say("Quick question for both of you!")
        await trio.sleep(300)
    hellos = [m for _, m in seen.messages(AKI) if m.params.message == "Hello from a routine!"]
    assert len(hellos) == 1
    assert [e.fields["routine"] for e in seen.kinds("routine_deferred")] == ["slow_hello#0"]
    assert talk_overlaps(seen, {"Hello from a routine!"}) == []


async def test_the_tool_list_is_announced_once_settled_and_peers_keep_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_group() as (group, seen):
        await group.add(make_card(0), ScriptedModel(0))
        await group.add(make_card(1), ScriptedModel(1))
        await trio.sleep(10)
        aki, bea = group.members[AKI].engine, group.members[BEA].engine
        assert bea.peer_tools[AKI] == {"revision": 2, "tools": ["speak", "companions"]}
        aki.runtime.remove("companions")
        await trio.sleep(5)
        assert bea.peer_tools[AKI] == {"revision": 3, "tools": ["speak"]}
    changes = [a.params.params.get("change") for _, a in seen.actions(TOOLS_ACTION) if a.params.from_ == AKI]
    assert {"kind": "removed", "tool": "companions"} in changes


async def test_companions_joining_together_make_a_node_send_its_list_once_more_not_once_each(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every join used to send the whole list to the whole network again (2 s apart at most):
    with 30 companions starting together each node heard 265 lists in its first minute. Eight
    companions joining over 16 s now get one list more, ``refresh_gap`` after the last; a
    companion that joins long after still gets it at once."""
    async with hub_group() as (group, seen):
        await group.add(make_card(0), ScriptedModel(0))
        await trio.sleep(TIMINGS.routine_quiet_start + 1)

        def sent() -> list[float]:
            return [at for at, a in seen.actions(TOOLS_ACTION) if a.params.from_ == AKI]

        settled = sent()
        assert len(settled) == 1
        for index in range(1, 9):
            await group.add(make_card(index), ScriptedModel(index))
            await trio.sleep(2)
        await trio.sleep(DEFAULT_REFRESH_GAP)
        assert len(sent()) == 2, f"lists sent after {settled[0]:.0f} s: {sent()}"
        assert sent()[1] - settled[0] == pytest.approx(DEFAULT_REFRESH_GAP, abs=0.5)
        await trio.sleep(DEFAULT_REFRESH_GAP)
        joined = trio.current_time()
        await group.add(make_card(9), ScriptedModel(9))
        await trio.sleep(1)
        assert len(sent()) == 3 and sent()[2] - joined < 1


async def test_the_greeter_example_remembers_a_visitor_across_a_restart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """examples/greeter.yaml through the engine, its store in the companion's SQLite file (as
    ``companion run`` opens it): the second run greets the same visitor as a regular. Real time:
    the store commits in a thread, which a fake clock would jump past."""
    timings = replace(TIMINGS, routine_quiet_start=0.5)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    loaded = load_card(EXAMPLES / "greeter.yaml")
    me = loaded.card.metadata
    visitor = make_card(1).card.metadata
    heard: list[str] = []
    for _run in range(2):
        hub = MemoryHub()
        node, guest = hub.endpoint(me.id), hub.endpoint(visitor.id)
        store = Store.in_directory(tmp_path / me.id)
        directory = {me.id: me}
        kv = KeyValueStore.open(store.path)
        engine = ConversationEngine(
            loaded, ScriptedModel(0), node, directory, store=store, timings=timings, kv=kv
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await trio.sleep(timings.routine_quiet_start + 0.5)
            directory[visitor.id] = visitor
            engine.directory_changed()
            with trio.fail_after(5):
                async for inbound in guest.receive_channel:
                    if isinstance(inbound.payload, Message) and inbound.payload.params.from_ == me.id:
                        heard.append(inbound.payload.params.message)
                        break
            nursery.cancel_scope.cancel()
        kv.close()
        store.close()
    assert heard == [f"Welcome, {visitor.name}!", f"Good to see you again, {visitor.name}."]


async def test_a_peers_tool_list_is_taken_only_from_itself_and_never_rolled_back() -> None:
    """Hostile announcements: forged (another peer signs it), malformed, a replayed older change."""
    me, peer = make_card(0).card.metadata, make_card(1).card.metadata
    hub = MemoryHub()
    engine = ConversationEngine(
        make_card(0), ScriptedModel(0), hub.endpoint(me.id), {me.id: me, peer.id: peer}
    )

    def tools(revision: int, ids: list[str], change: bool = True) -> Action:
        params: dict[str, Any] = {"revision": revision, "tools": [{"id": i} for i in ids]}
        if change:
            params["change"] = {"kind": "registered", "tool": ids[-1]}
        return Action.create(peer.id, TOOLS_ACTION, params)

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        feed = [
            (tools(3, ["speak", "wave"]), peer.id),
            (tools(9, ["steal"]), "companion_mallory"),  # signed by someone else
            (Action.create(peer.id, TOOLS_ACTION, {"revision": "x", "tools": 5}), peer.id),
            (Action.create(peer.id, TOOLS_ACTION, {"revision": 4, "tools": [{"id": ""}]}), peer.id),
            (tools(2, ["speak"]), peer.id),  # an older change, replayed
        ]
        for action_, sender in feed:
            await engine.handle(Inbound(ACTIONS, action_, sender))
        assert engine.peer_tools[peer.id] == {"revision": 3, "tools": ["speak", "wave"]}
        # After a restart the peer sends its whole list with a lower revision: taken.
        await engine.handle(Inbound(ACTIONS, tools(2, ["speak"], change=False), peer.id))
        assert engine.peer_tools[peer.id] == {"revision": 2, "tools": ["speak"]}
        nursery.cancel_scope.cancel()
