"""The offline model follows its card: the three cards in cards/ and cards a user writes, run as
the demo runs them (in-memory group, real engines, real action runtime, real CEL triggers)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from companion.actions import ActionRuntime
from companion.app.group import USER_ID, MemoryGroup
from companion.card.model import LoadedCard, load_card
from companion.conversation.rules import stamp_reply
from companion.engine.driver import EngineTimings
from companion.lines.farewell import takes_leave
from companion.models.base import ParamsRequest, SpeakRequest
from companion.models.persona import persona_of
from companion.models.scripted import ScriptedModel
from companion.protocol import ACTIONS, MESSAGES, Action, ClosingStage, Message
from companion.store.history import InMemoryHistory
from support.cards import write_card
from support.faults import reproducible
from support.recorders import Sink
from support.scripted import REPO, addresses_itself, converse, real_cards, real_ids, replies

OPENINGS = [
    "What's your favourite cake?",
    "Looks like rain tonight",
    "Hello everyone! What has been the best part of your day so far?",
    "I'm so sad today, I miss my dog.",
    "Goodbye everyone, I have to go now.",
    "I think the library was founded in 1861, wasn't it?",
    "Tell me about the lighthouse.",
    "Do you like rain?",
    "Oops, I got the recipe all wrong!",
    "Who are you all?",
    "I just finished my first marathon!",
    "Why do stars twinkle?",
    "ok",
    "What would you bake for a birthday?",
    "Haha, that's the funniest thing I've heard all week",
    "I'm scared of the dark.",
    "Thank you for the lovely evening.",
    "I used to sail with my grandfather when I was young.",
    "Which book should I read next?",
    "How are you all doing?",
]

WEATHER_CARD = """\
metadata:
  id: companion_wren
  name: Wren
  personality: Cheerful, chatty and a little nosy. Loves a good forecast.
  story: >-
    Wren ran the weather kiosk on the pier for twelve summers and still taps the barometer
    every morning.
  sample: "Morning! The glass is rising, so I say sunshine by noon."
role: You are the chatty one. Keep replies short.
actions:
  - speak
  - custom_action:wave
events:
  params:
    type: object
    properties:
      weather_mentioned:
        type: boolean
        description: True when the last message talks about the weather.
      asked_something:
        type: boolean
        description: True when the last message is a question.
      mood:
        type: string
        enum: [cheerful, gloomy, cross, calm]
        description: The mood of the last message.
      leaving:
        type: boolean
        description: True when someone said goodbye.
    required: [weather_mentioned, asked_something, mood, leaving]
  conditions:
    - expression: leaving
      execute:
        - tool: speak
          instruction: Say goodbye in one sentence.
    - expression: weather_mentioned
      execute:
        - tool: wave
          instruction: Wave three times at whoever mentioned the weather.
        - tool: speak
          instruction: Give your own forecast for tomorrow.
    - expression: asked_something
      execute:
        - tool: speak
          instruction: Answer the question from your own story.
    - expression: mood == "cross"
      execute:
        - tool: speak
          instruction: Calm them down kindly.
    - expression: "true"
      execute:
        - tool: speak
          instruction: Reply briefly.
