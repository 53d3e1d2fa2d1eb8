"""States: the array a turn's leader publishes, and how every node ties it to its message.

The leader asks its model once for every addressed companion's state (speak or listen,
importance, selected, closing) and publishes the array on ``states``; :func:`finalize_states`
turns the model's advice into that array. The topic carries no message id, so a node ties an
array to the message it answers (:func:`states_match`): every state must come from a companion
the message addressed, and none from its sender. Our leaders also put a *turn tag* in the
array: they round every importance to 0.01 and add ``tag x 1e-8`` (subtract it at 10), the tag
(1..400000) coming from the message id (:func:`turn_tag`). The same offset on every state of an
array keeps its ranking, so JavaScript nodes choose the same speaker, and a late array for an
earlier message never answers a later one, even from the same sender to the same companions.
An array without a tag (aikyo's leaders) must instead have a state for every addressee active
here: consecutive messages have different senders and the speaker of a reply was addressed by
the message before it, so an older array lacks a state the newer message needs, or has one it
forbids. :class:`EarlyStates` holds arrays that overtook their message (gossip keeps no order
across topics).

Who may publish the array that counts is the conversation's rule (the leader whose slot is
due, see :mod:`companion.conversation.machine`); this module only says which message an array answers.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from companion.conversation.rules.closing import later
from companion.protocol import CLOSING_ORDER, ClosingStage, Message, State

__all__ = [
    "TAG_SPACE",
    "TAG_UNIT",
    "EarlyStates",
    "StateDecision",
    "StatesOutcome",
    "closing_states",
    "fallback_decisions",
    "finalize_states",
    "held_back",
    "quiet_closing",
    "states_match",
    "states_tag",
    "turn_tag",
]


@dataclass(frozen=True, slots=True)
class StateDecision:
    """One companion's state for the next turn, as the leader's model decided it."""

    companion_id: str
    state: Literal["speak", "listen"]
    importance: float
    selected: bool
    closing: ClosingStage = "none"


TAG_UNIT: Final = 1e-8
TAG_SPACE: Final = 400_000
"""Tags 1..400000 in units of 1e-8: below half the 0.01 rounding step, exact in a double."""


def turn_tag(message: Message) -> int:
    """The turn tag (1..400000) of the states that answer ``message``."""
    raw = message.params.id.encode("utf-8", "surrogatepass")  # a hostile id may hold a lone surrogate
    digest = hashlib.md5(raw, usedforsecurity=False).hexdigest()
    return int(digest, 16) % TAG_SPACE + 1


def _tagged(importance: float, tag: int) -> float:
    base = round(importance, 2)
    return base - tag * TAG_UNIT if base >= 10 else base + tag * TAG_UNIT


def states_tag(states: Sequence[State]) -> int | None:
    """The turn tag every state of the array carries, or ``None`` (untagged or inconsistent)."""
    tags = set()
    for state in states:
        value = state.params.importance
        tags.add(abs(round((value - round(value, 2)) / TAG_UNIT)))
    if len(tags) != 1:
        return None
    tag = tags.pop()
    return tag if 1 <= tag <= TAG_SPACE else None


def states_match(states: Sequence[State], message: Message, active_ids: Iterable[str]) -> bool:
    """Whether a states array can answer ``message``: every state from an addressee of the
    message and none from its sender; then the message's turn tag if the array carries one,
    else a state from every addressee active here (see the module docstring). The one array
    from the sender itself that counts is its :func:`quiet_closing`."""
    if not states:
        return False
    addressed = set(message.params.to)
    sender = message.params.from_
    froms = {s.params.from_ for s in states}
    if sender in froms:
        return quiet_closing(states, message)
    if not froms <= addressed:
        return False
    tag = states_tag(states)
    if tag is not None:
        return tag == turn_tag(message)
    return (addressed & set(active_ids)) - {sender} <= froms


NoteT = TypeVar("NoteT")


class EarlyStates(Generic[NoteT]):
    """Tagged states arrays that arrived before their message (gossip does not keep order
    across topics), each with a note (e.g. its publisher), until that message arrives.

    An array tagged for a message already seen is late, not early, and is not kept; the tag
    keeps a held array from answering any other message. Both tables are bounded.
    """

    def __init__(self, capacity: int = 16, memory: int = 256) -> None:
        self._held: deque[tuple[list[State], NoteT]] = deque(maxlen=capacity)
        self._seen_tags: deque[int] = deque(maxlen=memory)

    def message_seen(self, message: Message) -> None:
        self._seen_tags.append(turn_tag(message))

    def hold(self, states: list[State], note: NoteT) -> bool:
        """Keep an array that matched no open turn, if it may be early; whether it was kept."""
        tag = states_tag(states)
        if tag is None or tag in self._seen_tags:
            return False
        self._held.append((states, note))
        return True

    def take(self, message: Message, active_ids: Iterable[str]) -> list[tuple[list[State], NoteT]]:
        """Every held array that answers ``message``, in arrival order (removed)."""
        active = list(active_ids)
        taken = [item for item in self._held if states_match(item[0], message, active)]
        for item in taken:
            self._held.remove(item)
        return taken


@dataclass(frozen=True, slots=True)
class StatesOutcome:
    """The states a leader publishes, and what it changed in the model's answer, and why."""

    states: list[State]
    stage: ClosingStage
    adjustments: tuple[str, ...]


