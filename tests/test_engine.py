"""The conversation engine over the in-memory transport: each turn-taking rule, deadlines, the
speaker path through the action runtime, model-call economy, closing, memory across restarts."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from companion.actions import ActionDef
from companion.app.group import MemoryGroup
from companion.conversation.rules import (
    META_CLOSING,
    META_IN_REPLY_TO,
    META_NEXT_SPEAKER,
    META_TURN,
    finalize_states,
    plan_leaders,
    turn_tag,
)
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES
from companion.conversation.state import ONE_MESSAGE
from companion.conversation.transcript import Transcript
from companion.conversation.turn import Phase
from companion.engine.driver import ConversationEngine, EngineEvent, EngineTimings
from companion.lines.farewell import takes_leave
from companion.memory import Inbound, MemoryHub
from companion.models.base import ModelError, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from companion.models.scripted import ScriptedModel
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Message,
    QueryResult,
    QueryResultBody,
    State,
)
from companion.store.sqlite import MemoryStore, Store
from support.engines import EchoSink, HookedModel, make_card, solo
from support.recorders import Recorder, Sink

TIMINGS = EngineTimings.offline()


class GroupRecorder(Recorder):
    """What a group's spy endpoint hears (``items``) and the engine events, with an event to
    wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[EngineEvent] = []

    def on_event(self, event: EngineEvent) -> None:
        self.events.append(event)
        self._poke()

    def kinds(self, kind: str, companion: str | None = None) -> list[EngineEvent]:
        return [e for e in self.events if e.kind == kind and companion in (None, e.companion)]

    def states_arrays(self) -> list[list[State]]:
        return [p.payload for p in self.items if p.topic == STATES and isinstance(p.payload, list)]

    def replies(self) -> list[Message]:
        return [
            p.payload
            for p in self.items
            if isinstance(p.payload, Message) and p.payload.params.from_.startswith("companion_")
        ]

    async def until(self, predicate: Callable[[], bool], timeout: float = 60) -> None:
        await super().until(predicate, timeout)


@asynccontextmanager
async def group_of(
    count: int,
    *,
    models: dict[int, Any] | None = None,
    timings: EngineTimings = TIMINGS,
    hub: MemoryHub | None = None,
    **card_options: Any,
) -> AsyncIterator[tuple[MemoryGroup, GroupRecorder]]:
    recorder = GroupRecorder()
    async with (
        trio.open_nursery() as nursery,
        MemoryGroup(timings=timings, hub=hub, on_engine_event=recorder.on_event) as group,
    ):
        spy = group.hub.endpoint("spy")

        async def watch() -> None:
            async for inbound in spy.receive_channel:
                await recorder.handle(inbound)
                recorder._poke()

        nursery.start_soon(watch)
        for index in range(count):
            model = (models or {}).get(index) or ScriptedModel(index)
            await group.add(make_card(index, **card_options), model)
        yield group, recorder
        nursery.cancel_scope.cancel()


def _ended(transcript: Transcript) -> bool:
    return transcript.over