"""


@pytest.fixture
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``PYTHONPATH=examples`` does for a user who follows docs/actions.md."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))


def _card(cid: str) -> LoadedCard:
    return next(c for c in real_cards() if c.card.metadata.id == cid)


async def _instructions(loaded: LoadedCard, text: str, history: list[Message] | None = None) -> list[str]:
    """What the engine does in a speaker's slot: fill_params, then the card's triggers."""
    message = Message.create(USER_ID, [loaded.card.metadata.id], text)
    request = ParamsRequest(
        loaded.card.metadata,
        loaded.card.role,
        loaded.card.events.params,
        message,
        [*(history or []), message],
    )
    values = await ScriptedModel(0).fill_params(request)
    return [i.instruction for i in loaded.triggers.evaluate(values)]


async def test_twenty_openings_give_at_least_eighteen_different_first_replies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cards = real_cards()
    firsts = []
    for opening in OPENINGS:
        events, _, _ = await converse(cards, opening, first_only=True)
        firsts.append(replies(events)[0].text)
    assert len(set(firsts)) >= 18, "\n".join(firsts)
    assert not any(f.startswith("Close, but it was 1851") for f in firsts)


GOODBYE = "Goodbye everyone, I have to go now."


@pytest.mark.parametrize(
    ("cid", "text", "met", "expected"),
    [
        ("companion_juniper", GOODBYE, False, "Sign off warmly"),
        ("companion_ostra", GOODBYE, True, "Close the conversation like shutting a rare book"),
        ("companion_pim", GOODBYE, False, "Say goodbye as if closing the bakery"),
        ("companion_juniper", "Good night, all. Talk soon!", False, "Sign off warmly"),
        (
            "companion_juniper",
            "What's your favourite constellation?",
            False,
            "Ask one sharp follow-up question",
        ),
        ("companion_juniper", "ok", False, "Offer a quiet new topic"),
        ("companion_juniper", "hmm, I guess.", False, "Offer a quiet new topic"),
        ("companion_juniper", "Looks like rain tonight.", False, "Reply briefly and calmly"),
        ("companion_pim", "What's your favourite cake?", False, "Share one baking tip"),
        ("companion_pim", "I always add too much sugar to my tea.", False, "Share one baking tip"),
        (
            "companion_pim",
            "Oops, I mixed up the salt and the sugar, I'm so confused!",
            False,
            "Apologise for the mix-up",
        ),
        ("companion_pim", "Looks like rain tonight.", False, "Reply with excitement"),
        ("companion_ostra", "Hello!", False, "Introduce yourself briefly"),
        (
            "companion_ostra",
            "I think the library was founded in 1861, wasn't it?",
            True,
            "Correct the doubtful claim",
        ),
        ("companion_ostra", "Looks like rain tonight.", True, "Reply with one surprising, accurate detail"),
        (
            "companion_ostra",
            "I'm so sad today, I miss my dog.",
            True,
            "Reply with one surprising, accurate detail",
        ),
    ],
)
async def test_params_fire_the_condition_the_message_calls_for_on_the_shipped_cards(
    cid: str, text: str, met: bool, expected: str
) -> None:
    loaded = _card(cid)
    history = [Message.create(cid, [USER_ID], "Good evening.")] if met else []
    speak = [i for i in await _instructions(loaded, text, history) if not i.startswith("Check who")]
    assert speak and speak[0].startswith(expected), speak


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Looks like rain tonight", "Give your own forecast"),
        ("Brr, it's freezing and the wind is howling.", "Give your own forecast"),
        ("See you tomorrow, take care!", "Say goodbye"),
        ("Where did you grow up?", "Answer the question"),
        ("How long have you worked on the pier", "Answer the question"),
        ("I'm furious, the bus left without me.", "Calm them down"),
        ("I painted the fence today.", "Reply briefly"),
    ],
)
async def test_params_fire_the_condition_the_message_calls_for_on_a_new_card(
    tmp_path: Path, examples_importable: None, text: str, expected: str
) -> None:
    loaded = load_card(write_card(tmp_path, "wren", WEATHER_CARD))
    speak = [i for i in await _instructions(loaded, text) if not i.startswith("Wave")]
    assert speak[0].startswith(expected), speak


async def test_a_card_whose_instruction_names_a_custom_action_sees_it_run(
    tmp_path: Path, examples_importable: None, autojump_clock: trio.testing.MockClock
) -> None:
    """The card lists the documented example action; the offline model calls it, through the
    engine's action runtime, before its reply, with the count the instruction gives."""
    wren = load_card(write_card(tmp_path, "wren", WEATHER_CARD))
    cards = [wren, _card("companion_juniper"), _card("companion_pim")]
    events, payloads, over = await converse(cards, "Wren, looks like rain tonight, doesn't it?")
    assert over
    waves = [
        (index, p.payload)
        for index, p in enumerate(payloads)
        if p.topic == ACTIONS and isinstance(p.payload, Action) and p.payload.params.name == "wave"
    ]
    assert waves, "the wave action never ran"
    assert all(a.params.from_ == "companion_wren" and a.params.params == {"times": 3} for _, a in waves)
    first_reply = next(
        index
        for index, p in enumerate(payloads)
        if p.topic == MESSAGES
        and isinstance(p.payload, Message)
        and p.payload.params.from_ == "companion_wren"
    )
    assert waves[0][0] < first_reply  # the action ran before the reply it belongs to
    assert [e.text for e in replies(events) if e.speaker == "companion_wren"]


