"""A bystander's account of a conversation: who spoke, to whom, why they were chosen, and the closing stage.

:class:`Transcript` is fed every message and states array a bystander sees (the demo's bridge
node, the in-memory group's bystander endpoint) and explains each turn. It runs the companions'
own state machine (:class:`~companion.conversation.machine.Conversation`) as a bystander, so it follows
the thread and accepts arrays by the same rules. It also counts double speech (two replies to
one message), which must never happen. It also says what people would otherwise wait for in
silence: a speaker that has been preparing its reply for a while (``thinking``, from its
``companion.thinking`` signal: first after :data:`THINKING_SHOWN_AFTER` seconds, then every
:data:`THINKING_EVERY`) and a speaker that gave its turn up (``yield``, with the reason and its
words). Pure: the clock is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from companion.conversation.events import (
    Decision,
    Effect,
    MessageSeen,
    StatesSeen,
    ThinkingSeen,
    Tick,
    YieldSeen,
    present_diff,
    read_signal,
)
from companion.conversation.machine import Conversation
from companion.conversation.rules import TurnInfo
from companion.conversation.signals import MAX_NAME, THINKING_DEADLINE, one_line, thinking_text, yield_text
from companion.conversation.state import ClosingSettings
from companion.protocol import Action, ClosingStage, Message, Payload
from companion.timings import EngineTimings

__all__ = [
    "THINKING_EVERY",
    "THINKING_SHOWN_AFTER",
    "EventKind",
    "Transcript",
    "TranscriptEvent",
    "render_text",
]


EventKind = Literal["message", "decision", "thinking", "yield", "end"]

THINKING_SHOWN_AFTER: Final = 3.0
"""Seconds a speaker prepares its reply before the transcript says it is thinking (a quick
reply, as offline, needs no line)."""
THINKING_EVERY: Final = 10.0
"""Seconds between two lines about the same speaker still thinking."""
_MAX_THINKERS: Final = 32
_MAX_YIELDS: Final = 256


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    """One line of the transcript. ``speaker`` is the sender of a message, or the companion a
    decision chose (``None``: nobody)."""

    kind: EventKind
    speaker: str | None
    recipients: tuple[str, ...] = ()
    text: str = ""
    emotion: str | None = None
    why: str = ""
    closing: ClosingStage = "none"
    turn: int = 0
    message_id: str | None = None
    in_reply_to: str | None = None
    reason: str = ""
    """For ``decision``: the rule that decided; for ``yield``: why the speaker gave its turn up
    (model_error, timeout, crashed, no_reply); for ``end``: terminal, turn_cap, idle or timeout."""
    detail: str = ""
    """For ``yield``: the reason in the speaker's words (e.g. the model's error), bounded."""
    elapsed: int = 0
    """For ``thinking``: whole seconds the speaker has been preparing its reply."""

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.kind,
            "speaker": self.speaker,
            "recipients": list(self.recipients),
            "text": self.text,
            "emotion": self.emotion,
            "why": self.why,
            "closing": self.closing,
            "turn": self.turn,
            "message_id": self.message_id,
            "in_reply_to": self.in_reply_to,
            "reason": self.reason,
            "detail": self.detail,
            "elapsed": self.elapsed,
        }


class Transcript:
    """A bystander's account of a conversation, fed every message and states array.

    The companions' state machine in bystander mode decides what counts: the thread of the
    companions it is given (``active``), and for each message the first array from a leader
    whose slot is due (a late array of an earlier leader replaces it). Give ``publisher`` (the
    authenticated companion id, or any other name of the signer) and ``now`` to :meth:`feed`
    to apply every rule; without them an array counts as the leader's and every slot as due.
    ``max_turns``: the companions' turn limit, if the bystander should apply it too.
    """

    def __init__(self, *, timings: EngineTimings | None = None, max_turns: int | None = None) -> None:
        timings = timings or EngineTimings.offline()
        self.events: list[TranscriptEvent] = []
        self.replies: dict[str, list[str]] = defaultdict(list)
        self._machine = Conversation(
            None,
            takeover_after=timings.takeover_after,
            reply_timeout=timings.reply_timeout,
            settings=ClosingSettings(max_turns, repetition_threshold=math.inf),
        )
        self._decisions: dict[str, tuple[str | None, str, str]] = {}
        """message id -> (speaker, why, reason) of the array that counted."""
        self._thinking: OrderedDict[str, tuple[str, float, int]] = OrderedDict()
        """speaker -> (message id it prepares a reply to, since, thinking lines shown so far)."""
        self._yields: OrderedDict[tuple[str, str], None] = OrderedDict()
        """(speaker, message id) of the yields already shown (a signal may arrive twice)."""

    @property
    def double_speech(self) -> dict[str, list[str]]:
        """Messages that got more than one reply: message id -> the repliers, in order."""
        return {mid: senders for mid, senders in self.replies.items() if len(senders) > 1}

    @property
    def reply_count(self) -> int:
        return sum(len(s) for s in self.replies.values())

    @property
    def current(self) -> Message | None:
        """The message the conversation is at."""
        return self._machine.current

    @property
    def over(self) -> bool:
        """Whether the conversation reached ``terminal`` at the message it is at."""
        decision = self._decisions.get(self._machine.thread.current or "")
        return decision is not None and decision[2] == "terminal"

    def feed(
        self,
        payload: Payload,
        active: Iterable[str],
        *,
        publisher: str | None = None,
        now: float | None = None,
    ) -> list[TranscriptEvent]:
        """The transcript lines this payload adds (none for other payloads)."""
        machine, at = self._machine, math.inf if now is None else now
        for change in present_diff(machine.present, active):
            machine.receive(change, at)
        out: list[TranscriptEvent] = []
        if isinstance(payload, Message):
            fresh = not machine.thread.knows(payload.params.id)
            seen = MessageSeen(payload, publisher)
            effects = machine.receive(seen, at)
            if fresh and machine.thread.knows(payload.params.id):
                out.append(self._message(payload, seen.info, effects))
            out.extend(self._lines(effects))
        elif isinstance(payload, list):
            out = self._lines(machine.receive(StatesSeen(payload, publisher), at))
        elif isinstance(payload, Action) and (signal := read_signal(payload)) is not None:
            signal = _published_by(signal, publisher)
            out = self._lines(machine.receive(signal, at))
            out.extend(self._signal(signal, now))
        elif now is not None:
            out = self._lines(machine.receive(Tick(), at))
        self.events.extend(out)
        return out

    def deadline(self) -> float | None:
        """When time alone adds a line (feed :meth:`tick` then): an array held for its leader's
        slot counts, or a thinking speaker's next line is due."""
        times = [_next_shown(since, shown) for _, since, shown in self._thinking.values()]
        machine = self._machine.deadline()
        if machine is not None:
            times.append(machine)
        return min(times) if times else None

    def tick(self, now: float) -> list[TranscriptEvent]:
        """The lines time alone adds (an array that waited for its slot, a speaker still thinking)."""
        out = self._lines(self._machine.receive(Tick(), now))
        for speaker, (message_id, since, shown) in list(self._thinking.items()):
            if now - since >= THINKING_DEADLINE:  # its reply or yield got lost: stop saying it thinks
                del self._thinking[speaker]
                continue
            due = _next_shown(since, shown)
            if now < due:
                continue
            while _next_shown(since, shown) <= now:  # one line, however late the tick
                shown += 1
            self._thinking[speaker] = (message_id, since, shown)
            elapsed = int(_next_shown(since, shown - 1) - since)
            out.append(TranscriptEvent("thinking", speaker, in_reply_to=message_id, elapsed=elapsed))
        self.events.extend(out)
        return out

    def _signal(self, signal: YieldSeen | ThinkingSeen, now: float | None) -> list[TranscriptEvent]:
        """Follow who is thinking; the line for a yield that is a failure (once per turn)."""
        speaker = signal.companion
        if signal.publisher is not None and signal.publisher != speaker:
            return []  # one companion cannot speak for another
        if isinstance(signal, ThinkingSeen):
            if now is not None:
                self._thinking.pop(speaker, None)
                self._thinking[speaker] = (signal.in_reply_to, now, 0)
                while len(self._thinking) > _MAX_THINKERS:
                    self._thinking.popitem(last=False)
            return []
        current = self._thinking.get(speaker)
        if current is not None and current[0] == signal.in_reply_to:
            del self._thinking[speaker]
        key = (speaker, signal.in_reply_to)
        if signal.reason == "terminal" or key in self._yields:
            return []
        self._yields[key] = None
        while len(self._yields) > _MAX_YIELDS:
            self._yields.popitem(last=False)
        return [
            TranscriptEvent(
                "yield", speaker, in_reply_to=signal.in_reply_to, reason=signal.reason, detail=signal.detail
            )
        ]

    def _message(self, message: Message, info: TurnInfo, effects: list[Effect]) -> TranscriptEvent:
        params = message.params
        self._thinking.pop(params.from_, None)  # it replied
        why = "opened the conversation"
        if info.in_reply_to is not None:
            self.replies[info.in_reply_to].append(params.from_)
            decision = self._decisions.get(info.in_reply_to)
            if decision is None:
                why = "chosen by states this bystander did not see"
            elif decision[0] == params.from_:
                why = decision[1]
            elif decision[0] is not None and (decision[0], info.in_reply_to) in self._yields:
                why = f"next in the speaking order: {decision[0]} gave its turn up ({decision[1]})"
            else:
                why = f"spoke although the rule chose {decision[0]}: {decision[1]}"
        for effect in effects:
            if isinstance(effect, Decision) and effect.event == "message_stale":
                if effect.fields.get("placement") == "stale":
                    why += " (it crossed a newer message; the conversation follows that one)"
                else:
                    why += " (its reply overtook it)"
        emotion = (params.metadata or {}).get("emotion")
        return TranscriptEvent(
            "message",
            params.from_,
            tuple(params.to),
            params.message,
            emotion if isinstance(emotion, str) else None,
            why,
            info.closing,
            info.turn,
            params.id,
            info.in_reply_to,
        )

    def _lines(self, effects: list[Effect]) -> list[TranscriptEvent]:
        out: list[TranscriptEvent] = []
        unanswered = {  # turns closed because nobody could answer them (every slot passed)
            e.fields.get("message_id")
            for e in effects
            if isinstance(e, Decision)
            and e.event == "conversation_over"
            and e.fields.get("reason") == "unanswered"
        }
        for effect in effects:
            if not isinstance(effect, Decision) or effect.event != "speaker_chosen":
                continue
            f = effect.fields
            message_id, speaker, reason = f["message_id"], f["speaker"], f["reason"]
            self._decisions[message_id] = (speaker, f["why"], reason)
            out.append(
                TranscriptEvent(
                    "decision",
                    speaker,
                    why=f["why"],
                    closing=f["closing"],
                    turn=f["turn"],
                    message_id=message_id,
                    reason=reason,
                )
            )
            if reason == "terminal":
                ended, why = "terminal", f["why"]
                if message_id in unanswered:
                    ended = "unanswered"
                    why = _UNANSWERED_WHY
                end = TranscriptEvent("end", None, why=why, closing="terminal", turn=f["turn"], reason=ended)
                out.append(end)
        return out