async def test_one_leader_one_speaker_and_a_stamped_reply(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(3, max_turns=None) as (group, rec):
        opening = await group.say("Hello everyone, how are you?", metadata={"emotion": "happy"})
        await rec.until(lambda: len(rec.replies()) >= 1)
        plan = plan_leaders(opening, group.active)
        published = [e for e in rec.kinds("states_published") if e.fields["message_id"] == opening.params.id]
        assert [e.companion for e in published] == [plan.leader]
        assert [s.params.from_ for s in rec.states_arrays()[0]] == list(opening.params.to)
        verdicts = [e for e in rec.kinds("speaker_chosen") if e.fields["message_id"] == opening.params.id]
        chosen = {e.fields["speaker"] for e in verdicts}
        assert len(chosen) == 1 and len(verdicts) == 3  # every node, one verdict
        reply = rec.replies()[0]
        assert reply.params.from_ == chosen.pop()
        meta = reply.params.metadata or {}
        assert meta[META_IN_REPLY_TO] == opening.params.id and meta[META_TURN] == 1
        assert meta[META_CLOSING] == "none" and meta["emotion"] in ("happy", "sad", "angry", "neutral")
        others = [cid for cid in opening.params.to if cid != reply.params.from_]
        assert reply.params.to == ["user_demo", *others]
        why = verdicts[0].fields["why"]
        assert reply.params.from_ in why


@pytest.mark.parametrize("size", [3, 6, 12])
async def test_at_most_three_model_calls_per_turn(autojump_clock: trio.testing.MockClock, size: int) -> None:
    async with group_of(size, max_turns=6) as (group, _rec):
        await group.say("Hi all! What are you up to today?")
        assert await group.wait_until(_ended, 600)
        calls = group.calls_per_turn()
        replied = {e.in_reply_to for e in group.transcript.events if e.in_reply_to}
        assert len(replied) == 6
        assert all(calls[mid] == 3 for mid in replied)  # states, params, speech
        assert max(calls.values()) <= 3
        kinds: Counter[str] = sum((m.model.kinds for m in group.members.values()), start=Counter())
        assert kinds["decide_states"] == 6  # the terminal turn needs no model: the floor decides
        assert kinds["fill_params"] == kinds["speak"] == 6


async def test_a_card_whose_conditions_read_no_parameter_asks_no_parameters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    conditions = [("1 > 2", "Never chosen."), ("true", "Continue the conversation.")]
    async with group_of(3, max_turns=6, conditions=conditions) as (group, rec):
        await group.say("Hi all! What are you up to today?")
        assert await group.wait_until(_ended, 600)
        replied = {e.in_reply_to for e in group.transcript.events if e.in_reply_to}
        assert len(replied) == 6
        assert all(group.calls_per_turn()[mid] == 2 for mid in replied)  # states, speech
        kinds: Counter[str] = sum((m.model.kinds for m in group.members.values()), start=Counter())
        assert kinds["fill_params"] == 0 and kinds["speak"] == 6
        chosen = [e.fields["instructions"] for e in rec.events if e.kind == "instructions"]
        assert chosen == [[{"tool": "speak", "instruction": "Continue the conversation."}]] * 6
        said = [e for e in rec.events if e.kind == "params_not_asked"]
        assert sorted(e.companion for e in said) == sorted(group.members)  # once each, at start


async def test_a_card_whose_condition_reads_mood_still_asks_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    params = {"type": "object", "properties": {"mood": {"type": "string", "enum": ["calm", "curious"]}}}
    conditions = [('mood == "curious"', "Ask a question."), ("true", "Continue the conversation.")]
    async with group_of(2, max_turns=4, params=params, conditions=conditions) as (group, rec):
        await group.say("Hi all! What are you up to today?")
        assert await group.wait_until(_ended, 600)
        kinds: Counter[str] = sum((m.model.kinds for m in group.members.values()), start=Counter())
        assert kinds["speak"] >= 1 and kinds["fill_params"] == kinds["speak"]
        assert not [e for e in rec.events if e.kind == "params_not_asked"]


async def test_a_failing_model_gives_rule_based_states_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fail(_request: StatesRequest) -> None:
        raise ModelError("provider down")

    models = {i: HookedModel(ScriptedModel(i), on_states=fail) for i in range(3)}
    async with group_of(3, models=models) as (group, rec):
        start = trio.current_time()
        opening = await group.say("Hello?")
        await rec.until(lambda: len(rec.replies()) >= 1)
        assert trio.current_time() - start < TIMINGS.takeover_after
        published = [e for e in rec.kinds("states_published") if e.fields["message_id"] == opening.params.id]
        assert [e.fields["source"] for e in published] == ["fallback_model_error"]
        assert not rec.kinds("takeover")
        assert rec.kinds("states_model_failed")


async def test_a_slow_model_is_cut_off_before_the_next_slot(autojump_clock: trio.testing.MockClock) -> None:
    async def slow(_request: StatesRequest) -> None:
        await trio.sleep(TIMINGS.states_timeout * 5)

    models = {i: HookedModel(ScriptedModel(i), on_states=slow) for i in range(3)}
    async with group_of(3, models=models) as (group, rec):
        start = trio.current_time()
        opening = await group.say("Anyone there?")
        await rec.until(lambda: len(rec.replies()) >= 1)
        assert TIMINGS.states_timeout <= trio.current_time() - start < TIMINGS.takeover_after
        published = [e for e in rec.kinds("states_published") if e.fields["message_id"] == opening.params.id]
        assert [e.fields["source"] for e in published] == ["fallback_timeout"]
        assert not rec.kinds("takeover")


async def test_next_in_order_takes_over_from_a_crashed_leader(autojump_clock: trio.testing.MockClock) -> None:
    group_box: list[MemoryGroup] = []

    def crash_on_lead(index: int) -> Any:
        async def hook(request: StatesRequest) -> None:
            me = make_card(index).card.metadata.id
            group_box[0].kill(me, leave=False)  # crashed, and nobody has noticed yet
            await trio.sleep_forever()

        return hook

    models = {i: HookedModel(ScriptedModel(i), on_states=crash_on_lead(i)) for i in range(3)}
    opening_text = "Good morning, friends!"
    probe = Message.create("user_demo", [make_card(i).card.metadata.id for i in range(3)], opening_text)
    leader = plan_leaders(probe, probe.params.to).leader
    models = {i: m for i, m in models.items() if make_card(i).card.metadata.id == leader}
    async with group_of(3, models=models) as (group, rec):
        group_box.append(group)
        start = trio.current_time()
        message = Message.create("user_demo", probe.params.to, opening_text, id=probe.params.id)
        await group._user.publish(MESSAGES, message)
        await rec.until(lambda: len(rec.replies()) >= 1)
        takeovers = rec.kinds("takeover")
        plan = plan_leaders(message, probe.params.to)
        assert [e.companion for e in takeovers] == [plan.order[1]]
        assert trio.current_time() - start >= TIMINGS.takeover_after
        assert rec.replies()[0].params.from_ != leader
        opened = [e for e in rec.kinds("states_published") if e.fields["message_id"] == message.params.id]
        assert [(e.companion, e.fields["rank"]) for e in opened] == [(plan.order[1], 1)]


async def test_duplicate_and_competing_arrays_are_ignored(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(3, max_turns=None) as (group, rec):
        hub = group.hub
        doubling = [True]

        async def doubled(topic: str, receiver: str, data: bytes) -> list[bytes]:
            return [data, data] if topic == STATES and doubling[0] else [data]

        hub.fault = doubled
        opening = await group.say("Shall we play a game?")
        await rec.until(lambda: len(rec.replies()) >= 1)
        ignored = [e for e in rec.kinds("states_ignored") if e.fields["reason"] == "duplicate"]
        assert ignored  # (copies arriving after the reply are ignored as no longer current)
        verdicts = [e for e in rec.kinds("speaker_chosen") if e.fields["message_id"] == opening.params.id]
        assert sorted(e.companion for e in verdicts) == sorted(opening.params.to)
        doubling[0] = False
        # A different array for the same message, after the decision: ignored by everyone.
        rival = [State.create(cid, "speak", 10, True) for cid in opening.params.to]
        await group._user.publish(STATES, rival)
        await rec.until(lambda: any(p.topic == STATES and p.payload == rival for p in rec.items))
        await trio.testing.wait_all_tasks_blocked()
        assert not [e for e in rec.kinds("speaker_chosen") if e.fields["source"] == "user_demo"]
        answers = [
            r for r in rec.replies() if (r.params.metadata or {}).get(META_IN_REPLY_TO) == opening.params.id
        ]
        assert len(answers) == 1


async def test_a_late_array_never_answers_a_newer_message(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(3, max_turns=None) as (group, rec):
        await group.say("What is your favourite colour?")
        await rec.until(lambda: len(rec.replies()) >= 2)
        old_array = rec.states_arrays()[0]
        await trio.testing.wait_all_tasks_blocked()  # every node has moved on
        # The first turn's array arrives again (a late or replayed copy) after the conversation
        # moved on: no node may take it for the current message.
        chosen, ignored = len(rec.kinds("speaker_chosen")), len(rec.kinds("states_ignored"))
        await group._user.publish(STATES, old_array)
        await rec.until(
            lambda: any(p.payload == old_array and p.sender_peer == "user_demo" for p in rec.items)
        )
        await trio.testing.wait_all_tasks_blocked()
        assert len(rec.kinds("speaker_chosen")) == chosen
        replayed = rec.kinds("states_ignored")[ignored:]
        assert replayed
        assert {e.fields["reason"] for e in replayed} <= {"not for the current message", "no open turn"}


async def test_nomination_in_metadata_picks_the_next_speaker(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(4, max_turns=None) as (group, rec):
        for target in group.active:
            mark = len(rec.replies())
            opening = await group.say("Quick question for one of you.", metadata={META_NEXT_SPEAKER: target})

            def replied(opening: Message = opening) -> bool:
                return any(
                    (r.params.metadata or {}).get(META_IN_REPLY_TO) == opening.params.id
                    for r in rec.replies()
                )

            await rec.until(replied)
            reply = next(
                r
                for r in rec.replies()[mark:]
                if (r.params.metadata or {}).get(META_IN_REPLY_TO) == opening.params.id
            )
            assert reply.params.from_ == target
            assert any(
                e.fields.get("reason") == "selected" and e.fields.get("speaker") == target
                for e in rec.kinds("speaker_chosen")
            )


async def test_a_silent_speaker_is_skipped(autojump_clock: trio.testing.MockClock) -> None:
    group_box: list[MemoryGroup] = []
    silenced: list[str] = []

    def mute(index: int) -> Any:
        async def hook(request: SpeakRequest) -> None:
            if not silenced:
                silenced.append(request.me.id)
                group_box[0].kill(request.me.id, leave=False)
                await trio.sleep_forever()

        return hook

    models = {i: HookedModel(ScriptedModel(i), on_speak=mute(i)) for i in range(3)}
    async with group_of(3, models=models, max_turns=None) as (group, rec):
        group_box.append(group)
        start = trio.current_time()
        opening = await group.say("Tell us a story.")
        await rec.until(lambda: len(rec.replies()) >= 1)
        assert trio.current_time() - start >= TIMINGS.reply_timeout
        reply = rec.replies()[0]
        assert reply.params.from_ != silenced[0]
        assert (reply.params.metadata or {})[META_IN_REPLY_TO] == opening.params.id
        silent = rec.kinds("speaker_silent")
        assert silent and {e.fields["silent"] for e in silent} == {silenced[0]}
        assert {e.fields["speaker"] for e in silent} == {reply.params.from_}


class TwiceSpeaker:
    """A model that tries to publish two messages in one turn."""

    def __init__(self) -> None:
        self.inner = ScriptedModel(0)
        self.results: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return "twice"

    async def decide_states(self, request: StatesRequest) -> Any:
        return await self.inner.decide_states(request)

    async def fill_params(self, request: Any) -> dict[str, Any]:
        return await self.inner.fill_params(request)

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        for text in ("First thought.", "And a second one!"):
            result = await call_tool(
                "speak", {"message": text, "to": list(request.recipients), "emotion": "happy"}
            )
            self.results.append(dict(result))


async def test_one_message_per_turn_even_if_the_model_tries_two(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = TwiceSpeaker()
    async with group_of(1, models={0: model}, max_turns=None) as (group, rec):
        only = group.active[0]
        await group.say("Talk to me.", to=[only])
        await rec.until(lambda: len(model.results) == 2 and len(rec.replies()) >= 1)
        assert [r["status"] for r in model.results] == ["ok", "refused"]
        assert "one message per turn" in model.results[1]["message"]
        assert [r.params.message for r in rec.replies()] == ["First thought."]


class Announcer(TwiceSpeaker):
    """Says its lines through the card's own action ``announce``, whose line is ``text``."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        text = self.lines.pop(0)
        self.results.append(dict(await call_tool("announce", {"text": text, "to": list(request.recipients)})))


async def test_a_custom_speaking_action_is_checked_and_cleaned_as_speak_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its stage direction is not published, and its line said again is refused as a copy."""
    line = "(smiles) The harbour was full of little boats this morning."
    model = Announcer([line, line.removeprefix("(smiles) ")])
    announce = ("support.routines:announce",)
    async with group_of(1, models={0: model}, max_turns=None, actions=announce) as (group, rec):
        only = group.active[0]
        await group.say("What did you see?", to=[only])
        await rec.until(lambda: len(rec.replies()) == 1)
        assert rec.replies()[0].params.message == "The harbour was full of little boats this morning."
        await group.say("And then?", to=[only])
        await rec.until(lambda: len(model.results) == 2)
        assert [r["status"] for r in model.results] == ["ok", "refused"]
        assert "repeats what you already said" in model.results[1]["message"]
        assert len(rec.replies()) == 1


async def test_a_line_written_whole_is_said_as_a_voiced_one_would_be(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A line a model wrote whole is checked a sentence at a time, as a streamed one is before
    each sentence is voiced: a later sentence that says another's again ends it there, and a
    first sentence said before refuses it (SmolLM2-135M in the demo, ``speak``: Juniper said
    Pim's "But not chocolate, but chocolate and cheese." again; Pim opened three lines alike)."""
    copied = "But not chocolate, but chocolate and cheese."
    model = Announcer(
        [f"Oh, I love that. {copied}", "Oh, I love that. The boats came in early and the nets were full."]
    )
    announce = ("support.routines:announce",)
    async with group_of(1, models={0: model}, max_turns=None, actions=announce) as (group, rec):
        only = group.active[0]
        await group.say(copied, to=[only])
        await rec.until(lambda: len(rec.replies()) == 1)
        assert rec.replies()[0].params.message == "Oh, I love that."
        [cut] = rec.kinds("line_cut")
        assert cut.fields["said"] == "Oh, I love that." and cut.fields["verdict"] == "copy"
        await group.say("And then?", to=[only])
        await rec.until(lambda: len(model.results) == 2)
        assert [r["status"] for r in model.results] == ["ok", "refused"]
        assert "repeats what you already said" in model.results[1]["message"]
        assert len(rec.replies()) == 1


async def test_another_reply_withdraws_a_speech_in_progress(autojump_clock: trio.testing.MockClock) -> None:
    entered = trio.Event()

    async def stall(_request: SpeakRequest) -> None:
        entered.set()
        await trio.sleep_forever()

    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    engine, sink, events = solo(card, HookedModel(ScriptedModel(0), on_speak=stall))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        opening = Message.create("user_x", [me, "companion_other"], "Who goes first?")
        await engine.handle(Inbound(MESSAGES, opening, "peer"))
        await entered.wait()
        assert sink.topics() == [STATES, ACTIONS]  # the array, then "thinking"
        # Chatter and another conversation's messages do not withdraw the reply being prepared.
        for noise in (
            Message.create("user_stranger", [], "unaddressed chatter"),
            Message.create("companion_other", ["user_y"], "another conversation"),
            Message.create("user_y", ["companion_other"], "still another", metadata={META_IN_REPLY_TO: "x"}),
        ):
            await engine.handle(Inbound(MESSAGES, noise, "peer3"))
        await trio.testing.wait_all_tasks_blocked()
        assert not [e for e in events if e.kind == "speech_withdrawn"]
        rival = Message.create(
            "companion_other",
            ["user_x", me],
            "Me!",
            metadata={META_IN_REPLY_TO: opening.params.id, META_TURN: 1},
        )
        await engine.handle(Inbound(MESSAGES, rival, "peer2"))
        await trio.testing.wait_all_tasks_blocked()
        withdrawn = [e for e in events if e.kind == "speech_withdrawn"]
        assert [e.fields["reason"] for e in withdrawn] == ["another companion replied first"]
        assert MESSAGES not in sink.topics()  # nothing was said
        old_turn = next(e for e in events if e.kind == "speaker_chosen")
        assert old_turn.fields["message_id"] == opening.params.id
        assert engine.conversation.turn is not None and engine.conversation.turn.message_id == rival.params.id
        nursery.cancel_scope.cancel()


async def test_turn_limit_closes_gracefully_and_ends(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(3, max_turns=3) as (group, rec):
        await group.say("Let's chat for a bit.")
        assert await group.wait_until(_ended, 600)
        replies = rec.replies()
        stages = [(r.params.metadata or {})[META_CLOSING] for r in replies]
        assert stages == ["none", "pre-closing", "closing"]
        assert [(r.params.metadata or {})[META_TURN] for r in replies] == [1, 2, 3]
        # every companion sees the end, the last reply's speaker too (its own line opens no
        # turn there, so it once missed it); the bystander may read the last array before them
        await rec.until(lambda: len(rec.kinds("conversation_over")) >= 3, 60)
        over = rec.kinds("conversation_over")
        assert len(over) == 3 and {e.fields["turn"] for e in over} == {3}
        assert len({e.companion for e in over}) == 3
        finals = rec.kinds("states_published")[-1]
        assert (
            finals.fields["source"] == "closing_floor_terminal"
            and finals.fields["floor_reason"] == "continues"
        )
        await trio.sleep(TIMINGS.reply_timeout * 2)
        assert len(rec.replies()) == 3  # nothing after terminal


class Parrot(ScriptedModel):
    """Always says the same short line: repetition must close the conversation. (A longer line
    said again is refused as a copy, see ``companion.lines.check``; two words may come back.)"""

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        await call_tool(
            "speak", {"message": "Nice weather.", "to": list(request.recipients), "emotion": "neutral"}
        )

    async def decide_states(self, request: StatesRequest) -> Any:
        return [
            d.__class__(d.companion_id, "speak", d.importance, d.selected, "none")
            for d in await super().decide_states(request)
        ]


async def test_repetition_closes_a_looping_conversation(autojump_clock: trio.testing.MockClock) -> None:
    models = {i: Parrot(i) for i in range(3)}
    async with group_of(3, models=models, max_turns=None, threshold=0.6) as (group, rec):
        await group.say("The weather is nice.")
        assert await group.wait_until(_ended, 600)
        published = rec.kinds("states_published")
        reasons = [e.fields["floor_reason"] for e in published]
        first = reasons.index("repetition")
        assert reasons[first:] == ["repetition", "continues", "continues"]
        assert published[first].fields["repetition"] >= 0.6
        assert [e.fields["stage"] for e in published[first:]] == ["pre-closing", "closing", "terminal"]
        assert len(rec.replies()) == first + 2  # the repetitive replies, then two closing turns


async def test_a_companion_that_says_goodbye_closes_the_conversation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A model that wants to end at every turn (SmolLM2 does at random): in the first replies its
    card's goodbye is held back; from the reply on which a leader may begin closing it is said,
    and the conversation closes after it (a winding-down reply, a closing one), where it used to
    talk on until a turn limit (measured with SmolLM2: six more replies after "Good night, all!")."""
    wants_to_end = {"type": "object", "properties": {"wants_to_end": {"type": "boolean"}}}
    conditions = (("wants_to_end", "Say goodbye to everyone."), ("true", "Continue the conversation."))
    models = {
        i: HookedModel(
            ScriptedModel(i, min_replies=30, max_replies=30), params_override={"wants_to_end": True}
        )
        for i in range(3)
    }
    card: dict[str, Any] = {"max_turns": None, "params": wants_to_end, "conditions": conditions}
    async with group_of(3, models=models, **card) as (group, rec):
        await group.say("Hello everyone, what did you do today?")
        assert await group.wait_until(_ended, 600)
        chosen = rec.kinds("instructions")
        early = [e for e in chosen if e.fields["params"]["wants_to_end"] is False]
        assert len(early) == DEFAULT_MIN_REPLIES - 1
        assert all("true this early, and nobody took leave" in str(e.fields["param_changes"]) for e in early)
        replies = rec.replies()
        assert takes_leave(replies[DEFAULT_MIN_REPLIES - 1].params.message)
        assert not any(takes_leave(r.params.message) for r in replies[: DEFAULT_MIN_REPLIES - 1])
        reasons = [e.fields["floor_reason"] for e in rec.kinds("states_published")]
        first = reasons.index("farewell")
        assert reasons[first:] == ["farewell", "continues", "continues"]
        assert len(replies) == DEFAULT_MIN_REPLIES + 2  # the goodbye, then two closing turns


class EarlyLeaver(ScriptedModel):
    """The group's first line is a goodbye, whatever it was told (a small model writes one at
    random); the rest are the scripted model's."""

    def __init__(self, seed: int, said: list[bool]) -> None:
        super().__init__(seed, min_replies=30, max_replies=30)
        self.said = said

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        if self.said:
            return await super().speak(request, call_tool)
        self.said.append(True)
        line = {"message": "Good night, all!", "to": list(request.recipients), "emotion": "neutral"}
        await call_tool("speak", line)


async def test_a_companions_early_goodbye_is_not_taken_up(autojump_clock: trio.testing.MockClock) -> None:
    """A goodbye a companion's model wrote in the first replies closes nothing (the floor waits
    for ``min_replies``), so the companion answering it does not take it up either: its ending
    parameter is held as on any early reply, where a person's goodbye would let it through."""
    wants_to_end = {"type": "object", "properties": {"wants_to_end": {"type": "boolean"}}}
    conditions = (("wants_to_end", "Say goodbye to everyone."), ("true", "Continue the conversation."))
    ending = {"wants_to_end": True}
    said: list[bool] = []
    models = {i: HookedModel(EarlyLeaver(i, said), params_override=ending) for i in range(2)}
    card: dict[str, Any] = {"max_turns": 6, "params": wants_to_end, "conditions": conditions}
    async with group_of(2, models=models, **card) as (group, rec):
        await group.say("Hello you two, what did you do today?")
        await rec.until(lambda: len(rec.replies()) >= 2)
        first = rec.replies()[0]
        assert takes_leave(first.params.message)
        [answer] = [e for e in rec.kinds("instructions") if e.fields["message_id"] == first.params.id]
        assert answer.fields["params"]["wants_to_end"] is False
        assert "true this early, and nobody took leave" in str(answer.fields["param_changes"])


async def test_companions_not_addressed_stay_out(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(3, max_turns=None) as (group, rec):
        pair = group.active[:2]
        opening = await group.say("Just you two.", to=pair)
        await rec.until(lambda: len(rec.replies()) >= 1)
        outsider = group.active[2]
        assert [e.fields["message_id"] for e in rec.kinds("leader_chosen", outsider)] != [opening.params.id]
        assert all(e.fields["message_id"] != opening.params.id for e in rec.kinds("leader_chosen", outsider))
        assert rec.replies()[0].params.from_ in pair


async def test_params_that_break_the_schema_are_reported_not_fatal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    models = {0: HookedModel(ScriptedModel(0), params_override={"already_replied": "yes", "energy": 99})}
    async with group_of(1, models=models, max_turns=None) as (group, rec):
        await group.say("Hello", to=group.active)
        await rec.until(lambda: len(rec.replies()) >= 1)
        issues = rec.kinds("instructions")[0].fields["param_issues"]
        assert any("already_replied" in i for i in issues) and not any("energy" in i for i in issues)
        # a number beyond the card's bounds is clamped before CEL reads it, and the change logged
        changes = rec.kinds("instructions")[0].fields["param_changes"]
        assert any("energy: 99 clamped to" in c for c in changes), changes
        assert rec.kinds("instructions")[0].fields["instructions"]  # "true" still matched


async def test_replies_from_unstamped_peers_advance_the_count(autojump_clock: trio.testing.MockClock) -> None:
    """An aikyo node's reply carries no turn metadata; the count and the closing go on anyway."""
    async with group_of(2, max_turns=2) as (group, rec):
        a, b = group.active
        js = group.hub.endpoint("aikyo-node")
        first = Message.create("companion_js", [a, b], "A plain aikyo line.")
        await js.publish(MESSAGES, first)
        assert await group.wait_until(_ended, 600)
        second = Message.create("companion_js", [a, b], "Another plain aikyo line.")
        await js.publish(MESSAGES, second)
        await rec.until(
            lambda: any(e.fields["message_id"] == second.params.id for e in rec.kinds("speaker_chosen"))
        )
        turns = {e.fields["message_id"]: e.fields["turn"] for e in rec.kinds("leader_chosen")}
        assert turns[first.params.id] == 1 and turns[second.params.id] == 3
        verdict = next(e for e in rec.kinds("speaker_chosen") if e.fields["message_id"] == second.params.id)
        assert verdict.fields["reason"] == "terminal"
        assert len(rec.replies()) == 1 + 2  # the aikyo lines and one reply (the closing turn)


async def test_a_reply_that_crossed_a_newer_message_is_stale(autojump_clock: trio.testing.MockClock) -> None:
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    events: list[EngineEvent] = []

    engine = ConversationEngine(
        card, ScriptedModel(0), Sink(), {me: card.card.metadata}, timings=TIMINGS, observer=events.append
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        older = Message.create("companion_x", [me, "companion_y"], "First.")
        newer = Message.create("user_z", [me, "companion_x", "companion_y"], "Wait, everyone!")
        crossing = Message.create(
            "companion_y",
            [me, "companion_x"],
            "About the first...",
            metadata={META_IN_REPLY_TO: older.params.id, META_TURN: 1},
        )
        for message in (older, newer, crossing):
            await engine.handle(Inbound(MESSAGES, message, "p"))
        stale = [e for e in events if e.kind == "message_stale"]
        assert [e.fields["message_id"] for e in stale] == [crossing.params.id]
        assert engine.conversation.turn is not None and engine.conversation.turn.message_id == newer.params.id
        assert [m.params.id for m in engine.store.recent(3)][-1] == crossing.params.id
        nursery.cancel_scope.cancel()


async def test_query_results_reach_the_action_runtime(autojump_clock: trio.testing.MockClock) -> None:
    async with group_of(1, actions=("speak_with_voice",), max_turns=None) as (group, rec):
        await group.say("Say it out loud.", to=group.active)
        await rec.until(lambda: any(p.topic == QUERIES for p in rec.items))
        query = next(p.payload for p in rec.items if p.topic == QUERIES)
        answer = QueryResult(id=query.id, result=QueryResultBody(success=True, body={}))  # type: ignore[union-attr]
        await group._user.publish(QUERIES, answer)
        await rec.until(lambda: len(rec.replies()) >= 1)
        member = next(iter(group.members.values()))
        assert isinstance(member.engine.runtime.tools["speak_with_voice"], ActionDef)


async def test_a_restarted_node_remembers_and_does_not_reply_twice(
    tmp_path: Path, disk_clock: trio.testing.MockClock
) -> None:
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    opening = Message.create("user_x", [me], "Remember me?")
    sent: list[tuple[str, Any]] = []

    async def run_once(replies: int) -> tuple[list[EngineEvent], ConversationEngine]:
        with Store.in_directory(tmp_path) as store:
            engine, sink, events = solo(card, ScriptedModel(0), store=store)
            sink.sent = sent  # one record across both runs
            async with trio.open_nursery() as nursery:
                await nursery.start(engine.run)
                await engine.handle(Inbound(MESSAGES, opening, "peer"))
                await sink.until_sent(MESSAGES, replies)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            assert store.recent(10)[0].params.id == opening.params.id
        return events, engine

    def replies() -> list[Message]:
        return [envelope for topic, envelope in sent if topic == MESSAGES]

    first, _ = await run_once(1)
    assert len(replies()) == 1
    second, restarted = await run_once(1)  # the opening is replayed by gossip after the restart
    assert len(replies()) == 1
    assert [e.kind for e in second] == ["message_duplicate"]
    memory = restarted.conversation.memory()  # read back from the store at start-up
    assert memory["turn"] == 1 and memory["message_id"] == replies()[0].params.id
    assert memory["voices"]["user_x"] == {"said": "Remember me?", "turn": 0}
    assert memory["voices"][me]["turn"] == 1
    with Store.in_directory(tmp_path) as store:
        assert store.replied(opening.params.id) and store.known_companions() == [me]
        assert len(store) == 2  # the opening and the reply, each once
        reply = store.recent(1)[0]
        assert (reply.params.metadata or {})[META_IN_REPLY_TO] == opening.params.id  # the stamped copy
    assert any(e.kind == "replied" for e in first)


async def test_handle_needs_a_running_engine() -> None:
    card = make_card(0)
    me = card.card.metadata.id

    engine = ConversationEngine(card, ScriptedModel(0), Sink(), {me: card.card.metadata})
    with pytest.raises(RuntimeError, match="not running"):
        await engine.handle(Inbound(MESSAGES, Message.create("user", [me], "hi"), "p"))


def test_timings_keep_the_safety_orderings() -> None:
    with pytest.raises(ValueError, match="takeover_after"):
        EngineTimings(states_timeout=5, takeover_after=5)
    with pytest.raises(ValueError, match="takeover_after"):
        EngineTimings(states_timeout=20, publish_timeout=10, takeover_after=30)
    with pytest.raises(ValueError, match="reply_timeout"):
        EngineTimings(speak_timeout=10, reply_timeout=10)
    with pytest.raises(ValueError, match="reply_timeout"):
        EngineTimings(speak_timeout=10, reply_timeout=12, pace=3)
    with pytest.raises(ValueError, match="positive"):
        EngineTimings(publish_timeout=0)
    assert EngineTimings.offline(pace=1.0).reply_timeout > EngineTimings.offline().speak_timeout + 1.0


async def test_a_late_array_from_an_earlier_leader_wins(autojump_clock: trio.testing.MockClock) -> None:
    """A takeover's array was accepted; then the first leader's array arrives (it was only late):
    the node switches to it, and speaks if that array gives it the turn."""
    cards = [make_card(i, max_turns=None) for i in range(3)]
    ids = [c.card.metadata.id for c in cards]
    opening = Message.create("user_x", ids, "Who is first?")
    plan = plan_leaders(opening, ids)
    leader, second, me = plan.order
    card = next(c for c in cards if c.card.metadata.id == me)
    sink = Sink()
    events: list[EngineEvent] = []
    engine = ConversationEngine(
        card,
        ScriptedModel(0),
        sink,
        {c.card.metadata.id: c.card.metadata for c in cards},
        timings=TIMINGS,
        observer=events.append,
    )

    def array(speaker: str) -> list[State]:
        decisions = [StateDecision(cid, "speak" if cid == speaker else "listen", 5, False) for cid in ids]
        return finalize_states(decisions, ids, floor="none", tag=turn_tag(opening)).states

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await engine.handle(Inbound(MESSAGES, opening, "user_x"))
        await trio.sleep(TIMINGS.takeover_after)  # the second's slot: the leader stayed silent
        await engine.handle(Inbound(STATES, array(second), second))  # the takeover's array
        await engine.handle(Inbound(STATES, array(leader), "peer-unknown"))  # no candidate: ignored
        await engine.handle(Inbound(STATES, array(me), leader))  # the leader's, late
        await engine.handle(Inbound(STATES, array(second), second))
        await trio.testing.wait_all_tasks_blocked()
        chosen = [e.fields["speaker"] for e in events if e.kind == "speaker_chosen"]
        assert chosen == [second, me]
        switched = [e for e in events if e.kind == "states_switched"]
        assert [(e.fields["rank"], e.fields["replaced_rank"]) for e in switched] == [(0, 1)]
        reasons = [e.fields["reason"] for e in events if e.kind == "states_ignored"]
        assert reasons == ["not_a_leader", "an array from an earlier or equal leader came first"]
        replies = [m for t, m in sink.sent if t == MESSAGES]
        assert len(replies) == 1 and (replies[0].params.metadata or {})[META_IN_REPLY_TO] == opening.params.id
        nursery.cancel_scope.cancel()


async def test_a_failed_parameter_call_still_lets_the_speaker_speak(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fail(_request: Any) -> None:
        raise ModelError("params unavailable")

    models = {0: HookedModel(ScriptedModel(0), on_params=fail)}
    async with group_of(1, models=models, max_turns=None) as (group, rec):
        await group.say("Hello", to=group.active)
        await rec.until(lambda: len(rec.replies()) >= 1)
        failed = rec.kinds("params_failed")
        assert len(failed) == 1 and "params unavailable" in failed[0].fields["error"]
        assert rec.kinds("instructions")[0].fields["params"] == {}


async def test_the_speaker_sees_the_working_memory(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[SpeakRequest] = []

    async def capture(request: SpeakRequest) -> None:
        seen.append(request)

    models = {0: HookedModel(ScriptedModel(0), on_speak=capture)}
    async with group_of(1, models=models, max_turns=None) as (group, rec):
        await group.say("Please remember the blue kite.", to=group.active)
        await rec.until(lambda: len(seen) == 1)
        memory = seen[0].extra["memory"]["conversation"]
        assert memory["voices"]["user_demo"]["said"] == "Please remember the blue kite."
        assert seen[0].extra["names"] == {
            group.active[0]: group.members[group.active[0]].loaded.card.metadata.name
        }


async def test_a_speaker_that_hangs_gives_up_before_its_slot_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hung: list[str] = []

    async def hang_once(request: SpeakRequest) -> None:
        if not hung:
            hung.append(request.me.id)
            await trio.sleep_forever()

    models = {i: HookedModel(ScriptedModel(i), on_speak=hang_once) for i in range(3)}
    async with group_of(3, models=models, max_turns=None) as (group, rec):
        start = trio.current_time()
        await group.say("Anyone?")
        await rec.until(lambda: len(rec.kinds("speaker_failed")) == 1)
        timed_out = rec.kinds("speaker_failed")[0]
        assert timed_out.companion == hung[0] and timed_out.fields["reason"] == "timeout"
        assert trio.current_time() - start == pytest.approx(TIMINGS.speak_timeout)
        await rec.until(lambda: len(rec.replies()) >= 1)
        assert rec.replies()[0].params.from_ != hung[0]
        # it gave its slot up at once: the next speaker did not wait for the reply deadline
        assert trio.current_time() - start < TIMINGS.speak_timeout + 2.0 < TIMINGS.reply_timeout
        yielded = {e.companion for e in rec.kinds("speaker_yielded")}
        assert yielded == set(group.active) - {hung[0]}  # every other node moved on


async def test_a_states_publish_that_hangs_is_abandoned_and_taken_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    card_ids = [make_card(i).card.metadata.id for i in range(3)]
    probe = Message.create("user_demo", card_ids, "Hello?", id="fixed-opening")
    leader = plan_leaders(probe, card_ids).leader
    stuck = trio.Event()
    async with group_of(3, max_turns=None) as (group, rec):
        member = group.members[leader or ""]

        async def never(topic: str, envelope: Any) -> None:
            if topic == STATES:
                stuck.set()
                await trio.sleep_forever()

        member.engine._publishes.publisher = HungPublisher(never)
        await group._user.publish(MESSAGES, probe)
        await rec.until(lambda: len(rec.replies()) >= 1)
        failed = rec.kinds("states_publish_failed", leader)
        assert stuck.is_set() and len(failed) == 1 and "TooSlowError" in failed[0].fields["error"]
        assert [e.companion for e in rec.kinds("takeover")] == [plan_leaders(probe, card_ids).order[1]]


class HungPublisher:
    def __init__(self, publish: Any) -> None:
        self.publish = publish


async def test_pace_delays_the_reply(autojump_clock: trio.testing.MockClock) -> None:
    paced = EngineTimings.offline(pace=3.0)
    async with group_of(2, timings=paced, max_turns=None) as (group, rec):
        start = trio.current_time()
        await group.say("Take your time.")
        await rec.until(lambda: len(rec.replies()) >= 1)
        assert trio.current_time() - start == pytest.approx(3.0)


class FlakyStore(MemoryStore):
    """A store whose writes fail while ``failing`` is set (a full disk, a locked file)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    def record(self, message: Message) -> bool:
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        return super().record(message)


async def test_a_failing_store_write_leaves_the_conversation_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    store = FlakyStore()
    engine, sink, events = solo(card, ScriptedModel(0), store=store)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        first = Message.create("user_x", [me], "Are you there?")
        store.failing = True
        for message in (first, Message.create("user_x", [me], "Hello?")):
            await engine.handle(Inbound(MESSAGES, message, "peer"))
        await trio.testing.wait_all_tasks_blocked()
        assert [e.kind for e in events] == ["store_failed"]  # once, however many writes fail
        assert engine.conversation.thread.current is None and engine.conversation.turn is None
        assert sink.sent == []
        store.failing = False
        await engine.handle(Inbound(MESSAGES, first, "peer"))  # gossip delivers it again
        await trio.testing.wait_all_tasks_blocked()
        assert "store_recovered" in [e.kind for e in events]
        assert len(sink.on(MESSAGES)) == 1  # the next message works: one reply
        nursery.cancel_scope.cancel()


async def test_odd_strings_never_poison_the_engine_or_its_store(
    tmp_path: Path, disk_clock: trio.testing.MockClock
) -> None:
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    odd = "\ud800"
    with Store.in_directory(tmp_path) as store:
        engine, sink, _ = solo(card, ScriptedModel(0), store=store)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            for message in (
                Message.create(f"user_{odd}", [me, f"companion_{odd}"], f"text {odd}", id=f"id-{odd}"),
                Message.create(
                    f"companion_{odd}", [me], odd, id=odd, metadata={META_IN_REPLY_TO: f"id-{odd}"}
                ),
            ):
                await engine.handle(Inbound(MESSAGES, message, f"peer-{odd}"))
                await trio.testing.wait_all_tasks_blocked()
            await engine.handle(Inbound(STATES, [State.create(f"companion_{odd}", "speak", 9, True)], odd))
            answered = len(sink.on(MESSAGES))
            normal = Message.create("user_x", [me], "And now a normal line.")
            await engine.handle(Inbound(MESSAGES, normal, "peer"))
            replies = (await sink.until_sent(MESSAGES, answered + 1))[answered:]
            await trio.testing.wait_all_tasks_blocked()
            assert (
                len(replies) == 1 and (replies[0].params.metadata or {})[META_IN_REPLY_TO] == normal.params.id
            )
            nursery.cancel_scope.cancel()


async def test_an_event_that_arises_while_effects_run_waits_its_turn(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping, a lead that falls due gets rule-based states at once: the driver feeds them to
    the machine only once the effects of the message are all carried out, never from inside."""
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    engine, _sink, events = solo(card, ScriptedModel(0))
    receive, do = engine.conversation.receive, engine._do
    carrying_out, reentered = [False], [False]

    def counted(event: Any, now: float) -> Any:
        reentered[0] |= carrying_out[0]
        return receive(event, now)

    def doing(effect: Any) -> None:
        carrying_out[0] = True
        try:
            do(effect)
        finally:
            carrying_out[0] = False

    monkeypatch.setattr(engine, "_do", doing)
    monkeypatch.setattr(engine.conversation, "receive", counted)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await engine.stop(0)
        await engine.handle(Inbound(MESSAGES, Message.create("user_x", [me], "Still there?"), "peer"))
        published = [e for e in events if e.kind == "states_published"]
        assert [e.fields["source"] for e in published] == ["fallback_stopping"]
        assert not reentered[0]
        nursery.cancel_scope.cancel()


class PhaseWatchingSink(EchoSink):
    """Notes, as the companion's reply is handed to the network, what its machine says of the
    message the reply answers: the turn's phase, whether it counts as answered, and what a second
    message would hear."""

    def __init__(self, me: str) -> None:
        super().__init__(me)
        self.seen_when_sent: list[tuple[Phase | None, bool, str]] = []

    async def publish(self, topic: str, envelope: Any) -> None:
        if topic == MESSAGES and envelope.params.from_ == self.me:
            conversation = self.engine.conversation
            answered = (envelope.params.metadata or {}).get(META_IN_REPLY_TO, "")
            phase = None if conversation.turn is None else conversation.turn.phase
            again = conversation.outgoing(Message.create(self.me, ["user_x"], "And one more thing."))
            self.seen_when_sent.append((phase, conversation.replied(answered), str(again)))
        await super().publish(topic, envelope)


async def test_the_machine_knows_the_reply_is_out_before_the_network_has_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The driver feeds ``ReplyPublished`` before the publish (from the outgoing hook): while the
    reply is on its way out, no late array, slot end or thinking signal may withdraw its speech
    or open a second one (``test_replied_before_the_reply_leaves_so_nothing_can_start_a_second_one``
    shows what would)."""
    card = make_card(0, max_turns=None)
    me = card.card.metadata.id
    sink = PhaseWatchingSink(me)
    engine, _sink, _events = solo(card, ScriptedModel(0), sink=sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await engine.handle(Inbound(MESSAGES, Message.create("user_x", [me], "Are you there?"), "peer"))
        await sink.until_sent(MESSAGES, 1)  # the reply
        nursery.cancel_scope.cancel()
    assert sink.seen_when_sent == [(Phase.REPLIED, True, ONE_MESSAGE)]


async def test_run_reports_started_and_once_ended_records_and_says_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    card = make_card(0)
    me = card.card.metadata.id
    engine, sink, _events = solo(card, ScriptedModel(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)  # returns once handle may be called
        await engine.handle(Inbound(MESSAGES, Message.create("user_x", ["nobody"], "hi"), "peer"))
        nursery.cancel_scope.cancel()
    late = Message.create("user_x", [me], "Anyone?")
    await engine.handle(Inbound(MESSAGES, late, "peer"))  # the node stops after its engine
    assert engine.store.recent(1) == [late] and sink.topics() == []
