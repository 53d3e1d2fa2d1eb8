"""Whom a reply addresses, as models really fill it in: names instead of ids (``["juniper",
"Ostra"]``), nobody at all, or only ids nobody knows. Names map to ids, a ``to`` that names
nobody goes back to the model once as an error it can act on, then the reply goes to the
previous speaker and the people, never to nobody."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio
import trio.testing

from companion.actions.builtins import no_recipients, resolve_recipients
from companion.app.group import MemoryGroup
from companion.engine.driver import EngineEvent, EngineTimings
from companion.models.base import SpeakRequest, ToolCaller
from companion.models.scripted import ScriptedModel
from companion.protocol import Message
from support.engines import make_card

NAMES = {"companion_juniper": "Juniper", "companion_ostra": "Ostra", "companion_pim": "Pim"}


def test_names_and_ids_in_any_case_map_to_ids_and_the_speaker_is_left_out() -> None:
    ids, unknown = resolve_recipients(
        ["juniper", "OSTRA", "@Pim", "companion_juniper", "User_Mika", "companion_ghost", "nobody"],
        me="companion_pim",
        companions=NAMES,
        people=["user_mika"],
    )
    assert ids == ["companion_juniper", "companion_ostra", "user_mika"]
    assert unknown == ["companion_ghost", "nobody"]
    kept, _ = resolve_recipients(["someone"], me="x", companions={}, people=[], keep_unknown=True)
    assert kept == ["someone"]


def test_the_refusal_says_what_was_wrong_and_whom_to_address() -> None:
    text = no_recipients(["ghost"], ["ghost"], NAMES, ["user_mika"])
    assert "'ghost'" in text and "companion_ostra (Ostra)" in text and "user_mika" in text
    assert "empty" in no_recipients([], [], NAMES, [])


class Addresser(ScriptedModel):
    """Speaks with a scripted ``to`` per attempt (the last one repeats), recording every result."""

    def __init__(self, index: int, attempts: Sequence[list[str]]) -> None:
        super().__init__(index)
        self.attempts = list(attempts)
        self.results: list[dict[str, Any]] = []

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        for to in self.attempts:
            result = dict(await call_tool("speak", {"message": "Hello there.", "to": to, "emotion": "happy"}))
            self.results.append(result)
            if result["status"] == "ok":
                return


async def _one_reply(
    attempts: Sequence[list[str]],
) -> tuple[Message, Addresser, list[EngineEvent], list[str]]:
    events: list[EngineEvent] = []
    async with MemoryGroup(timings=EngineTimings.offline(), on_engine_event=events.append) as group:
        speaker = Addresser(0, attempts)
        await group.add(make_card(0, max_turns=None), speaker)
        await group.add(make_card(1, max_turns=None), ScriptedModel(1))
        ids = list(group.members)
        opening = await group.say("Just you, please.", to=[ids[0]])
        assert await group.wait_until(lambda t: t.reply_count >= 1, 60)
        reply = next(
            e for e in group.transcript.events if e.kind == "message" and e.in_reply_to == opening.params.id
        )
        message = Message.create(reply.speaker or "", list(reply.recipients), reply.text)
    return message, speaker, events, ids


async def test_names_from_the_model_become_ids(autojump_clock: trio.testing.MockClock) -> None:
    reply, model, _, ids = await _one_reply([["BEA", "user_demo"]])
    assert reply.params.to == [ids[1], "user_demo"] and model.results[0]["status"] == "ok"


async def test_an_empty_to_is_refused_once_then_goes_to_the_previous_speaker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply, model, events, _ = await _one_reply([[], []])
    first = model.results[0]
    assert first["status"] == "refused" and "names nobody" in first["message"]
    assert model.results[1]["status"] == "ok"
    assert reply.params.to == ["user_demo"]  # the previous speaker (and the people): never nobody
    assert [e.kind for e in events if e.kind.startswith("recipients_")] == [
        "recipients_refused",
        "recipients_fallback",
    ]


async def test_unknown_ids_only_are_refused_and_the_model_can_correct_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply, model, _, ids = await _one_reply([["companion_ghost"], ["aki", "Bea"]])
    assert [r["status"] for r in model.results] == ["refused", "ok"]
    assert "'companion_ghost'" in model.results[0]["message"]
    assert reply.params.to == [ids[1]]  # the speaker itself (Aki) is left out


async def test_the_sender_is_addressable_even_when_no_card_of_it_arrived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A peer claiming a companion id whose metadata never arrived (garbage, or an aikyo node
    still binding) asks a companion something: the reply goes to it, it is not refused."""
    async with MemoryGroup(timings=EngineTimings.offline()) as group:
        await group.add(make_card(0, max_turns=None), ScriptedModel(0))
        ids = list(group.members)
        group.user = "companion_stranger"
        opening = await group.say("are you there?", to=[ids[0]])
        assert await group.wait_until(lambda t: t.reply_count >= 1, 60)
        reply = next(
            e for e in group.transcript.events if e.kind == "message" and e.in_reply_to == opening.params.id
        )
        assert list(reply.recipients) == ["companion_stranger"]