_UNANSWERED_WHY = "nobody could answer the last message: every companion in its order failed or gave up"


def _published_by(signal: YieldSeen | ThinkingSeen, publisher: str | None) -> YieldSeen | ThinkingSeen:
    if isinstance(signal, YieldSeen):
        return YieldSeen(signal.in_reply_to, signal.companion, signal.reason, publisher, signal.detail)
    return ThinkingSeen(signal.in_reply_to, signal.companion, publisher)


def _next_shown(since: float, shown: int) -> float:
    """When the line number ``shown`` (from 0) about a speaker thinking since ``since`` is due."""
    return since + THINKING_SHOWN_AFTER + shown * THINKING_EVERY


def render_text(event: TranscriptEvent, names: Mapping[str, str]) -> str | None:
    """A readable line (or a few) for people; ``None`` for events not worth a line."""

    def name(cid: str | None) -> str:
        return "nobody" if cid is None else names.get(cid, cid)

    def named(text: str) -> str:
        for cid in sorted(names, key=len, reverse=True):
            text = text.replace(cid, names[cid])
        return text

    if event.kind == "message":
        to = ", ".join(name(r) for r in event.recipients) or "everyone"
        tags = [t for t in (event.emotion, f"turn {event.turn}" if event.in_reply_to else None) if t]
        if event.closing != "none":
            tags.append(event.closing)
        head = f"{name(event.speaker)} → {to}" + (f"  [{', '.join(tags)}]" if tags else "")
        return f"{head}\n    “{event.text}”\n    why: {named(event.why)}"
    if event.kind == "thinking":
        return f"    {thinking_text(one_line(name(event.speaker), MAX_NAME), event.elapsed)}"
    if event.kind == "yield":
        return (
            f"    {yield_text(one_line(name(event.speaker), MAX_NAME), event.reason, event.detail or None)}"
        )
    if event.kind == "decision":
        if event.speaker is None and event.reason != "terminal":
            return f"    (nobody speaks: {named(event.why)})"
        return None
    if event.reason == "terminal":
        return f"— the conversation closed (terminal) after {event.turn} replies"
    return f"— stopped ({event.reason}): {named(event.why)}"