@pytest.mark.parametrize("seed", range(10))
async def test_seeded_conversations_address_real_ids_never_themselves_and_end_with_a_goodbye(
    autojump_clock: trio.testing.MockClock, seed: int
) -> None:
    cards = real_cards()
    present = [c.card.metadata.id for c in cards]
    names = {c.card.metadata.id: c.card.metadata.name for c in cards}
    opening = OPENINGS[seed * 2 % len(OPENINGS)]
    events, _, over = await converse(cards, opening, seed=seed)
    assert over, [e.text for e in events]
    said = replies(events)
    # a person who says goodbye is answered with a winding-down line and a goodbye
    assert len(said) >= (2 if takes_leave(opening) else 4), [e.text for e in said]
    answered = [e.in_reply_to for e in said]
    assert len(answered) == len(set(answered))
    for reply in said:
        assert reply.speaker is not None and reply.speaker not in reply.recipients
        assert real_ids(reply.recipients, present), reply
        assert not addresses_itself(reply.text, names[reply.speaker]), reply.text
        assert '"' not in reply.text  # nothing quoted, whole phrases only
    assert said[-1].closing == "closing"  # a goodbye before terminal, whoever led the last turns


async def test_the_same_seed_gives_the_same_conversation(autojump_clock: trio.testing.MockClock) -> None:
    """With the engine's own randomness pinned (message ids pick leaders, trio shuffles tasks),
    the same seeds give the same conversation, line for line; other seeds another one."""
    cards = real_cards()
    runs: list[list[Any]] = []
    for seed in (4, 4, 5):
        with reproducible(0):
            events, _, over = await converse(cards, "Looks like rain tonight", seed=seed)
        assert over
        runs.append([(e.speaker, tuple(e.recipients), e.text) for e in replies(events)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize(
    "opening",
    # 60,000 letters: the largest opening the transport carries (64 KiB payloads)
    [
        "",
        "雨が降りそうですね。",
        "a" * 60_000,
        "🙂 " * 2_000,
    ],
)
async def test_odd_openings_still_reach_terminal(
    autojump_clock: trio.testing.MockClock, opening: str
) -> None:
    events, _, over = await converse(real_cards(), opening)
    assert over
    for reply in replies(events):
        reply.text.encode("utf-8")
        assert reply.text.strip()


@pytest.mark.parametrize("opening", ["\ud800", "Lone \udfff surrogate, then a question?"])
async def test_an_opening_that_is_not_text_is_refused_and_the_next_one_is_answered(
    autojump_clock: trio.testing.MockClock, opening: str
) -> None:
    """A lone surrogate is valid JSON but not text: the edge refuses it (``invalid_unicode``), so
    no companion ever sees it, and the next opening in the same group reaches terminal."""
    async with MemoryGroup(timings=EngineTimings.offline()) as group:
        for index, card in enumerate(real_cards()):
            await group.add(card, ScriptedModel(index))
        await group.say(opening)
        await trio.sleep(30)
        assert group.transcript.events == []
        await group.say("Is anyone there?")
        assert await group.wait_until(lambda t: t.over, 600)
        assert all(e.text.strip() for e in replies(group.transcript.events))


async def test_the_goodbye_comes_before_any_shipped_cards_turn_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Pim's card stops at 10 turns: when Pim leads that turn, the stage is terminal at once, so
    the offline model must have proposed closing early enough for the goodbye to come first.
    Which companion leads comes from message ids: pinned here, over several draws."""
    cards = real_cards()
    for draw in range(8):
        with reproducible(draw):
            events, _, over = await converse(cards, "What's your favourite cake?")
        said = replies(events)
        assert over and said[-1].closing == "closing", (draw, [(e.speaker, e.closing) for e in said])


_BLOCK = re.compile(r'```console\n\$ companion demo --in-memory --say "(.*?)"\n(.*?)```', re.S)
_HEAD = re.compile(r"^(\w+) → (.*?)  \[(\w+), turn (\d+)(?:, ([\w-]+))?\]$")


def _documented() -> list[tuple[str, list[tuple[str, list[str], str, int, ClosingStage, str]]]]:
    """The transcripts in docs/models.md: (opening, [(speaker, recipients, emotion, turn, stage,
    text)])."""
    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    section = text[text.index("## The offline model") :]
    out = []
    for opening, body in _BLOCK.findall(section):
        lines = body.splitlines()
        said = []
        for index, line in enumerate(lines):
            head = _HEAD.match(line)
            if head:
                name, to, emotion, turn, stage = head.groups()
                quoted = lines[index + 1].strip()
                assert quoted.startswith("“") and quoted.endswith("”"), quoted
                # the transcript's stage label, handed to the engine unchecked as before
                closing = cast(ClosingStage, stage or "none")
                said.append((name, to.split(", "), emotion, int(turn), closing, quoted[1:-1]))
        out.append((opening, said))
    return out


async def _say(
    loaded: LoadedCard, seed: int, messages: list[Message], recipients: list[str], stage: ClosingStage
) -> Any:
    """What ``loaded``'s model says (text, emotion) after ``messages``, asked as its engine asks:
    parameters, the card's triggers, its tools through a real action runtime."""
    me = loaded.card.metadata
    directory = {c.card.metadata.id: c.card.metadata for c in real_cards()}
    model = ScriptedModel(seed)
    message, history = messages[-1], messages[-20:]
    params = await model.fill_params(
        ParamsRequest(me, loaded.card.role, loaded.card.events.params, message, history)
    )
    runtime = ActionRuntime(metadata=me, publisher=Sink(), directory=directory, history=InMemoryHistory())
    for tool in loaded.tools.values():
        runtime.register(tool)
    spoken: list[tuple[str, str]] = []

    async def call_tool(tool_id: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        if tool_id == "speak":
            spoken.append((raw["message"], raw["emotion"]))
        return (await runtime.call(tool_id, raw)).for_model()

    request = SpeakRequest(
        me=me,
        role=loaded.card.role,
        message=message,
        history=history,
        instructions=loaded.triggers.evaluate(params),
        tools=runtime.tool_specs(),
        recipients=recipients,
        closing=stage,
        extra={"names": {cid: meta.name for cid, meta in directory.items()}, "params": params},
    )
    await model.speak(request, call_tool)
    return spoken


async def test_the_documented_transcripts_are_what_the_model_says() -> None:
    """Each reply in docs/models.md is replayed as its speaker's engine would ask for it (same
    seed, history, parameters, triggers, tools): the model must say it word for word."""
    cards = real_cards()
    by_name = {c.card.metadata.name: (index, c) for index, c in enumerate(cards)}
    ids = {name: c.card.metadata.id for name, (_, c) in by_name.items()} | {"User": USER_ID}
    documented = _documented()
    assert len(documented) == 3 and len({opening for opening, _ in documented}) == 3
    for opening, said in documented:
        messages = [Message.create(USER_ID, [c.card.metadata.id for c in cards], opening)]
        assert said and said[-1][4] == "closing"
        for name, to, emotion, turn, stage, text in said:
            index, loaded = by_name[name]
            recipients = [ids[n] for n in to]
            assert await _say(loaded, index, messages, recipients, stage) == [(text, emotion)], (
                opening,
                turn,
            )
            reply = Message.create(loaded.card.metadata.id, recipients, text, metadata={"emotion": emotion})
            messages.append(stamp_reply(reply, in_reply_to=messages[-1].params.id, turn=turn, closing=stage))


def _plain_words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.casefold()))


@pytest.mark.parametrize("opening", OPENINGS[:10])
async def test_the_card_says_who_a_companion_is_and_is_never_recited(
    autojump_clock: trio.testing.MockClock, opening: str
) -> None:
    """A card's personality and sample are who the companion is and how it sounds: no reply says
    one of their sentences, as written or turned into the first person ("I talk in sea and sky
    metaphors" was said)."""
    cards = real_cards()
    recited = {
        _plain_words(trait.text)
        for loaded in cards
        for trait in persona_of(loaded.card.metadata, loaded.card.role).traits
    }
    assert any("sea and sky metaphors" in t for t in recited)  # the check knows what it looks for
    events, _, over = await converse(cards, opening)
    assert over
    for reply in replies(events):
        said = _plain_words(reply.text)
        assert not [t for t in recited if t in said], reply.text
