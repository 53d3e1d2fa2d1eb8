"""Pure turn-taking: who leads a turn, who speaks next, and how a conversation closes.

No sockets, no clocks: every function here is a plain computation over wire models, so
every node reaches the same decision from the same inputs. Each decision carries a stable
``reason`` label (for counters and tests) and a ``why`` sentence (for people reading logs or
the demo transcript).

The states topic carries no message id, so a node ties a states array to the message it
answers by content (:func:`states_match`): every state must come from a companion the message
addressed, none from its sender, and every active addressee must have one. Consecutive messages
in one conversation have different senders, and the speaker of a reply was addressed by the
message before it, so an array for an older message lacks a state the newer one needs, or has
one the newer one forbids.

Extensions travel in a Message's ``params.metadata`` (aikyo keeps unknown metadata keys and
ignores them); the keys are the ``META_*`` constants below:

- ``next_speaker`` (str): the sender nominates the companion that should speak next; the leader
  marks that companion ``selected`` (and nobody else), so the next-speaker rule picks it.
- ``in_reply_to`` (str): the id of the message this reply answers.
- ``turn`` (int): how many companion replies the conversation has had, this one included.
- ``closing`` (str): the closing stage of the state that chose this speaker; the next leader
  advances it (pre-closing -> closing -> terminal), so a closing conversation always ends.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Final, Literal, TypeAlias

from .models.base import StateDecision
from .protocol import CLOSING_ORDER, ClosingStage, Message, State, canonical_json

__all__ = [
    "DEFAULT_REPETITION_THRESHOLD",
    "META_CLOSING",
    "META_IN_REPLY_TO",
    "META_NEXT_SPEAKER",
    "META_TURN",
    "REPETITION_WINDOW",
    "ClosingDecision",
    "ClosingReason",
    "LeaderPlan",
    "SpeakerDecision",
    "SpeakerReason",
    "StatesOutcome",
    "TurnInfo",
    "advance",
    "bigram_jaccard",
    "closing_floor",
    "decide_next_speaker",
    "fallback_decisions",
    "finalize_states",
    "later",
    "plan_leaders",
    "repetition_score",
    "reply_recipients",
    "select_leader",
    "stamp_reply",
    "states_match",
    "turn_info",
]

META_NEXT_SPEAKER: Final = "next_speaker"
META_IN_REPLY_TO: Final = "in_reply_to"
META_TURN: Final = "turn"
META_CLOSING: Final = "closing"

REPETITION_WINDOW: Final = 5
"""How many recent utterances the repetition signal compares (aikyo's judge looks at five)."""
DEFAULT_REPETITION_THRESHOLD: Final = 0.6


# --- Leader -----------------------------------------------------------------------------------


def select_leader(message: Message, active_ids: Iterable[str]) -> str | None:
    """The leader for ``message`` by aikyo 1.6's rule, or ``None`` when nobody addressed is active.

    ``md5(JSON.stringify(message))`` taken as a big integer, modulo the number of addressed ids
    that are active (the ``to`` list filtered, order and duplicates kept). A mixed network of
    Python and JavaScript nodes must pick the same leader, so this follows aikyo exactly.
    """
    active = set(active_ids)
    candidates = [cid for cid in message.params.to if cid in active]
    if not candidates:
        return None
    digest = hashlib.md5(canonical_json(message).encode("utf-8"), usedforsecurity=False)
    return candidates[int(digest.hexdigest(), 16) % len(candidates)]


@dataclass(frozen=True, slots=True)
class LeaderPlan:
    """Who leads a turn, and who takes over, in order, when the states do not arrive."""

    leader: str | None
    order: tuple[str, ...]
    """The takeover order, the leader first: rank ``k`` leads if nothing arrived after ``k`` slots."""
    reason: Literal["hash", "no_active_addressee"]
    why: str

    def rank(self, companion_id: str) -> int | None:
        """This companion's place in the takeover order, or ``None`` if it never leads this turn."""
        try:
            return self.order.index(companion_id)
        except ValueError:
            return None


def plan_leaders(message: Message, active_ids: Iterable[str]) -> LeaderPlan:
    """aikyo's leader, then the other active addressees in ``to`` order after it, wrapping round.

    Every node computes the same order from the same message and directory, so a takeover needs
    no coordination: rank ``k`` waits ``k`` slots and leads only if no states arrived.
    """
    active = set(active_ids)
    leader = select_leader(message, active)
    if leader is None:
        return LeaderPlan(None, (), "no_active_addressee", "none of the addressed companions is active")
    unique = list(dict.fromkeys(cid for cid in message.params.to if cid in active))
    start = unique.index(leader)
    order = tuple(unique[start:] + unique[:start])
    count = len([cid for cid in message.params.to if cid in active])
    why = f"md5 of the message modulo {count} active addressee(s) picks {leader}"
    if len(order) > 1:
        why += f"; takeover order {', '.join(order[1:])}"
    return LeaderPlan(leader, order, "hash", why)


# --- Message metadata extensions ------------------------------------------------------------


def _stage(value: object) -> ClosingStage:
    for stage in CLOSING_ORDER:
        if value == stage:
            return stage
    return "none"


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """The turn-taking extensions a message carries (defaults for messages without them)."""

    turn: int = 0
    closing: ClosingStage = "none"
    nominated: str | None = None
    in_reply_to: str | None = None


def turn_info(message: Message) -> TurnInfo:
    """Read the ``META_*`` keys; a value of the wrong type counts as absent (peers may be sloppy)."""
    meta: Mapping[str, Any] = message.params.metadata or {}
    turn = meta.get(META_TURN)
    closing = meta.get(META_CLOSING)
    nominated = meta.get(META_NEXT_SPEAKER)
    in_reply_to = meta.get(META_IN_REPLY_TO)
    return TurnInfo(
        turn=turn if isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0 else 0,
        closing=_stage(closing),
        nominated=nominated if isinstance(nominated, str) and nominated else None,
        in_reply_to=in_reply_to if isinstance(in_reply_to, str) and in_reply_to else None,
    )


def stamp_reply(message: Message, *, in_reply_to: str, turn: int, closing: ClosingStage) -> Message:
    """The reply with its turn extensions added; keys the speaker set itself (emotion,
    ``next_speaker``) are kept."""
    meta = dict(message.params.metadata or {})
    meta.update({META_IN_REPLY_TO: in_reply_to, META_TURN: turn, META_CLOSING: closing})
    params = message.params.model_copy(update={"metadata": meta})
    return message.model_copy(update={"params": params})


def reply_recipients(message: Message, me: str, present: Iterable[str]) -> list[str]:
    """Who a reply addresses by default: the previous speaker, the others it addressed, and every
    other companion present, in that order, without duplicates and never the speaker itself."""
    ordered = [message.params.from_, *message.params.to, *present]
    return [cid for cid in dict.fromkeys(ordered) if cid != me]


# --- States ---------------------------------------------------------------------------------


def states_match(states: Sequence[State], message: Message, active_ids: Iterable[str]) -> bool:
    """Whether a states array can answer ``message``: every state from an addressee of the
    message, none from its sender, and one from every addressee active here (see the module
    docstring for why this ties arrays to turns)."""
    if not states:
        return False
    addressed = set(message.params.to)
    sender = message.params.from_
    froms = {s.params.from_ for s in states}
    if sender in froms or not froms <= addressed:
        return False
    return (addressed & set(active_ids)) - {sender} <= froms


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
) -> StatesOutcome:
    """Turn the model's decisions into the states array, one per addressed companion in order.

    The model's answer is advice: a missing companion listens, unknown ids are dropped,
    importance is clamped to 0..10, every state carries one closing stage (the latest of the
    model's stages and ``floor``), and a nominee is the only ``selected`` companion.
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
        states.append(State.create(cid, state, _clamp_importance(decision.importance), selected, stage))
    return StatesOutcome(states, stage, tuple(notes))


def fallback_decisions(addressed: Sequence[str], nominated: str | None = None) -> list[StateDecision]:
    """States without a model (the leader's model failed or ran out of time): everybody is
    willing at the same importance, so the first addressee speaks, or the nominee if there is one."""
    order = list(dict.fromkeys(addressed))
    return [StateDecision(cid, "speak", 5.0, cid == nominated) for cid in order]


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
    pools: list[tuple[SpeakerReason, list[State], str]] = [
        ("selected", [s for s in valid if s.params.selected], "selected"),
        ("wants_to_speak", [s for s in valid if s.params.state == "speak"], "wanting to speak"),
    ]
    if stand_in:
        pools.append(("stand_in", valid, "standing in for silent speakers"))
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
            f"{who} is {label} with importance {best.params.importance:g}, "
            f"the highest of {len(pool)}{tie}{skipped}"
        )
        return SpeakerDecision(who, reason, why, best.params.closing, best.params.importance)
    return SpeakerDecision(
        None,
        "nobody",
        f"no active companion is selected or wants to speak ({len(valid)} valid state(s)){skipped}",
        stage,
    )


# --- Closing ----------------------------------------------------------------------------------


def advance(stage: ClosingStage) -> ClosingStage:
    """The stage after ``stage`` (``terminal`` stays ``terminal``)."""
    index = CLOSING_ORDER.index(stage)
    return CLOSING_ORDER[min(index + 1, len(CLOSING_ORDER) - 1)]


def later(a: ClosingStage, b: ClosingStage) -> ClosingStage:
    """The more advanced of two stages."""
    return a if CLOSING_ORDER.index(a) >= CLOSING_ORDER.index(b) else b


def _bigrams(text: str) -> frozenset[str]:
    norm = "".join(unicodedata.normalize("NFKC", text).casefold().split())
    if len(norm) < 2:
        return frozenset({norm}) if norm else frozenset()
    return frozenset(norm[i : i + 2] for i in range(len(norm) - 1))


def bigram_jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the character bigrams of two texts after NFKC normalisation,
    case folding and removal of whitespace (so full-width and half-width forms compare equal)."""
    x, y = _bigrams(a), _bigrams(b)
    if not x and not y:
        return 1.0
    return len(x & y) / len(x | y)


def repetition_score(utterances: Sequence[str], window: int = REPETITION_WINDOW) -> float | None:
    """How repetitive the last ``window`` utterances are: the mean pairwise bigram Jaccard
    (0 all different, 1 all identical). ``None`` until there are ``window`` utterances, as
    aikyo's judge waits for five messages. No model call."""
    recent = list(utterances)[-window:]
    if window < 2 or len(recent) < window:
        return None
    pairs = list(combinations(recent, 2))
    return sum(bigram_jaccard(a, b) for a, b in pairs) / len(pairs)


ClosingReason: TypeAlias = Literal["open", "continues", "repetition", "turn_limit"]


@dataclass(frozen=True, slots=True)
class ClosingDecision:
    """The least advanced stage the next states may carry, and why."""

    stage: ClosingStage
    reason: ClosingReason
    why: str
    repetition: float | None = None


def closing_floor(
    *,
    previous: ClosingStage,
    turn: int,
    utterances: Sequence[str],
    threshold: float = DEFAULT_REPETITION_THRESHOLD,
    max_turns: int | None = None,
    window: int = REPETITION_WINDOW,
) -> ClosingDecision:
    """The closing floor for the states answering a message after ``turn`` companion replies.

    Three forces push the stage forward; the most advanced wins:

    - once closing has begun (``previous`` past ``none``), each turn moves it one stage on, so a
      closing conversation ends within three turns;
    - a turn limit: the reply that reaches ``max_turns`` is a ``closing`` one, the one before it
      ``pre-closing``, and after it the stage is ``terminal``;
    - repetition at or above ``threshold`` over the last ``window`` utterances: ``pre-closing``.
    """
    score = repetition_score(utterances, window)
    candidates: list[ClosingDecision] = []
    if previous != "none":
        nxt = advance(previous)
        candidates.append(ClosingDecision(nxt, "continues", f"closing continues: {previous} -> {nxt}"))
    if max_turns is not None:
        replies_after = turn + 1
        if turn >= max_turns:
            stage: ClosingStage = "terminal"
        elif replies_after == max_turns:
            stage = "closing"
        elif replies_after == max_turns - 1:
            stage = "pre-closing"
        else:
            stage = "none"
        if stage != "none":
            candidates.append(
                ClosingDecision(stage, "turn_limit", f"turn limit {max_turns} after {turn} replies: {stage}")
            )
    if score is not None and score >= threshold:
        candidates.append(
            ClosingDecision(
                "pre-closing",
                "repetition",
                f"repetition {score:.2f} >= {threshold:g} over the last {window} utterances",
            )
        )
    best = ClosingDecision("none", "open", "the conversation is open")
    for candidate in candidates:
        if CLOSING_ORDER.index(candidate.stage) > CLOSING_ORDER.index(best.stage):
            best = candidate
    if score is not None:
        best = ClosingDecision(best.stage, best.reason, f"{best.why} (repetition {score:.2f})", score)
    return best