def _clamp_importance(value: float) -> float:
    if not isinstance(value, int | float) or math.isnan(value):
        return 0.0
    return float(min(10.0, max(0.0, value)))


def finalize_states(
    decisions: Sequence[StateDecision],
    addressed: Sequence[str],
    *,
    floor: ClosingStage,
    nominated: str | None = None,
    tag: int | None = None,
) -> StatesOutcome:
    """Turn the model's decisions into the states array, one per addressed companion in order.

    The model's answer is advice: a missing companion listens, unknown ids are dropped,
    importance is clamped to 0..10, every state carries one closing stage (the latest of the
    model's stages and ``floor``), and a nominee is the only ``selected`` companion. With
    ``tag`` (:func:`turn_tag` of the message), importances carry the turn tag.
    """
    notes: list[str] = []
    order = list(dict.fromkeys(addressed))
    by_id: dict[str, StateDecision] = {}
    for decision in decisions:
        if decision.companion_id not in order:
            notes.append(f"dropped a state for {decision.companion_id}, who was not addressed")
        elif decision.companion_id in by_id:
            notes.append(f"dropped a second state for {decision.companion_id}")
        else:
            by_id[decision.companion_id] = decision
    stage = floor
    for decision in by_id.values():
        stage = later(stage, decision.closing)
    proposed = sorted({d.closing for d in by_id.values()}, key=CLOSING_ORDER.index)
    if proposed and proposed != [stage]:
        notes.append(f"closing stage {stage} (model proposed {', '.join(proposed)}; floor {floor})")
    nominee = nominated if nominated in order else None
    if nominated is not None and nominee is None:
        notes.append(f"ignored the nomination of {nominated}, who is not an active addressee")
    states: list[State] = []
    for cid in order:
        if cid in by_id:
            decision = by_id[cid]
        else:
            notes.append(f"the model gave no state for {cid}; it listens")
            decision = StateDecision(cid, "listen", 0.0, False)
        state, selected = decision.state, decision.selected
        if nominee is not None:
            if cid == nominee and not (selected and state == "speak"):
                notes.append(f"{cid} was nominated by the sender: selected")
            elif cid != nominee and selected:
                notes.append(f"{cid} unselected: the sender nominated {nominee}")
            selected = cid == nominee
            state = "speak" if cid == nominee else state
        importance = _clamp_importance(decision.importance)
        if tag is not None:
            importance = _tagged(importance, tag)
        states.append(State.create(cid, state, importance, selected, stage))
    return StatesOutcome(states, stage, tuple(notes))


def fallback_decisions(addressed: Sequence[str], nominated: str | None = None) -> list[StateDecision]:
    """States without a model (the leader's model failed or ran out of time): everybody is
    willing at the same importance, so the first addressee speaks, or the nominee if there is one."""
    order = list(dict.fromkeys(addressed))
    return [StateDecision(cid, "speak", 5.0, cid == nominated) for cid in order]


def held_back(
    decisions: Sequence[StateDecision], busy: Collection[str]
) -> tuple[list[StateDecision], list[str]]:
    """The decisions with each companion of ``busy`` at importance 0 and not selected, so the
    next-speaker rule takes it last (it still speaks if nobody else will); and a note for each
    one changed. A leader holds back an aikyo companion that said the message it answers: aikyo's
    agent calls its model once more after its speak tool, and ignores every states array until
    that call returns, so as the top speaker it stays silent for a whole reply deadline (issue
    33: 3 of 50 conversations of bench_mixed, each time our leader selected the companion the
    message named, which had just spoken)."""
    out: list[StateDecision] = []
    notes: list[str] = []
    for d in decisions:
        if d.companion_id in busy and (d.importance or d.selected):
            notes.append(f"{d.companion_id} held back: it said the message answered and is still finishing")
            d = StateDecision(d.companion_id, d.state, 0.0, False, d.closing)
        out.append(d)
    return out, notes


def closing_states(addressed: Sequence[str], message: Message, closer: str) -> list[State]:
    """The *closing array* for ``message``, published by ``closer`` when nobody answered it (see
    :mod:`companion.conversation.machine`): at ``terminal``, tagged for the message, the closer the only
    one that would speak, so the next-speaker rule says ``terminal`` as for a leader's last
    array (:func:`~companion.conversation.rules.speaker.ends_conversation`): every node, client and aikyo
    node reads it as the end."""
    ids = list(dict.fromkeys([*addressed, closer] if closer not in addressed else addressed))
    decisions = [StateDecision(closer, "speak", 0.0, False, "terminal")]
    return finalize_states(decisions, ids, floor="terminal", tag=turn_tag(message)).states


def quiet_closing(states: Sequence[State], message: Message) -> bool:
    """Whether ``states`` is the *quiet closing* of ``message``: its sender's own ``terminal``
    state alone, tagged for it. A companion publishes it when its reply addressed nobody who can
    answer (only people, or companions that are gone): no turn opens for such a reply, so without
    it the conversation would neither go on nor end (a one-companion demo waited its timeout)."""
    return (
        len(states) == 1
        and states[0].params.from_ == message.params.from_
        and states[0].params.closing == "terminal"
        and states_tag(states) == turn_tag(message)
    )
