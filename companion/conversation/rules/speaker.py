"""The speaker: who answers a message, and who stands in, slot by slot, when they stay silent.

Every node applies aikyo's rule to the one array it accepted (:func:`decide_next_speaker`): the
``selected`` states first, else those that want to ``speak``; the highest importance wins and a
tie goes to the earlier state. :func:`speaking_order` extends it to stand-ins, from the array
alone, so nodes whose views of who is connected differ still skip a silent speaker in the same
way. :func:`reply_recipients` is whom a reply addresses by default.

Before the array, its leader may *prefer* a speaker (:func:`preferred_speaker`), which it marks
``selected`` as it does a sender's nomination: a companion the message names ("Dot, roll the
dice!"), else one the conversation owes a turn (not heard yet while others were, or two
replies behind). The preference travels in the array, not in a rule of its own, so every node,
aikyo's included, still picks the speaker by aikyo's rule from the one array that counted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from companion.conversation.rules.closing import later
from companion.protocol import COMPANION_ID_PREFIX, ClosingStage, Message, State

__all__ = [
    "FAIR_LAG",
    "Preference",
    "SpeakerDecision",
    "SpeakerReason",
    "SpeakingOrder",
    "decide_next_speaker",
    "ends_conversation",
    "named_companion",
    "owed_companion",
    "preferred_speaker",
    "reply_recipients",
    "slot_can_be_filled",
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
        # "the highest of 1" read as if 1 were another importance (a demo's transcript)
        among = "the only one" if len(pool) == 1 else f"the highest of {len(pool)}"
        why = f"{who} {label} with importance {round(best.params.importance, 2):g}, {among}{tie}{skipped}"
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


def slot_can_be_filled(
    order: Sequence[str], slot: int, *, gave_up: Container[str], slotless: Callable[[str], bool]
) -> bool:
    """Whether anyone may still speak in slot ``slot`` of ``order``: not when its companion gave
    it up, nor when it is a stand-in's slot (after the first) of a companion that does not
    follow slots. aikyo's companions speak only as an array's top speaker (slot 0): they never
    stand in, so waiting for such a slot is a whole reply deadline of silence, wherever it
    stands in the order (issue 33: after our top speaker gave up, the next slot was an aikyo
    companion's and ours came only after its 12 s)."""
    who = order[slot]
    return who not in gave_up and not (slot > 0 and slotless(who))


FAIR_LAG: Final = 2
"""A companion this many replies behind the most heard one of its exchange is owed a turn."""


@dataclass(frozen=True, slots=True)
class Preference:
    """The companion a leader marks ``selected`` for a message, and why."""

    companion_id: str
    reason: Literal["nominated", "named", "owed"]
    why: str


def named_companion(text: str, names: Mapping[str, str], candidates: Sequence[str]) -> str | None:
    """The candidate whose name ``text`` mentions first (case folded; a name in Latin letters as a
    whole word, any other, such as a Japanese one, as it is written), or ``None``."""
    folded = text.casefold()
    best: tuple[int, int, str] | None = None
    for order, cid in enumerate(candidates):
        name = names.get(cid, "").strip().casefold()
        if not name:
            continue
        if name.isascii():
            found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", folded)
            at = found.start() if found else -1
        else:
            at = folded.find(name)
        if at >= 0 and (best is None or (at, order) < best[:2]):
            best = (at, order, cid)
    return None if best is None else best[2]


def owed_companion(
    heard: Mapping[str, int], last_turn: Mapping[str, int], candidates: Sequence[str]
) -> str | None:
    """The candidate the exchange owes a turn, or ``None``: one not heard yet while another
    companion was, or :data:`FAIR_LAG` replies behind the most heard one. Of several, the least
    heard, then the one silent longest, then the first addressed. ``heard``: replies per
    companion in the exchange; ``last_turn``: the reply count when each last spoke.

    Why in the leader: the states model's importances are noise for a small model, and with
    three or more companions the same two could answer each other for a whole conversation."""
    most = max(heard.values(), default=0)
    if most == 0:
        return None
    owed = [cid for cid in candidates if heard.get(cid, 0) == 0 or heard.get(cid, 0) <= most - FAIR_LAG]
    if not owed:
        return None
    return min(owed, key=lambda cid: (heard.get(cid, 0), last_turn.get(cid, -1), candidates.index(cid)))


def preferred_speaker(
    *,
    nominated: str | None,
    text: str,
    candidates: Sequence[str],
    names: Mapping[str, str],
    heard: Mapping[str, int],
    last_turn: Mapping[str, int],
) -> Preference | None:
    """Whom a leader marks ``selected``: the sender's nomination (``next_speaker``), else the
    companion the message names, else the one the exchange owes a turn; ``None``: the model
    decides. ``candidates``: the addressed companions present, the sender excluded."""
    if nominated is not None:
        return Preference(nominated, "nominated", f"the sender nominated {nominated}")
    named = named_companion(text, names, candidates)
    if named is not None:
        return Preference(named, "named", f"the message names {names.get(named, named)}")
    owed = owed_companion(heard, last_turn, candidates)
    if owed is not None:
        times = heard.get(owed, 0)
        return Preference(
            owed,
            "owed",
            f"{owed} was heard {times} time(s) in this exchange, others up to {max(heard.values())}: "
            "its turn (fair turns)",
        )
    return None
