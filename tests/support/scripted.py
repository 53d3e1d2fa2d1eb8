"""Pieces for the offline-model tests: a custom action that refuses, cards, a group runner and
checks on replies (their language, their repeats)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

import trio
import trio.testing
from pydantic import BaseModel, Field

from companion.actions import ActionContext, ActionRefused, action, knowledge
from companion.app.demo import default_cards
from companion.app.group import USER_ID, MemoryGroup
from companion.card.model import LoadedCard, load_card
from companion.conversation.transcript import TranscriptEvent
from companion.engine.driver import EngineTimings
from companion.memory import Inbound
from companion.models.scripted import ScriptedModel
from companion.protocol import Action

REPO = Path(__file__).resolve().parents[2]


class Bell(BaseModel):
    times: int = Field(1, ge=1, le=3, description="How many times to ring.")
    reason: str = Field(description="Why the bell is rung, in a few words.")


RUNG: list[Bell] = []


@action(id="ring_bell", description="Ring the shop bell for the people you talk to.", input=Bell, timeout=5)
def ring_bell(ctx: ActionContext[Bell]) -> Action:
    """Rings the bell, unless it is asked to ring for a goodbye (it is out of order for those)."""
    RUNG.append(ctx.input)
    if "bye" in ctx.input.reason.casefold():
        raise ActionRefused("the bell is out of order for goodbyes")
    return Action.create(
        ctx.companion_id, "ring_bell", {"times": ctx.input.times, "reason": ctx.input.reason}
    )


class Dice(BaseModel):
    count: int = Field(1, ge=1, le=10, description="How many dice to roll.")
    sides: int = Field(6, ge=2, le=100, description="How many sides each die has.")


class Rolled(BaseModel):
    rolls: list[int]
    total: int


ROLLED: list[tuple[Dice, Rolled]] = []


@knowledge(id="roll_dice", description="Roll dice and tell what they show.", input=Dice, output=Rolled)
def roll_dice(ctx: ActionContext[Dice]) -> Rolled:
    """Real dice: what they show is not the model's to know before it asks."""
    rolls = [random.randint(1, ctx.input.sides) for _ in range(ctx.input.count)]
    rolled = Rolled(rolls=rolls, total=sum(rolls))
    ROLLED.append((ctx.input, rolled))
    return rolled


DOT_CARD = """\
metadata:
  id: companion_dot
  name: Dot
  personality: Cheerful, quick and fond of games of chance.
  story: Dot runs the game table at the harbour inn and never loses count of a throw.
  sample: "Seven again! The dice like me tonight."
role: You roll dice when asked and say what they show.
actions: [speak]
knowledge: ["support.scripted:roll_dice"]
events:
  params:
    type: object
    properties:
      dice_requested:
        type: boolean
        description: True when the last message wants dice rolled.
    required: [dice_requested]
  conditions:
    - expression: dice_requested
      execute:
        - tool: roll_dice
          instruction: Roll the dice that were asked for.
        - tool: speak
          instruction: Say what the dice show.
    - expression: "true"
      execute:
        - tool: speak
          instruction: Reply briefly.
"""
"""A companion with a knowledge tool whose result must reach its words."""

SORA_CARD = """\
metadata:
  id: companion_sora
  name: ソラ
  personality: 穏やかで、好奇心いっぱい。
  story: >-
    ソラは港町の古い図書館で働いている。彼女は毎晩、屋上から星を眺める。
    彼女の口癖は「今日もいい星空だね。」だ。
  sample: こんばんは、ソラです。今夜は星がきれいだよ。
role: 短く、やさしく話してください。
actions: [speak]
events:
  params:
    type: object
    properties:
      wants_to_end:
        type: boolean
        description: True when the conversation has reached a natural end or someone said goodbye.
    required: [wants_to_end]
  conditions:
    - expression: wants_to_end
      execute:
        - tool: speak
          instruction: さようならを一言で。
    - expression: "true"
      execute:
        - tool: speak
          instruction: 話しかけられたことに短く答えてください。
"""
"""A card written in Japanese, telling its companion's story in the third person (彼女は...)."""


def real_cards() -> list[LoadedCard]:
    return [load_card(p) for p in default_cards(REPO / "cards")]


