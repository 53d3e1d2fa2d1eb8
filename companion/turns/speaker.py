"""The speaker: who answers a message, and who stands in, slot by slot, when they stay silent.

Every node applies aikyo's rule to the one array it accepted (:func:`decide_next_speaker`): the
``selected`` states first, else those that want to ``speak``; the highest importance wins and a
tie goes to the earlier state. :func:`speaking_order` extends it to stand-ins, from the array
alone, so nodes whose views of who is connected differ still skip a silent speaker in the same
way. :func:`reply_recipients` is whom a reply addresses by default.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ..protocol import COMPANION_ID_PREFIX, ClosingStage, Message, State
from .closing import later

__all__ = [
    "SpeakerDecision",
    "SpeakerReason",
    "SpeakingOrder",
    "decide_next_speaker",
    "ends_conversation",
    "reply_recipients",
    "speaking_order",
]


def reply_recipients(message: Message, me: str, present: Container[str]) -> list[str]:
    """Whom a reply to ``message`` addresses by default: its sender, then the others it addressed
    that are companions present here or people (ids that are no companion id), without duplicates
    and never the speaker itself. Companions of other conversations are not added, and ids of no
    companion present (a message may list thousands of ghosts) are dropped."""
    sender = message.params.from_
    others = [cid for cid in message.params.to if cid in present or not cid.startswith(COMPANION_ID_PREFIX)]
    return [cid for cid in dict.fromkeys([sender, *others]) if cid != me]


SpeakerReason: TypeAlias = Literal["selected", "wants_to_speak", "stand_in", "nobody", "terminal"]


@dataclass(frozen=True, slots=True)
class SpeakerDecision:
    """Who speaks next (``None``: nobody) and why, as every node computes it from one array."""

    speaker: str | None
    reason: SpeakerReason
    why: str
    closing: ClosingStage
    importance: float | None = None

    @property
    def conversation_over(self) -> bool:
        return self.reason == "terminal"


def decide_next_speaker(
    states: Sequence[State],
    active_ids: Iterable[str],
    *,
    exclude: Collection[str] = (),
    stand_in: bool = False,
) -> SpeakerDecision:
    """aikyo's rule: among states from active companions, the ``selected`` ones first, else those
    that want to ``speak``; the highest importance wins and a tie goes to the earlier state in
    the array (JavaScript's stable sort), so JavaScript and Python nodes agree. Nobody speaks
    when no one qualifies or the winner's stage is ``terminal``.

    ``exclude`` drops companions that were chosen before and stayed silent past the deadline.
    With ``stand_in``, when nobody qualifies a listener speaks instead (highest importance
    first): after a silent speaker, a turn must not end without a reply, or the conversation
    stalls before it could close.
    """
    active = set(active_ids)
    valid = [s for s in states if s.params.from_ in active and s.params.from_ not in exclude]
    stage: ClosingStage = "none"
    for s in valid:
        stage = later(stage, s.params.closing)
    skipped = f" (skipping silent {', '.join(sorted(exclude))})" if exclude else ""
    selected, speakers = _pools(valid)
    pools: list[tuple[SpeakerReason, list[State], str]] = [
        ("selected", selected, "is selected"),
        ("wants_to_speak", speakers, "wants to speak"),
    ]
    if stand_in:
        pools.append(("stand_in", valid, "stands in for silent speakers"))
    for reason, pool, label in pools:
        if not pool:
            continue
        best = pool[0]
        for s in pool[1:]:
            if s.params.importance > best.params.importance:
                best = s
        who = best.params.from_
        if best.params.closing == "terminal":
            return SpeakerDecision(
                None,
                "terminal",
                f"{who} would speak but the conversation reached terminal{skipped}",
                "terminal",
                best.params.importance,
            )
        ties = sum(1 for s in pool if s.params.importance == best.params.importance)
        tie = " (tie broken by array order)" if ties > 1 else ""
        why = (
            f"{who} {label} with importance {round(best.params.importance, 2):g}, "
            f"the highest of {len(pool)}{tie}{skipped}"
        )
        return SpeakerDecision(who, reason, why, best.params.closing, best.params.importance)
    return SpeakerDecision(
        None,
        "nobody",
        f"no active companion is selected or wants to speak ({len(valid)} valid state(s)){skipped}",
        stage,
    )


def _pools(valid: list[State]) -> tuple[list[State], list[State]]:
    """aikyo's two pools, in the order its rule tries them: the selected states, then those
    that want to speak (array order kept)."""
    return [s for s in valid if s.params.selected], [s for s in valid if s.params.state == "speak"]


def ends_conversation(states: Sequence[State]) -> bool:
    """Whether this states array ends the conversation: the next-speaker rule (the one every
    node applies) chooses nobody because the winner's stage is ``terminal``."""
    everyone = [s.params.from_ for s in states if s.params.from_.startswith(COMPANION_ID_PREFIX)]
    return bool(everyone) and decide_next_speaker(states, everyone).conversation_over


@dataclass(frozen=True, slots=True)
class SpeakingOrder:
    """Who speaks for a states array, and who stands in, slot by slot, when they stay silent."""

    first: SpeakerDecision
    order: tuple[str, ...]
    """``order[k]`` may speak ``k`` reply deadlines after the array was accepted."""

    def slot(self, companion_id: str) -> int | None:
        try:
            return self.order.index(companion_id)
        except ValueError:
            return None


def speaking_order(states: Sequence[State]) -> SpeakingOrder:
    """The speaker every node derives from an array, and the stand-ins after it.

    The first is aikyo's rule (:func:`decide_next_speaker`) over every companion in the array;
    each next one is the same rule with the ones before excluded, listeners last. The order
    depends on the array alone, never on who a node believes is connected: nodes whose
    directories differ still give each candidate the same slot, so two candidates never speak
    at once. (aikyo itself ignores absent companions; ours wait one slot for them instead, and
    a leader includes only the companions it sees.) Empty when nobody wants to speak or the
    stage is ``terminal``.
    """
    everyone = [s.params.from_ for s in states if s.params.from_.startswith(COMPANION_ID_PREFIX)]
    first = decide_next_speaker(states, everyone)
    if first.speaker is None:
        return SpeakingOrder(first, ())
    # Slot k is decide_next_speaker(states, everyone, exclude=order[:k], stand_in=True): the
    # best of the first pool with anyone left, so walking the pools once, each by importance
    # (a stable sort keeps array order for ties), gives the same slots in one pass instead of
    # one rule per slot (every node computes this for every array: with 30 companions the
    # repeated rule was 5 % of a node's CPU while they talked).
    active = set(everyone)
    valid = [s for s in states if s.params.from_ in active]
    pools = (*_pools(valid), valid)
    order, taken = [first.speaker], {first.speaker}
    for pool in pools:
        for state in sorted(pool, key=lambda s: -s.params.importance):
            who = state.params.from_
            if who in taken:
                continue
            if state.params.closing == "terminal":  # the rule would choose nobody from here on
                return SpeakingOrder(first, tuple(order))
            order.append(who)
            taken.add(who)
    return SpeakingOrder(first, tuple(order))
