"""Closing: how a conversation comes to an end, ``none -> pre-closing -> closing -> terminal``.

Four forces push the stage forward and nothing moves it back: once closing has begun each turn
moves it one stage on; a turn limit (``max_turns`` companion replies); repetition (character
bigram similarity over the last five utterances, aikyo's judge looks at five too); and a
goodbye: a message that takes leave (:func:`companion.lines.farewell.takes_leave`) begins
closing, when :func:`farewell_counts`. The floor (:func:`closing_floor`) is the least advanced
stage the next states may carry; every node applies it to the array it accepts, whoever led, so
a leader that does not know our rules (aikyo's) cannot keep a conversation open past its limit.

One force is held back: a leader's own model may not begin closing before ``min_replies`` companion
replies (:func:`counted_proposal`). A small local model proposes ``pre-closing`` at random from the
first turn, which ended conversations after two or three replies. Only the array this node
publishes is affected; arrays other leaders publish (aikyo's) are accepted with their stages as
they are, and the stage values on the wire are aikyo's.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Final, Literal, TypeAlias

from companion.protocol import CLOSING_ORDER, COMPANION_ID_PREFIX, ClosingStage

__all__ = [
    "DEFAULT_MIN_REPLIES",
    "DEFAULT_REPETITION_THRESHOLD",
    "REPETITION_WINDOW",
    "ClosingDecision",
    "ClosingReason",
    "advance",
    "bigram_jaccard",
    "closing_floor",
    "closing_stage",
    "counted_proposal",
    "farewell_counts",
    "later",
    "leading_floor",
    "proposal_ceiling",
    "repetition_score",
]

REPETITION_WINDOW: Final = 5
"""How many recent utterances the repetition signal compares (aikyo's judge looks at five)."""
DEFAULT_REPETITION_THRESHOLD: Final = 0.6
DEFAULT_MIN_REPLIES: Final = 4
"""Companion replies before a leader's own model may begin closing. With 4, a conversation whose
model proposes ``pre-closing`` as early as allowed still has 6 replies (the proposal, then one
``pre-closing`` and one ``closing`` reply) before ``terminal``."""


def closing_stage(value: object) -> ClosingStage:
    """``value`` as a closing stage; anything that is not one counts as ``none``."""
    for stage in CLOSING_ORDER:
        if value == stage:
            return stage
    return "none"


def advance(stage: ClosingStage) -> ClosingStage:
    """The stage after ``stage`` (``terminal`` stays ``terminal``)."""
    index = CLOSING_ORDER.index(stage)
    return CLOSING_ORDER[min(index + 1, len(CLOSING_ORDER) - 1)]


def later(a: ClosingStage, b: ClosingStage) -> ClosingStage:
    """The more advanced of two stages."""
    return a if CLOSING_ORDER.index(a) >= CLOSING_ORDER.index(b) else b


def proposal_ceiling(floor: ClosingStage) -> ClosingStage:
    """The most advanced stage a leader's own model may propose over ``floor``: closing moves at
    most one stage per turn.

    A model may *begin* closing (``pre-closing`` while the conversation is open); moving it on is
    the floor's job (:func:`closing_floor` advances a closing conversation one stage a turn and
    says where the turn limit stands), so once the floor is past ``none`` the model's proposal is
    held at the floor. The floor alone tells the two apart: it is ``none`` or ``pre-closing`` only
    while no reply has closed yet, and past that it is already the thread's stage plus one.
    ``floor + 1`` let a ``pre-closing`` thread jump to ``terminal`` with no ``closing`` line.
    """
    return later(floor, "pre-closing")


def counted_proposal(
    proposed: ClosingStage, *, floor: ClosingStage, replies: int, min_replies: int
) -> ClosingStage:
    """The closing stage a leader's own model proposed, as it counts after ``replies`` companion
    replies: a proposal past ``floor`` before ``min_replies`` replies is held at ``floor``, and
    from then on at :func:`proposal_ceiling` (one stage per turn).

    The floor (turn limit, repetition, closing under way) is never held back, and from
    ``min_replies`` on the model may begin closing as aikyo's leader does.
    """
    if CLOSING_ORDER.index(proposed) <= CLOSING_ORDER.index(floor):
        return proposed
    if replies < min_replies:
        return floor
    ceiling = proposal_ceiling(floor)
    return proposed if CLOSING_ORDER.index(proposed) <= CLOSING_ORDER.index(ceiling) else ceiling


def farewell_counts(sender: str, reply: int, min_replies: int) -> bool:
    """Whether a goodbye ``sender`` said as the conversation's ``reply``-th companion reply (a
    person's message: any number) begins closing: a person's at once, a companion's from
    ``min_replies`` on, where a leader's model may begin closing too (before, a small model's
    goodbye is as random as its proposal, :func:`counted_proposal`). The one rule both sides of a
    goodbye read: the floor (:meth:`~companion.conversation.state.MachineState._farewell`) and the
    speaker, which holds its card's goodbye back while it would not count
    (:meth:`~companion.engine.speech.Speaker._fitted`)."""
    return not sender.startswith(COMPANION_ID_PREFIX) or reply >= min_replies


@lru_cache(maxsize=256)
def _bigrams(text: str) -> frozenset[str]:
    """Cached: the repetition score compares the same last utterances pair by pair, on every
    node, for every states array (10 pairs, 20 normalisations each time)."""
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


ClosingReason: TypeAlias = Literal["open", "continues", "repetition", "turn_limit", "farewell"]


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
    farewell: bool = False,
) -> ClosingDecision:
    """The closing floor for the states answering a message after ``turn`` companion replies.

    Four forces push the stage forward; the most advanced wins:

    - once closing has begun (``previous`` past ``none``), each turn moves it one stage on, so a
      closing conversation ends within three turns;
    - a turn limit: the reply that reaches ``max_turns`` is a ``closing`` one, the one before it
      ``pre-closing``, and after it the stage is ``terminal``;
    - repetition at or above ``threshold`` over the last ``window`` utterances: ``pre-closing``;
    - ``farewell``, the message took leave (the caller decides whose goodbye counts, and when):
      ``pre-closing``. SmolLM2-135M's companions said "Good night, all!" and went on for six
      more replies until the turn limit closed the conversation (measured); a goodbye answered
      by a winding-down reply and then a closing one is how a person ends a talk.
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
    if farewell:
        candidates.append(ClosingDecision("pre-closing", "farewell", "the message took leave"))
    best = ClosingDecision("none", "open", "the conversation is open")
    for candidate in candidates:
        if CLOSING_ORDER.index(candidate.stage) > CLOSING_ORDER.index(best.stage):
            best = candidate
    if score is not None:
        best = ClosingDecision(best.stage, best.reason, f"{best.why} (repetition {score:.2f})", score)
    return best


def leading_floor(
    floor: ClosingDecision, previous: ClosingStage, *, turn: int, max_turns: int | None
) -> ClosingDecision:
    """The floor of the array a leader publishes, from its own ``floor``, the thread's stage
    ``previous`` and its ``turn`` (companion replies so far): when its own turn limit alone ends
    a conversation nobody has begun to close, at the limit itself, the array begins closing
    (``pre-closing``) instead.

    Cards' limits differ. Leaders with higher limits keep the conversation open past the turns
    at which this companion's limit would have begun closing, so at this companion's limit the
    thread may still be ``none``; ending it there cut the others off with no goodbye
    (SmolLM2-135M, five companions: ``none`` straight to ``terminal``, measured). The one reply
    more is another companion's (this one's own floor still ends its part), at its own stage:
    its floor raises it, and a conversation that has begun closing moves a stage a turn. Only
    that one step: past the limit, or once closing has begun, the floor stands, so the talk runs
    at most one reply past this companion's limit, and never waits on a companion the leader
    cannot know is past its own. With one limit for all, nothing changes (the thread reaches
    the limit at ``closing``).
    """
    opened = floor.reason == "turn_limit" and floor.stage == "terminal" and previous == "none"
    if not opened or turn != max_turns:
        return floor
    why = f"{floor.why}; the conversation was open: the others begin closing it"
    return ClosingDecision("pre-closing", "turn_limit", why, floor.repetition)