async def converse(
    cards: Sequence[LoadedCard],
    opening: str,
    *,
    seed: int = 0,
    max_replies: int = 30,
    timeout: float = 600,
    first_only: bool = False,
) -> tuple[list[TranscriptEvent], list[Inbound], bool]:
    """Run ``cards`` as an in-memory group (as ``companion demo --in-memory`` does) from
    ``opening``: the transcript, every payload a bystander saw, and whether it reached terminal."""
    payloads: list[Inbound] = []
    async with trio.open_nursery() as nursery, MemoryGroup(timings=EngineTimings.offline()) as group:
        spy = group.hub.endpoint("spy")

        async def watch() -> None:
            async for inbound in spy.receive_channel:
                payloads.append(inbound)

        nursery.start_soon(watch)
        for index, card in enumerate(cards):
            await group.add(card, ScriptedModel(seed + index))
        await group.say(opening)
        if first_only:
            await group.wait_until(lambda t: t.reply_count >= 1, timeout)
        else:
            await group.wait_until(lambda t: t.over or t.reply_count >= max_replies, timeout)
        over = group.transcript.over
        events = list(group.transcript.events)
        nursery.cancel_scope.cancel()
    return events, payloads, over


def replies(events: Sequence[TranscriptEvent]) -> list[TranscriptEvent]:
    return [e for e in events if e.kind == "message" and e.in_reply_to]


def addresses_itself(text: str, name: str) -> bool:
    """Whether ``text`` calls its own speaker by name ("Ostra, what do you think?"): any use of
    the name but "I'm Ostra" counts."""
    without_intro = re.sub(rf"\b(I'm|I am|私は)\s*{re.escape(name)}\b", "", text)
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", without_intro, re.I) is not None


def real_ids(recipients: Sequence[str], present: Sequence[str]) -> bool:
    return bool(recipients) and all(r in present or r == USER_ID for r in recipients)


def is_japanese(text: str, names: Sequence[str]) -> bool:
    """Japanese: kana in it, and no English words but names."""
    for name in names:
        text = text.replace(name, " ")
    return bool(KANA.search(text)) and not _LATIN_WORD.search(text)


def check_conversation(events: Sequence[TranscriptEvent], opening: str, names: Sequence[str]) -> None:
    """Every reply in the language of the message it answers, quotes whole, no third person, no
    greeting as a topic, and no phrase of a companion said twice."""
    said = replies(events)
    by_id = {e.message_id: e for e in events if e.kind == "message"}
    for reply in said:
        answered = by_id.get(reply.in_reply_to or "")
        if answered is None:
            continue
        check = is_japanese if is_japanese(answered.text, names) else is_english
        assert check(reply.text, names), (opening, answered.text, reply.text)
        assert reply.text.count("「") == reply.text.count("」"), reply.text
        assert "彼女" not in reply.text and "彼は" not in reply.text, reply.text
        greeting_as_topic = r"(こんにちは|こんばんは|おはよう|元気)(について|の話|かあ|のこと)"
        assert not re.search(greeting_as_topic, reply.text), reply.text
        assert not re.search(r"\b(of|with|about) (greetings|hello|hi|good evening)\b", reply.text, re.I)
    assert not repeats(said, names), (opening, repeats(said, names), [e.text for e in said])


KANA = re.compile(r"[\u3040-\u30ff]")


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")


_LATIN_WORD = re.compile(r"[A-Za-z]{3,}")


def is_english(text: str, names: Sequence[str]) -> bool:
    """English: Latin words, and no kana or kanji but in names."""
    for name in names:
        text = text.replace(name, " ")
    return bool(_LATIN_WORD.search(text)) and not _CJK.search(text)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？])\s*", text) if s.strip()]


def _plain(text: str, names: Sequence[str]) -> str:
    folded = text.casefold()
    for name in names:
        folded = folded.replace(name.casefold(), " x ")
    return " ".join(re.sub(r"[^\w]+", " ", folded).split())


def repeats(said: Sequence[TranscriptEvent], names: Sequence[str]) -> list[str]:
    """Phrases a companion said twice in one conversation: a sentence (names masked), a run of
    six words, or of fourteen kana and kanji."""
    found = []
    speakers = {e.speaker for e in said}
    for speaker in speakers:
        lines = [e.text for e in said if e.speaker == speaker]
        seen_sentences: set[str] = set()
        seen_runs: set[tuple[str, ...]] = set()
        for line in lines:
            here_sentences: set[str] = set()
            here_runs: set[tuple[str, ...]] = set()
            for sentence in _sentences(line):
                plain = _plain(sentence, names)
                long_enough = len(plain.split()) >= 3 if not _CJK.search(plain) else len(plain) >= 6
                if long_enough:
                    here_sentences.add(plain)
                words = plain.split()
                here_runs.update(tuple(words[i : i + 6]) for i in range(len(words) - 5))
                kana = "".join(_CJK.findall(plain))  # Japanese has no spaces: 14 characters
                here_runs.update((kana[i : i + 14],) for i in range(len(kana) - 13))
            found += [f"{speaker}: {s}" for s in here_sentences & seen_sentences]
            found += [f"{speaker}: {' '.join(r)}" for r in here_runs & seen_runs]
            seen_sentences |= here_sentences
            seen_runs |= here_runs
    return found
