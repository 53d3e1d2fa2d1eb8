"""Building blocks of the conversation machine's tests: the companions A to E and a user, a
machine, and the messages, states arrays and decisions they exchange."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from companion.conversation.events import CompanionJoined, Decision, Effect
from companion.conversation.machine import Conversation
from companion.conversation.rules import (
    META_CLOSING,
    META_IN_REPLY_TO,
    META_TURN,
    StateDecision,
    finalize_states,
    plan_leaders,
    turn_tag,
)
from companion.conversation.state import ClosingSettings
from companion.protocol import ClosingStage, Message, State

A, B, C, D, E = (f"companion_{x}" for x in "abcde")
USER = "user_x"
T, R = 4.0, 12.0
"""A leader slot and a speaking slot."""


def machine(
    me: str | None,
    known: Sequence[str] = (A, B, C),
    *,
    present: Sequence[str] | None = None,
    max_turns: int | None = None,
) -> Conversation:
    m = Conversation(
        me, takeover_after=T, reply_timeout=R, settings=ClosingSettings(max_turns=max_turns), known=known
    )
    for cid in present if present is not None else known:
        m.receive(CompanionJoined(cid), 0.0)
    return m


def decisions(effects: Iterable[Effect], event: str | None = None) -> list[Decision]:
    return [e for e in effects if isinstance(e, Decision) and event in (None, e.event)]


def of(effects: Iterable[Effect], kind: type[Any]) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def message_led_by(
    leader: str, to: Sequence[str], *, sender: str = USER, text: str | None = None, **meta: Any
) -> Message:
    """A message (saying ``text``, else ``line <n>``) whose aikyo leader among ``to`` is
    ``leader`` (ids are tried in turn)."""
    for i in itertools.count():
        said = f"line {i}" if text is None else text
        message = Message.create(sender, list(to), said, metadata=meta or None, id=f"m-{leader}-{i}")
        if plan_leaders(message, to).leader == leader:
            return message
    raise AssertionError("unreachable")


def array(
    message: Message,
    speaker: str | None,
    *,
    closing: ClosingStage = "none",
    tagged: bool = True,
    addressed: Sequence[str] | None = None,
) -> list[State]:
    ids = list(addressed or [c for c in message.params.to if c.startswith("companion_")])
    chosen = [StateDecision(c, "speak" if c == speaker else "listen", 5, c == speaker) for c in ids]
    tag = turn_tag(message) if tagged else None
    return finalize_states(chosen, ids, floor=closing, tag=tag).states


def reply(sender: str, to: Sequence[str], answers: Message, turn: int = 1, closing: str = "none") -> Message:
    meta = {META_IN_REPLY_TO: answers.params.id, META_TURN: turn, META_CLOSING: closing}
    return Message.create(sender, list(to), f"{sender} says", metadata=meta)
