"""Pure turn-taking: who leads a turn, who speaks next, and how a conversation closes.

No sockets, no clocks: every function here is a plain computation over wire models, so
every node reaches the same decision from the same inputs. Each decision carries a stable
``reason`` label (for counters and tests) and a ``why`` sentence (for people reading logs or
the demo transcript).

The states topic carries no message id, so a node ties a states array to the message it
answers (:func:`states_match`): every state must come from a companion the message addressed,
and none from its sender. Our leaders also put a *turn tag* in the array: they round every
importance to 0.01 and add ``tag x 1e-8`` (subtract it at 10), the tag (1..400000) coming from
the message id (:func:`turn_tag`). The same offset on every state of an array keeps its
ranking, so JavaScript nodes choose the same speaker, and a late array for an earlier message
never answers a later one, even from the same sender to the same companions. An array without
a tag (aikyo's leaders) must instead have a state for every addressee active here: consecutive
messages have different senders and the speaker of a reply was addressed by the message
before it, so an older array lacks a state the newer message needs, or has one it forbids.

Gossip keeps no order across messages and topics: :class:`ConversationThread` follows which
message the conversation is at, and :class:`EarlyStates` holds arrays that overtook their
message. The speaking order (:func:`speaking_order`) depends on the array alone, so nodes whose
views of who is connected differ still skip a silent speaker in the same way.

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
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

from .models.base import StateDecision
from .protocol import CLOSING_ORDER, COMPANION_ID_PREFIX, ClosingStage, Message, State, canonical_json

__all__ = [
    "DEFAULT_REPETITION_THRESHOLD",
    "META_CLOSING",
    "META_IN_REPLY_TO",
    "META_NEXT_SPEAKER",
    "META_TURN",
    "REPETITION_WINDOW",
    "ClosingDecision",
    "ClosingReason",
    "ConversationThread",
    "EarlyStates",
    "LeaderPlan",
    "Placement",
    "SpeakerDecision",
    "SpeakerReason",
    "SpeakingOrder",
    "StatesOutcome",
    "TurnInfo",
    "advance",
    "bigram_jaccard",
    "closing_floor",
    "closing_stage",
    "decide_next_speaker",
    "fallback_decisions",
    "finalize_states",
    "later",
    "plan_leaders",
    "repetition_score",
    "reply_recipients",
    "select_leader",
    "speaking_order",
    "stamp_reply",
    "states_match",
    "states_tag",
    "turn_info",
    "turn_tag",
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


def plan_leaders(message: Message, active_ids: Iterable[str] | None = None) -> LeaderPlan:
    """aikyo's leader, then the other active addressees in ``to`` order after it, wrapping round.

    Without ``active_ids``, every companion the message addresses counts as active: the
    sender's view of who is present, which is the same on every node, where each node's own
    directory is not while companions come and go. (With a consistent membership both give
    aikyo's leader.) A takeover then needs no coordination: rank ``k`` waits ``k`` slots and
    leads only if no states arrived; a departed leader's slot simply passes.
    """
    if active_ids is None:
        active_ids = [cid for cid in message.params.to if cid.startswith(COMPANION_ID_PREFIX)]
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


def closing_stage(value: object) -> ClosingStage:
    """``value`` as a closing stage; anything that is not one counts as ``none``."""
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
        closing=closing_stage(closing),
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


# --- Where the conversation is ------------------------------------------------------------


Placing: TypeAlias = Literal["current", "stale", "overtaken"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a newly seen message goes in the conversation, and which turn it ends."""

    kind: Placing
    """``current``: the conversation is now at it; ``stale``: a reply that crossed a newer
    message; ``overtaken``: a message whose reply arrived before it."""
    closes: str | None = None
    """The message whose turn is over now (the previous current one), if any."""


class ConversationThread:
    """Follows which message a conversation is at, whatever order gossip delivers them in.

    A reply to the current message moves the conversation on; a message that is no reply (a
    person speaking) moves it too. A reply to an older message, one the conversation already
    left, is stale: it stays in the history but leads nowhere, so every node keeps following
    the same message. A message whose reply came first is overtaken: if it answers the
    current message, the conversation jumps to the newest reply known in its chain.
    """

    def __init__(self, current: str | None = None, *, limit: int = 4096) -> None:
        self.current = current
        self._answers: OrderedDict[str, str] = OrderedDict()
        self._known: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        if key not in table:
            table[key] = value
            while len(table) > self._limit:
                table.popitem(last=False)

    def _head(self, message_id: str) -> str:
        for _ in range(self._limit):
            if message_id not in self._answers:
                break
            message_id = self._answers[message_id]
        return message_id

    def place(self, message_id: str, in_reply_to: str | None) -> Placement:
        """Place one message (each id once; duplicates are the caller's to drop)."""
        previous: str | None = self.current
        self._remember(self._known, message_id, None)
        if in_reply_to is not None:
            self._remember(self._answers, in_reply_to, message_id)
        if message_id in self._answers and self._answers[message_id] != message_id:
            if in_reply_to is not None and in_reply_to == self.current:
                self.current = self._head(message_id)
                return Placement("overtaken", previous)
            return Placement("overtaken")
        if in_reply_to is not None and in_reply_to != self.current and in_reply_to in self._known:
            return Placement("stale")
        self.current = message_id
        return Placement("current", previous)


# --- States ---------------------------------------------------------------------------------


TAG_UNIT: Final = 1e-8
TAG_SPACE: Final = 400_000
"""Tags 1..400000 in units of 1e-8: below half the 0.01 rounding step, exact in a double."""


def turn_tag(message: Message) -> int:
    """The turn tag (1..400000) of the states that answer ``message``."""
    digest = hashlib.md5(message.params.id.encode("utf-8"), usedforsecurity=False).hexdigest()
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
    else a state from every addressee active here (see the module docstring)."""
    if not states:
        return False
    addressed = set(message.params.to)
    sender = message.params.from_
    froms = {s.params.from_ for s in states}
    if sender in froms or not froms <= addressed:
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

    def take(self, message: Message, active_ids: Iterable[str]) -> tuple[list[State], NoteT] | None:
        """The first held array that answers ``message`` (removed), if any."""
        active = list(active_ids)
        for item in self._held:
            if states_match(item[0], message, active):
                self._held.remove(item)
                return item
        return None


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
        ("selected", [s for s in valid if s.params.selected], "is selected"),
        ("wants_to_speak", [s for s in valid if s.params.state == "speak"], "wants to speak"),
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
    order = [first.speaker]
    while True:
        nxt = decide_next_speaker(states, everyone, exclude=order, stand_in=True)
        if nxt.speaker is None:
            return SpeakingOrder(first, tuple(order))
        order.append(nxt.speaker)


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
