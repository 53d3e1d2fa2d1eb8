"""One companion's part in a group conversation, as a state machine without I/O.

Theory of operation
-------------------
Like h11 for HTTP, a :class:`Conversation` owns every transition and does nothing itself. Its
driver (:mod:`companion.engine.driver`) feeds it *events* -- what the node saw (a message, a states
array, a peer's yield signal, a companion joining or leaving) and what the driver finished (the
leader's model answered, the reply went out, speaking failed) -- each with the current time:
``receive(event, now) -> list[Effect]``. Effects say what to do: ask the model for states,
publish the array, speak, withdraw a speech or a lead in progress, publish a signal, log a
decision. ``deadline()`` is the earliest time at which the machine wants a :class:`Tick`; the
driver sleeps until then (or until the next event). No clock is read here, nothing is awaited,
no socket is touched, so every rule below is a unit test with plain values.

The conversation is one *thread* of messages (:mod:`companion.conversation.rules.thread`): those that address
this companion, and those that answer a message of the thread. Anything else on the network --
unaddressed chatter, other groups' conversations, strangers -- never moves the thread, never
opens a turn and never withdraws a reply. Each message of the thread that addresses this
companion opens a *turn*, which goes through named phases:

    AWAITING_STATES --(this node's leader slot is due)--> LEADING
    AWAITING_STATES | LEADING --(an array counts)--> AWAITING_SPEAKER | SPEAKING | DONE
    AWAITING_SPEAKER --(this node's speaking slot opens)--> SPEAKING
    SPEAKING --(the reply went out)--> REPLIED
    SPEAKING --(the model failed: yield)--> AWAITING_SPEAKER | DONE
    any --(terminal, nobody, every slot passed unanswered)--> DONE
    DONE --(a late array of an earlier leader gives a speaker)--> AWAITING_SPEAKER

A turn DONE because every slot passed unanswered is then *closed* by a closing array (below);
once closed, no array counts for it any more.

and ends when the thread moves on (a newer message of the thread; a speech in progress is then
withdrawn). :data:`TRANSITIONS` is the whole table; a transition outside it is a bug and raises.

Rules (the rule book itself is :mod:`companion.conversation.rules`):

- *Leader*: the candidates are the addressed ids this node knows as companions (bound now or
  earlier), at most :data:`~companion.conversation.rules.MAX_CANDIDATES`; aikyo's md5 rule picks the leader
  among them, rank ``k`` leads when no array counted ``k x takeover_after`` after the message
  (aikyo's candidates after the first never take over and take no slot: ``rules.leader_slot``).
- *States*: an array counts only from a candidate whose slot is due (its rank's slot began,
  give or take :data:`SLOT_GRACE` of a slot for clock and delivery skew); an array from anyone
  else is logged and ignored whatever it says, ``terminal`` included. A candidate's array that
  comes before its slot is held until the slot, and dropped if an earlier leader's comes. A late
  array from an earlier leader replaces a takeover's, so every node ends on the same array.
- *Closing*: the stage of the accepted array is raised to this node's closing floor (the thread's
  stage, the turn limit, repetition), so a leader that does not know our rules (aikyo's) cannot
  move the stage back or run past ``max_turns``; the turn count is the thread's companion replies.
  Cards' limits differ, so floors differ: where only this node's floor reaches ``terminal``, the
  conversation is over for this companion alone. It gives its slot up (a ``terminal`` yield)
  and keeps following the turn; the conversation ends for everyone only by an array on the wire.
- *Unanswered*: when every slot of the order passed without a reply (each speaker failed, gave
  its slot up or is gone), nobody will ever answer, so the conversation ends, visibly: the
  leader whose array counted publishes a *closing array* (``terminal``, tagged for the message,
  :func:`~companion.conversation.rules.closing_states`) at once, else the next candidate in the takeover
  order one leader slot later, and so on; ``turn_unanswered`` and ``states_published`` (source
  ``unanswered``) say who gave up and why. It counts from the leader whose array counted (or an
  earlier one) at once; from a later candidate only once this node saw every slot pass too (it
  is held until then), so nobody cuts off a speaker still in its slot. :meth:`_unanswered` says
  why the conversation ends rather than going back to the sender.
- *Preferred speaker*: the leader marks one companion ``selected`` (as a sender's ``next_speaker``)
  when the message names it, else when the exchange owes it a turn (never heard while others
  were, or two replies behind: :func:`~companion.conversation.rules.preferred_speaker`). It travels in the
  array, so every node (aikyo's too) still picks the speaker by aikyo's rule.
- *Quiet ending*: a reply of this companion that addresses nobody who can answer (only people,
  or companions gone) opens no turn anywhere; this node publishes its quiet closing
  (:meth:`_close_quietly`) and the conversation ends, visibly.
- *aikyo companions*: a companion seen behaving as aikyo's (unstamped messages, untagged arrays)
  and never as ours is :meth:`slotless`: aikyo lets only an array's top speaker talk. A slot
  after the first that belongs to such a companion is never waited for, wherever it stands
  (:func:`~companion.conversation.rules.slot_can_be_filled`; when none of ours is left the turn
  is unanswered at once, and aikyo leaders take no closing slot). This node, leading, holds back
  an aikyo companion that said the message answered (:func:`~companion.conversation.rules.held_back`:
  aikyo's agent is still finishing and ignores arrays). When one of them speaks past this companion's
  turn limit and the leaders before this node are all aikyo's, this node publishes the
  ``terminal`` array at once, and it counts at once and for good (aikyo's arrays know no limit);
  and this companion's own reply at its limit addresses only the people (:meth:`_last_word`).
- *Speaker*: slot ``k`` of the speaking order opens ``k x reply_timeout`` after the array counted.
  A speaker says when it starts preparing (a thinking signal): every node then keeps its slot
  open for a reply deadline from that moment, so nodes that accepted the array at different
  times still never skip a speaker that is speaking (and an earlier candidate still preparing
  withdraws: the later one's node saw its slot pass). A speaker whose model fails gives its
  slot up at once and says so with a yield signal; every node then opens the next slot at once.

The same machine runs as a *bystander* (``me=None``, e.g. the demo's transcript): it follows the
thread of the companions it knows, accepts arrays by the same rules and reports the speaker
decisions, but never leads or speaks.

Signals (``action.send`` on the ``actions`` topic; aikyo companions do not subscribe to it, clients
do and may show them; both are extensions aikyo ignores):

- ``{"jsonrpc": "2.0", "method": "action.send", "params": {"from": SPEAKER, "name":
  "companion.thinking", "params": {"in_reply_to": MESSAGE_ID}}}`` when a speaker starts preparing
  its reply to ``MESSAGE_ID`` (a client may show "SPEAKER is thinking" until the reply or a
  yield for ``MESSAGE_ID`` arrives);
- ``{"jsonrpc": "2.0", "method": "action.send", "params": {"from": SPEAKER, "name":
  "companion.yield", "params": {"in_reply_to": MESSAGE_ID, "reason": REASON}}}`` when it gives up
  its slot; ``REASON`` is ``model_error``, ``timeout``, ``crashed``, ``no_reply`` (the model ended
  without speaking) or ``terminal`` (the array chose it, but its own closing floor ends the
  conversation). Nodes accept it only from the companion whose slot it is (the publisher's
  authenticated companion id) and before that slot has passed; one that overtook its array or
  its message is kept for it.

Both are accepted only when the publisher's authenticated companion id is the ``from``. Nodes
that accepted the array at different times open each slot at slightly different times; the
thinking signal anchors the open slot to the speaker's own start on every node.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeAlias

from companion.conversation.rules import (
    DEFAULT_REPETITION_THRESHOLD,
    REPETITION_WINDOW,
    ClosingDecision,
    ConversationThread,
    EarlyStates,
    LeaderPlan,
    SpeakingOrder,
    StateDecision,
    TurnInfo,
    closing_floor,
    closing_states,
    ends_conversation,
    fallback_decisions,
    finalize_states,
    held_back,
    later,
    leader_candidates,
    leader_slot,
    plan_leaders,
    preferred_speaker,
    quiet_closing,
    reply_recipients,
    slot_can_be_filled,
    speaking_order,
    stamp_reply,
    states_match,
    states_tag,
    turn_info,
    turn_tag,
)
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES, counted_proposal
from companion.protocol import COMPANION_ID_PREFIX, Action, ClosingStage, Message, State

__all__ = [
    "MAX_DETAIL",
    "ONE_MESSAGE",
    "SLOT_GRACE",
    "THINKING_SIGNAL",
    "TRANSITIONS",
    "YIELD_REASONS",
    "YIELD_SIGNAL",
    "ClosingSettings",
    "CompanionJoined",
    "CompanionLeft",
    "Conversation",
    "Decision",
    "Effect",
    "Event",
    "Lead",
    "MessageSeen",
    "Phase",
    "Prepare",
    "PublishSignal",
    "PublishStates",
    "ReplyPublished",
    "Speak",
    "SpeakingFailed",
    "StatesReady",
    "StatesSeen",
    "ThinkingSeen",
    "Tick",
    "TransitionError",
    "Withdraw",
    "YieldSeen",
    "present_diff",
    "read_signal",
]

YIELD_SIGNAL: Final = "companion.yield"
THINKING_SIGNAL: Final = "companion.thinking"
YIELD_REASONS: Final = ("model_error", "timeout", "crashed", "no_reply", "stopping", "terminal")
MAX_DETAIL: Final = 200
"""Longest ``detail`` a yield carries (the model error's reason, for people to read)."""
SLOT_GRACE: Final = 0.25
"""An array or a yield may come this fraction of a slot early (nodes see a message at slightly
different times); any earlier, it waits for its slot."""
ONE_MESSAGE: Final = "you already replied in this turn (one message per turn); finish without speaking again"
"""What the model hears when it tries to say a second thing in one turn."""
_VOICES: Final = 16
_VOICE_CHARS: Final = 160
_PEOPLE: Final = 16
_EVIDENCE: Final = 1024
"""Companions remembered as following slots, or as aikyo's (each table)."""

Level: TypeAlias = Literal["debug", "info", "warning", "error"]


class TransitionError(RuntimeError):
    """A transition outside :data:`TRANSITIONS`: a bug in the machine, never a network condition."""


class Phase(enum.Enum):
    """Where this node is in the turn opened by the current message."""

    AWAITING_STATES = "awaiting_states"
    """No array counted yet; this node is no leader, or its leader slot has not come."""
    LEADING = "leading"
    """This node asked its model for everybody's state and publishes the array."""
    AWAITING_SPEAKER = "awaiting_speaker"
    """An array counted; the open speaking slot is another companion's."""
    SPEAKING = "speaking"
    """This node prepares its reply (model calls, tools)."""
    REPLIED = "replied"
    """This node's reply went out; the thread moves on when it comes back."""
    DONE = "done"
    """Nobody speaks any more in this turn: terminal, nobody wanted to, or everyone stayed silent."""


TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.AWAITING_STATES: frozenset({Phase.LEADING, Phase.AWAITING_SPEAKER, Phase.SPEAKING, Phase.DONE}),
    Phase.LEADING: frozenset({Phase.AWAITING_SPEAKER, Phase.SPEAKING, Phase.DONE}),
    Phase.AWAITING_SPEAKER: frozenset({Phase.SPEAKING, Phase.DONE}),
    Phase.SPEAKING: frozenset({Phase.REPLIED, Phase.AWAITING_SPEAKER, Phase.DONE}),
    Phase.REPLIED: frozenset(),
    Phase.DONE: frozenset({Phase.AWAITING_SPEAKER}),
}
"""Every phase a turn may move to from each phase. ``DONE -> AWAITING_SPEAKER``: an earlier
leader's array that arrives late replaces the one that ended the turn. A turn in any phase ends
when the thread moves on (that is the turn's end, not a transition)."""


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageSeen:
    """A ``message.send`` arrived (this node's own come back too: the transport echoes them)."""

    message: Message
    publisher: str | None = None
    """The authenticated companion id of its publisher, if it proved one."""
    replayed: bool = False
    """Read back from the store at start-up: it moves the thread but opens no turn."""


@dataclass(frozen=True, slots=True)
class StatesSeen:
    """A states array arrived."""

    states: Sequence[State]
    publisher: str | None = None


@dataclass(frozen=True, slots=True)
class StatesReady:
    """The leader's model answered (``decisions``) or could not (``None``: rule-based states)."""

    message_id: str
    decisions: Sequence[StateDecision] | None
    source: str
    """``model``, or why the fallback: ``fallback_model_error``, ``fallback_timeout``..."""


@dataclass(frozen=True, slots=True)
class ReplyPublished:
    """This node's reply to ``message_id`` went out (stamped by :meth:`Conversation.outgoing`)."""

    message_id: str
    reply: Message


@dataclass(frozen=True, slots=True)
class SpeakingFailed:
    """This node could not reply to ``message_id``: it gives its slot up."""

    message_id: str
    reason: str
    """One of :data:`YIELD_REASONS`."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class YieldSeen:
    """A ``companion.yield`` signal arrived (:func:`read_yield`)."""

    in_reply_to: str
    companion: str
    reason: str
    publisher: str | None = None
    detail: str = ""
    """Why, in words (at most :data:`MAX_DETAIL` characters; network input: show it bounded)."""


@dataclass(frozen=True, slots=True)
class ThinkingSeen:
    """A ``companion.thinking`` signal arrived (:func:`read_signal`): ``companion`` started
    preparing its reply to ``in_reply_to``."""

    in_reply_to: str
    companion: str
    publisher: str | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the driver feeds one at :meth:`Conversation.deadline`)."""


@dataclass(frozen=True, slots=True)
class CompanionJoined:
    """A companion is present (and known from now on)."""

    companion_id: str


@dataclass(frozen=True, slots=True)
class CompanionLeft:
    """A companion is no longer present (it stays known)."""

    companion_id: str


Event: TypeAlias = (
    MessageSeen
    | StatesSeen
    | StatesReady
    | ReplyPublished
    | SpeakingFailed
    | YieldSeen
    | ThinkingSeen
    | Tick
    | CompanionJoined
    | CompanionLeft
)


# --- effects ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lead:
    """Ask the model for the states of ``addressed`` (the driver answers with :class:`StatesReady`)."""

    message_id: str
    message: Message
    addressed: tuple[str, ...]
    nominated: str | None
    floor: ClosingStage
    turn: int
    rank: int


@dataclass(frozen=True, slots=True)
class PublishStates:
    """Publish this array on ``states`` (it counts when it comes back, like anyone's)."""

    message_id: str
    states: list[State]


@dataclass(frozen=True, slots=True)
class Speak:
    """Prepare and publish the reply to ``message`` (the driver answers with
    :class:`ReplyPublished` through :meth:`Conversation.outgoing`, or :class:`SpeakingFailed`)."""

    message_id: str
    message: Message
    closing: ClosingStage
    turn: int
    """The count the reply carries (companion replies in the thread, this one included)."""
    recipients: tuple[str, ...]
    """Whom the reply addresses by default: the sender, and the companions present and people it
    addressed (a companion that left drops out, so every node soon plans over the same ids)."""
    fallback: tuple[str, ...]
    """Whom it addresses if the model names nobody known: the sender and the people."""
    people: tuple[str, ...]
    """The people (ids that are no companion id) of the conversation, most recent last."""


@dataclass(frozen=True, slots=True)
class Prepare:
    """Hook for the engine (voice, issue 30): this node is the turn's likely speaker (the one
    companion addressed, or the one the rules prefer), so its reply may be *prepared* now, while
    the leader decides; nothing of it may be said before a :class:`Speak` for the same message.
    ``speak`` is the effect this node expects: the engine keeps what it prepared only if the
    real one asks for the same reply."""

    speak: Speak


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Cancel the speech (or the lead) in progress for ``message_id``; nothing of it goes out."""

    message_id: str
    what: Literal["speech", "lead"]
    reason: str


@dataclass(frozen=True, slots=True)
class PublishSignal:
    """Publish ``action.send`` ``{from: me, name, params}`` on ``actions``."""

    name: str
    params: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Decision:
    """One structured log event: a decision or something that happened, with its reason."""

    event: str
    fields: Mapping[str, Any]
    level: Level = "info"


Effect: TypeAlias = Lead | PublishStates | Speak | Prepare | Withdraw | PublishSignal | Decision


@dataclass(frozen=True, slots=True)
class ClosingSettings:
    """This node's closing rules (a card's ``settings``); a bystander has no turn limit.

    ``min_replies``: companion replies before this node's own leading model may begin closing
    (:func:`~companion.conversation.rules.closing.counted_proposal`)."""

    max_turns: int | None = None
    repetition_threshold: float = DEFAULT_REPETITION_THRESHOLD
    min_replies: int = DEFAULT_MIN_REPLIES

    def __post_init__(self) -> None:
        if self.min_replies < 0:
            raise ValueError(f"min_replies must be 0 or more, not {self.min_replies}")


def read_signal(action: Action) -> YieldSeen | ThinkingSeen | None:
    """The yield or thinking signal an ``action.send`` carries, or ``None`` (another action, or a
    malformed one). The publisher is the caller's to fill in."""
    p = action.params
    in_reply_to, reason = p.params.get("in_reply_to"), p.params.get("reason")
    if p.name not in (YIELD_SIGNAL, THINKING_SIGNAL) or not isinstance(in_reply_to, str) or not in_reply_to:
        return None
    if p.name == THINKING_SIGNAL:
        return ThinkingSeen(in_reply_to, p.from_)
    if not isinstance(reason, str):
        return None
    detail = p.params.get("detail")
    return YieldSeen(
        in_reply_to, p.from_, reason[:64], detail=detail[:MAX_DETAIL] if isinstance(detail, str) else ""
    )


# --- the turn ------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Turn:
    """The turn opened by one message: everything the rules need, nothing the driver owns."""

    message: Message
    opened_at: float
    replies: int
    """Companion replies in the thread before this message's reply."""
    previous: ClosingStage
    """The thread's closing stage at the message."""
    nominated: str | None
    plan: LeaderPlan
    addressed: tuple[str, ...]
    """The candidates present here: whom this node's states array speaks for."""
    rank: int | None
    phase: Phase = Phase.AWAITING_STATES
    states: Sequence[State] | None = None
    priority: int = 0
    """The accepted array's leader rank (lower wins)."""
    pending: dict[int, tuple[Sequence[State], str | None]] = field(default_factory=dict)
    """Arrays of candidates whose slot had not come, by rank, with their publisher."""
    lead_done: bool = False
    """This node's leading finished (its array was published or withheld)."""
    accepted_at: float = 0.0
    order: tuple[str, ...] = ()
    """The speaking order of the accepted array (empty: nobody speaks)."""
    closing: ClosingStage = "none"
    slot_opens: list[float] = field(default_factory=list)
    """When each slot of ``order`` opens (a yield opens the next one early)."""
    ends: float = math.inf
    """When the last slot closes."""
    slot: int = -1
    """The open slot as last seen (``-1``: none yet)."""
    yielded: dict[str, str] = field(default_factory=dict)
    """Companions that gave their slot up, and why (a reason of :data:`YIELD_REASONS`)."""
    unanswered_at: float | None = None
    """When this node saw every slot of the order pass without a reply."""
    closing_at: float | None = None
    """When this node publishes the closing array if nobody's counted first (``None``: never)."""
    held_closing: tuple[list[State], str | None, int] | None = None
    """A later candidate's closing array that came before the turn was unanswered here."""
    closed: bool = False
    """A closing array counted: the conversation ended at this message; no array counts any more."""

    @property
    def message_id(self) -> str:
        return self.message.params.id


class Conversation:
    """The conversation as one node follows it (``me``: its companion id; ``None``: a bystander).

    ``known``: companions this node knew before (the store remembers them across restarts);
    ``takeover_after`` and ``reply_timeout``: the lengths of a leader slot and a speaking slot.
    """

    def __init__(
        self,
        me: str | None,
        *,
        takeover_after: float,
        reply_timeout: float,
        settings: ClosingSettings | None = None,
        known: Iterable[str] = (),
    ) -> None:
        if not (takeover_after > 0 and reply_timeout > 0):
            raise ValueError("slot lengths must be positive")
        self.me = me
        self.takeover_after = takeover_after
        self.reply_timeout = reply_timeout
        self.settings = settings or ClosingSettings()
        self.known: set[str] = set(known) | ({me} if me is not None else set())
        self.present: set[str] = set()
        self.thread = ConversationThread()
        self.turn: _Turn | None = None
        self.replies = 0
        """Companion replies in the thread up to the current message."""
        self.stage: ClosingStage = "none"
        self.voices: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """What each participant said last, and at which turn (the speaker's model sees it)."""
        self.people: OrderedDict[str, None] = OrderedDict()
        self.names: Mapping[str, str] = {}
        """Companion id -> name (the driver's directory): a message that names a companion
        prefers it as its speaker."""
        self._heard: OrderedDict[str, int] = OrderedDict()
        """Replies per companion in the current exchange (fair turns)."""
        self._last_turn: dict[str, int] = {}
        """The reply count when each companion of the exchange last spoke."""
        self._utterances: deque[str] = deque(maxlen=REPETITION_WINDOW)
        self._early: EarlyStates[tuple[str | None, float]] = EarlyStates()
        self._early_plain: deque[tuple[list[State], str | None, float]] = deque(maxlen=4)
        self._follows: OrderedDict[str, None] = OrderedDict()
        """Companions seen following slots: a stamped reply, a tagged array, a signal, a tool list."""
        self._aikyo_like: OrderedDict[str, None] = OrderedDict()
        """Companions seen behaving as aikyo's: an unstamped message or an untagged array of theirs."""
        self._early_yields: OrderedDict[str, dict[str, str]] = OrderedDict()
        """Yields whose message has not arrived yet: message id -> companion -> reason."""
        self._messages: OrderedDict[str, Message] = OrderedDict()

    # --- queries -------------------------------------------------------------------------------

    @property
    def bystander(self) -> bool:
        return self.me is None

    @property
    def current(self) -> Message | None:
        """The message the conversation is at."""
        return None if self.thread.current is None else self._messages.get(self.thread.current)

    @property
    def in_turn(self) -> bool:
        """Whether a turn of this node is still running: its deadlines, not a routine, end it."""
        return self.turn is not None and self.turn.phase not in (Phase.DONE, Phase.REPLIED)

    def slotless(self, companion_id: str) -> bool:
        """Whether ``companion_id`` is known not to follow speaking slots: it behaved as an aikyo
        companion (unstamped messages, untagged arrays) and never as ours. aikyo lets only an
        array's top speaker talk: it never takes a stand-in's slot, nor one given up, and ignores
        yields, so waiting for its slot is waiting a whole reply deadline for nothing. A companion
        not seen yet either way follows slots (waiting for it costs time, not the conversation)."""
        return companion_id in self._aikyo_like and companion_id not in self._follows

    def follows_slots(self, companion_id: str) -> None:
        """``companion_id`` proved it is one of ours (the driver saw its tool list, its signal)."""
        _latest(self._follows, companion_id, None, _EVIDENCE)

    def _evidence(self, companion_id: str | None, ours: bool) -> None:
        if (
            companion_id is None
            or companion_id == self.me
            or not companion_id.startswith(COMPANION_ID_PREFIX)
        ):
            return
        if ours:
            self.follows_slots(companion_id)
        elif companion_id not in self._follows:
            _latest(self._aikyo_like, companion_id, None, _EVIDENCE)

    def belongs(self, message: Message) -> bool:
        """Whether ``message`` is part of this conversation: it comes from or addresses this
        companion (a bystander: a companion it knows), or answers a message of the thread."""
        params = message.params
        if self.me is not None:
            involved = params.from_ == self.me or self.me in params.to
        else:
            involved = params.from_ in self.known or any(cid in self.known for cid in params.to)
        if involved:
            return True
        in_reply_to = turn_info(message).in_reply_to
        return in_reply_to is not None and self.thread.knows(in_reply_to)

    def memory(self) -> dict[str, Any]:
        """The working memory of the conversation, as the speaker's model sees it."""
        return {
            "message_id": self.thread.current,
            "turn": self.replies,
            "closing": self.stage,
            "voices": {k: dict(v) for k, v in self.voices.items()},
        }

    def outgoing(self, message: Message) -> Message | str:
        """This node's reply, stamped with its turn extensions; or why it may not go out (a
        sentence for the model). Pure: :class:`ReplyPublished` records that it went out."""
        turn = self.turn
        if turn is None or turn.phase is not Phase.SPEAKING:
            if turn is not None and turn.phase is Phase.REPLIED:
                return ONE_MESSAGE
            return "the conversation moved on; this turn is over, finish without speaking"
        reply = stamp_reply(message, in_reply_to=turn.message_id, turn=turn.replies + 1, closing=turn.closing)
        return self._last_word(reply, turn.replies + 1)

    def _last_word(self, reply: Message, count: int) -> Message:
        """The reply that reaches this companion's turn limit, in a conversation with aikyo
        companions, addresses only its people: it opens no turn, and its quiet closing ends the
        conversation (:meth:`_close_quietly`). Addressed to an aikyo companion, it would open a
        turn that aikyo's leader may give to an aikyo speaker, which knows no limit and speaks on
        whatever our nodes publish after. A reply without people, or below the limit, is as the
        speaker made it."""
        limit, to = self.settings.max_turns, reply.params.to
        if limit is None or count < limit or not any(self.slotless(cid) for cid in to):
            return reply
        people = [cid for cid in to if not cid.startswith(COMPANION_ID_PREFIX)]
        if not people:
            return reply
        return reply.model_copy(update={"params": reply.params.model_copy(update={"to": people})})

    def deadline(self) -> float | None:
        """The earliest time at which this machine wants a :class:`Tick` (``None``: no timer)."""
        turn = self.turn
        if turn is None:
            return None
        times: list[float] = []
        if turn.states is None:
            if turn.phase is Phase.AWAITING_STATES and turn.rank:
                times.append(turn.opened_at + self._lead_slot(turn, turn.rank) * self.takeover_after)
            times.extend(self._due(turn, rank) for rank in turn.pending)
        elif turn.phase in (Phase.AWAITING_SPEAKER, Phase.SPEAKING) and not self.bystander:
            k = turn.slot
            times.append(turn.slot_opens[k + 1] if k >= 0 and k + 1 < len(turn.order) else turn.ends)
        elif turn.closing_at is not None:
            times.append(turn.closing_at)
        return min(times) if times else None

    # --- the one entry point ---------------------------------------------------------------------

    def receive(self, event: Event, now: float) -> list[Effect]:
        """Feed one event; the effects the driver must carry out, in order."""
        out: list[Effect] = []
        if isinstance(event, MessageSeen):
            self._on_message(event, now, out)
        elif isinstance(event, StatesSeen):
            self._offer(list(event.states), event.publisher, now, out)
        elif isinstance(event, StatesReady):
            self._on_states_ready(event, out)
        elif isinstance(event, ReplyPublished):
            self._on_replied(event, out)
        elif isinstance(event, SpeakingFailed):
            self._on_failed(event, now, out)
        elif isinstance(event, YieldSeen | ThinkingSeen):
            if event.publisher == event.companion:
                self._evidence(event.publisher, True)  # aikyo sends no signals
            if isinstance(event, YieldSeen):
                self._on_yield(event, now, out)
            else:
                self._on_thinking(event, now, out)
        elif isinstance(event, CompanionJoined):
            self.known.add(event.companion_id)
            self.present.add(event.companion_id)
        elif isinstance(event, CompanionLeft):
            self.present.discard(event.companion_id)
        self._on_time(now, out)
        return out

    # --- transitions ---------------------------------------------------------------------------

    def _goto(self, turn: _Turn, phase: Phase) -> None:
        if phase not in TRANSITIONS[turn.phase]:
            raise TransitionError(f"turn {turn.message_id}: {turn.phase.name} -> {phase.name} is not allowed")
        turn.phase = phase

    @staticmethod
    def _log(out: list[Effect], event: str, level: Level = "info", **fields: Any) -> None:
        out.append(Decision(event, fields, level))

    # --- messages ------------------------------------------------------------------------------

    def _on_message(self, event: MessageSeen, now: float, out: list[Effect]) -> None:
        message = event.message
        params = message.params
        info = turn_info(message)
        if self.thread.knows(params.id):
            self._log(out, "message_duplicate", "debug", message_id=params.id, sender=params.from_)
            return
        if event.publisher is not None and event.publisher == params.from_:
            # our companions stamp what they say; aikyo's messages carry no turn extensions
            self._evidence(params.from_, info.stamped or info.in_reply_to is not None)
        member = self.belongs(message)
        placed = self.thread.place(params.id, info.in_reply_to, member=member)
        if not member:
            return  # another conversation, or chatter: it changes nothing here
        _latest(self._messages, params.id, message, 256)
        self._early.message_seen(message)
        self._utterances.append(params.message)
        if not params.from_.startswith(COMPANION_ID_PREFIX) and params.from_ != self.me:
            _latest(self.people, params.from_, None, _PEOPLE)
        if self.turn is not None and placed.closes == self.turn.message_id:
            self._end_turn(self.turn, message, out)
        if placed.kind != "current":
            self._log(
                out,
                "message_stale",
                message_id=params.id,
                sender=params.from_,
                in_reply_to=info.in_reply_to,
                current=self.thread.current,
                placement=placed.kind,
                reason="its reply arrived first"
                if placed.kind == "overtaken"
                else "answers a message that a newer one superseded",
            )
            return
        if params.from_.startswith(COMPANION_ID_PREFIX) and not opens_exchange(info):
            # The count follows the thread: our replies say it, aikyo's do not; nobody holds it down.
            self.replies = max(self.replies + 1, info.turn if info.stamped else 0)
            self.stage = later(self.stage, info.closing)
            _latest(self._heard, params.from_, self._heard.get(params.from_, 0) + 1, _VOICES)
            self._last_turn = {cid: self._last_turn.get(cid, -1) for cid in self._heard}
            self._last_turn[params.from_] = self.replies
        else:
            # a person speaking opens a new exchange, as does a companion that says it opens one;
            # a person's ``closing: terminal`` (a client's stop) ends it: the floor is terminal,
            # so whoever leads publishes a terminal array without asking its model
            person_stops = info.closing == "terminal" and not params.from_.startswith(COMPANION_ID_PREFIX)
            self.replies, self.stage = 0, "terminal" if person_stops else "none"
            self._heard.clear()
            self._last_turn.clear()
        _latest(
            self.voices, params.from_, {"said": params.message[:_VOICE_CHARS], "turn": self.replies}, _VOICES
        )
        if event.replayed:
            return
        if params.from_ == self.me:
            if info.in_reply_to is not None and not (set(params.to) & self.present) - {self.me}:
                self._close_quietly(message, out)
            return
        if self.me is not None and self.me not in params.to:
            self._log(out, "not_addressed", "debug", message_id=params.id, sender=params.from_)
            return
        self._open_turn(message, info.nominated, now, out)

    def _close_quietly(self, reply: Message, out: list[Effect]) -> None:
        """This companion's reply came back addressed to nobody who can answer (only people, or
        companions that are gone): no turn opens for it anywhere, so the conversation would
        neither go on nor end. It ends visibly: this node publishes the reply's quiet closing
        (:func:`~companion.conversation.rules.quiet_closing`), which clients, bystanders and aikyo nodes read
        as ``terminal``. A person who answers opens a new exchange, as always."""
        assert self.me is not None
        why = "this companion's reply addresses nobody who can answer; the conversation ends here"
        self._log(
            out,
            "states_published",
            message_id=reply.params.id,
            rank=None,
            source="quiet",
            stage="terminal",
            reason="quiet",
            to=list(reply.params.to),
            why=why,
        )
        self._log(
            out,
            "conversation_over",
            message_id=reply.params.id,
            turn=self.replies,
            closing="terminal",
            reason="quiet",
        )
        out.append(PublishStates(reply.params.id, closing_states((), reply, self.me)))

    def _open_turn(self, message: Message, nominated: str | None, now: float, out: list[Effect]) -> None:
        params = message.params
        candidates = leader_candidates(message, self.known)
        if candidates.capped:
            self._log(
                out,
                "addressees_capped",
                "warning",
                message_id=params.id,
                dropped=candidates.capped,
                reason="too_many_addressees",
                why=f"more than {len(candidates.ids)} companions addressed; the rest take no part",
            )
        plan = plan_leaders(message, candidates.ids)
        addressed = tuple(cid for cid in candidates.ids if cid in self.present)
        rank = plan.rank(self.me)
        if rank is not None:
            busy = self._finishing(message)  # issue 33 hook: never prefer one still finishing
            preference = preferred_speaker(
                nominated=nominated,
                text=params.message,
                candidates=[cid for cid in addressed if cid != params.from_ and cid not in busy],
                names=self.names,
                heard=self._heard,
                last_turn=self._last_turn,
            )
            if preference is not None and preference.reason != "nominated":
                nominated = preference.companion_id
                self._log(
                    out,
                    "speaker_preferred",
                    message_id=params.id,
                    speaker=nominated,
                    reason=preference.reason,
                    why=preference.why,
                )
        turn = _Turn(message, now, self.replies, self.stage, nominated, plan, addressed, rank)
        self.turn = turn
        self._log(
            out,
            "leader_chosen",
            message_id=params.id,
            sender=params.from_,
            turn=self.replies,
            leader=plan.leader,
            rank=rank,
            order=list(plan.order),
            unknown_addressees=candidates.unknown,
            reason=plan.reason,
            why=plan.why,
        )
        for companion, reason in self._early_yields.pop(params.id, {}).items():
            fields = {"message_id": params.id, "yielder": companion, "publisher": companion}
            self._yield(turn, companion, reason, now, out, fields)
        for states, (publisher, _arrived) in self._early.take(message, self.present):
            self._offer(states, publisher, now, out)
        for item in [i for i in self._early_plain if states_match(i[0], message, self.present)]:
            self._early_plain.remove(item)
            if not now - item[2] > self.takeover_after:  # (without a clock, inf - inf: kept)
                self._offer(item[0], item[1], now, out)
        # --- hook (voice, issue 30): the likely speaker prepares its reply while the leader decides
        others = [cid for cid in addressed if cid != params.from_]
        likely = nominated or (others[0] if len(others) == 1 else None)
        stage = self._floor(turn).stage if rank is not None and likely == self.me else "terminal"
        if stage != "terminal" and turn.states is None:  # at terminal it gives its slot up
            out.append(Prepare(replace(self._speak_effect(turn), closing=stage)))
        # --- end of hook
        if rank == 0 and turn.states is None:
            self._lead(turn, out)
        elif (
            rank and turn.states is None and self.slotless(params.from_) and self._first_follower(turn, rank)
        ):
            floor = self._floor(turn)
            if floor.stage == "terminal":
                self._log(
                    out,
                    "cap_closing",
                    "warning",
                    message_id=params.id,
                    sender=params.from_,
                    rank=rank,
                    reason="past_the_cap",
                    why=f"{params.from_} (aikyo's, which knows no turn limit) spoke past this "
                    f"companion's limit ({floor.why}) and the leaders before this node are aikyo's: "
                    "the terminal array goes out now",
                )
                self._lead(turn, out)

    def _finishing(self, message: Message) -> frozenset[str]:
        """The aikyo companion that said the message ``message`` answers: aikyo's agent is
        still making its last model call then and ignores every states array
        (:func:`~companion.conversation.rules.held_back`)."""
        answered = turn_info(message).in_reply_to
        said = self._messages.get(answered) if answered is not None else None
        who = None if said is None else said.params.from_
        return frozenset([who]) if who is not None and self.slotless(who) else frozenset()

    def _first_follower(self, turn: _Turn, rank: int) -> bool:
        """Whether every leader candidate ranked before ``rank`` is aikyo's (:meth:`slotless`):
        the candidate at ``rank`` is then the first that applies our turn limits."""
        return all(self.slotless(cid) for cid in turn.plan.order[:rank])

    def _end_turn(self, turn: _Turn, by: Message, out: list[Effect]) -> None:
        """A newer message of the thread ends ``turn``: a lead or a speech in progress is withdrawn,
        unless the newer message is this node's own reply."""
        self.turn = None
        if turn.phase is Phase.LEADING and not turn.lead_done:
            out.append(Withdraw(turn.message_id, "lead", "the conversation moved on"))
        if turn.phase is Phase.SPEAKING and by.params.from_ != self.me:
            answered = turn_info(by).in_reply_to == turn.message_id
            reason = (
                "another companion replied first"
                if answered
                else "a newer message of the conversation arrived"
            )
            out.append(Withdraw(turn.message_id, "speech", reason))
            self._log(out, "speech_withdrawn", message_id=turn.message_id, by=by.params.from_, reason=reason)

    # --- leading -------------------------------------------------------------------------------

    def _floor(self, turn: _Turn) -> ClosingDecision:
        return closing_floor(
            previous=turn.previous,
            turn=turn.replies,
            utterances=list(self._utterances),
            threshold=self.settings.repetition_threshold,
            max_turns=self.settings.max_turns,
        )

    def _lead(self, turn: _Turn, out: list[Effect]) -> None:
        self._goto(turn, Phase.LEADING)
        floor = self._floor(turn)
        assert turn.rank is not None
        if floor.stage == "terminal":  # no model needed: the floor decides
            self._publish_states(turn, None, "closing_floor_terminal", out)
            return
        out.append(
            Lead(
                turn.message_id,
                turn.message,
                turn.addressed,
                turn.nominated,
                floor.stage,
                turn.replies,
                turn.rank,
            )
        )

    def _on_states_ready(self, event: StatesReady, out: list[Effect]) -> None:
        turn = self.turn
        if (
            turn is None
            or turn.message_id != event.message_id
            or turn.phase is not Phase.LEADING
            or turn.lead_done
        ):
            self._log(out, "states_withheld", message_id=event.message_id, reason="states already arrived")
            return
        self._publish_states(turn, event.decisions, event.source, out)

    def _publish_states(
        self, turn: _Turn, decisions: Sequence[StateDecision] | None, source: str, out: list[Effect]
    ) -> None:
        floor = self._floor(turn)
        held: list[str] = []
        if decisions is None:
            decisions = fallback_decisions(turn.addressed, turn.nominated)
        else:
            counted = []
            for d in decisions:
                stage = counted_proposal(
                    d.closing, floor=floor.stage, replies=turn.replies, min_replies=self.settings.min_replies
                )
                if stage != d.closing:
                    held.append(
                        f"{d.companion_id} proposed {d.closing} before {self.settings.min_replies} "
                        f"replies: held at {stage}"
                    )
                counted.append(replace(d, closing=stage))
            decisions = counted
        # issue 33 hook: an aikyo companion that said the message answered is still finishing
        busy = self._finishing(turn.message)
        decisions, notes = held_back(decisions, busy)
        held += notes
        nominated = None if turn.nominated in busy else turn.nominated
        outcome = finalize_states(
            decisions, turn.addressed, floor=floor.stage, nominated=nominated, tag=turn_tag(turn.message)
        )
        self._log(
            out,
            "states_published",
            message_id=turn.message_id,
            rank=turn.rank,
            source=source,
            stage=outcome.stage,
            floor=floor.stage,
            floor_reason=floor.reason,
            floor_why=floor.why,
            repetition=floor.repetition,
            adjustments=[*held, *outcome.adjustments],
            states=[_state_summary(s) for s in outcome.states],
        )
        turn.lead_done = True
        out.append(PublishStates(turn.message_id, outcome.states))

    # --- accepting states ----------------------------------------------------------------------

    def _due(self, turn: _Turn, rank: int) -> float:
        slot = self._lead_slot(turn, rank)
        return turn.opened_at + (slot - SLOT_GRACE) * self.takeover_after if slot else turn.opened_at

    def _lead_slot(self, turn: _Turn, rank: int) -> int:
        """issue 33 hook: aikyo's candidates after the first take no leader slot (rules.leader_slot)."""
        return leader_slot(turn.plan.order, rank, self.slotless)

    def _offer(self, states: list[State], publisher: str | None, now: float, out: list[Effect]) -> None:
        self._evidence(publisher, states_tag(states) is not None)  # our leaders tag their arrays
        turn = self.turn
        froms = [s.params.from_ for s in states]
        if turn is None or not states_match(states, turn.message, self.present):
            held = self._early.hold(states, (publisher, now))  # its message may still be on the way
            if not held and self.bystander and states_tag(states) is None:
                # Untagged (aikyo's) arrays cannot be tied to a message not seen yet; a bystander
                # only reports, so it keeps a few for a slot (a wrong match costs a wrong line).
                self._early_plain.append((states, publisher, now))
                held = True
            self._log(
                out,
                "states_ignored",
                "debug",
                publisher=publisher,
                froms=froms,
                message_id=None if turn is None else turn.message_id,
                held=held,
                reason="no open turn" if turn is None else "not for the current message",
            )
            return
        quiet = quiet_closing(states, turn.message)
        if quiet and publisher is not None and publisher != turn.message.params.from_:
            rank: int | None = None  # only the sender may close its own message quietly
        elif quiet or (publisher is None and self.bystander):
            # A bystander that cannot authenticate publishers takes an array as the leader's.
            rank = 0
        else:
            rank = turn.plan.rank(publisher)
        if rank is None:
            self._log(
                out,
                "states_ignored",
                "warning",
                publisher=publisher,
                message_id=turn.message_id,
                closing=sorted({s.params.closing for s in states}),
                reason="not_a_leader",
                why=f"published by {publisher or 'an unknown peer'}, no leader candidate of this message",
            )
            return
        if turn.states is not None:
            same = list(turn.states) == states
            if turn.closed:
                self._log(
                    out,
                    "states_ignored",
                    "debug" if same else "info",
                    publisher=publisher,
                    message_id=turn.message_id,
                    reason="the conversation closed at this message",
                )
                return
            if not same and rank >= turn.priority and ends_conversation(states):
                self._offer_closing(turn, states, rank, publisher, now, out)
                return
            if same or rank >= turn.priority:
                self._log(
                    out,
                    "states_ignored",
                    "debug" if same else "info",
                    publisher=publisher,
                    message_id=turn.message_id,
                    reason="duplicate" if same else "an array from an earlier or equal leader came first",
                )
                return
            self._log(
                out,
                "states_switched",
                "warning",
                publisher=publisher,
                message_id=turn.message_id,
                rank=rank,
                replaced_rank=turn.priority,
                reason="the array of an earlier leader arrived late",
            )
            self._accept(turn, states, rank, publisher, now, out)
            turn.closed = ends_conversation(states)  # the earliest leader ended it: final
            return
        final = bool(rank) and ends_conversation(states) and self._first_follower(turn, rank)
        if final:
            # The first of our leaders ends it (its cap, see _open_turn): aikyo's leaders before
            # it know no limit, so it counts now, and no later array of theirs replaces it.
            self._accept(turn, states, rank, publisher, now, out)
            turn.closed = True
            return
        if now < self._due(turn, rank):
            if rank not in turn.pending:
                turn.pending[rank] = (states, publisher)
            why = f"{publisher} ranks {rank}: it counts in its slot unless an earlier one does"
            self._deferred(turn, publisher, rank, "slot_not_due", why, out)
            return
        self._accept(turn, states, rank, publisher, now, out, closes=quiet, quiet=quiet)

    def _offer_closing(
        self,
        turn: _Turn,
        states: list[State],
        rank: int,
        publisher: str | None,
        now: float,
        out: list[Effect],
    ) -> None:
        """A ``terminal`` array after an array counted: from the leader whose array counted (or a
        bystander's view) it ends the turn at once; from a later candidate only once every slot
        passed here (held until then), so nobody can cut off a speaker still in its slot."""
        if not turn.order and turn.closing == "terminal":
            reason = "the conversation already ended here"
            self._log(out, "states_ignored", publisher=publisher, message_id=turn.message_id, reason=reason)
        elif self.bystander or rank <= turn.priority or turn.unanswered_at is not None:
            self._accept(turn, states, rank, publisher, now, out, closes=True)
        else:
            if turn.held_closing is None or rank < turn.held_closing[2]:
                turn.held_closing = (states, publisher, rank)
            why = f"{publisher} closes the conversation; it counts once every speaking slot passed here"
            self._deferred(turn, publisher, rank, "turn_not_over", why, out)

    def _deferred(
        self, turn: _Turn, publisher: str | None, rank: int, reason: str, why: str, out: list[Effect]
    ) -> None:
        self._log(
            out,
            "states_deferred",
            "warning",
            publisher=publisher,
            message_id=turn.message_id,
            rank=rank,
            reason=reason,
            why=why,
        )

    def _accept(
        self,
        turn: _Turn,
        states: list[State],
        rank: int,
        publisher: str | None,
        now: float,
        out: list[Effect],
        *,
        closes: bool = False,
        quiet: bool = False,
    ) -> None:
        """``states`` count for ``turn`` (``closes``: it is a closing array, see :meth:`_unanswered`;
        ``quiet``: the sender's quiet closing, see :meth:`_close_quietly`).

        The stage is raised to this node's floor. Where the floor alone reaches ``terminal`` (the
        array does not), the conversation is over for this companion only: cards' limits differ,
        so the others may go on. It gives its slot up (a ``terminal`` yield) but keeps following
        the turn, so a turn nobody answers still finds it to close the conversation for everyone.
        A bystander has the companions' shared limit, if any, and reports the end by it."""
        first = turn.states is None
        if first:
            turn.accepted_at = now
        turn.states, turn.priority = states, rank
        turn.unanswered_at = turn.closing_at = turn.held_closing = None
        turn.closed = closes
        for dropped in [r for r in turn.pending if r >= rank]:
            del turn.pending[dropped]
        speaking: SpeakingOrder = speaking_order(states)
        decision = speaking.first
        floor = self._floor(turn)
        closing = later(decision.closing, floor.stage)
        ended = decision.conversation_over or decision.closing == "terminal"
        floor_ends = closing == "terminal" and not ended
        over = ended or (floor_ends and self.bystander)
        why = decision.why
        if quiet:
            why = (
                f"{turn.message.params.from_} addressed its reply to nobody who can answer "
                "(only people): the conversation ends here"
            )
        elif closes:
            why = (
                f"{publisher or 'a leader'} closed the conversation: nobody answered the message "
                "(every speaker gave its slot up or stayed silent)"
            )
        elif closing != decision.closing:
            why += f"; closing raised to {closing} ({floor.why})"
            if floor_ends and not self.bystander:
                why += ": this companion gives its slot up"
        turn.closing = closing
        turn.order = () if over else speaking.order
        turn.slot_opens = [turn.accepted_at + k * self.reply_timeout for k in range(len(turn.order))]
        turn.ends = turn.accepted_at + len(turn.order) * self.reply_timeout
        turn.slot = -1
        self._log(
            out,
            "speaker_chosen",
            message_id=turn.message_id,
            turn=turn.replies,
            speaker=None if over else decision.speaker,
            reason="terminal" if over else decision.reason,
            why=why,
            closing=closing,
            order=list(turn.order),
            source=publisher,
        )
        if turn.phase is Phase.LEADING and not turn.lead_done:
            out.append(Withdraw(turn.message_id, "lead", "another leader's array counted first"))
        if floor_ends and self.me is not None and self.me in speaking.order and self.me not in turn.yielded:
            # The array gives this node a slot its own floor forbids: the others need not wait for it.
            turn.yielded[self.me] = "terminal"
            out.append(PublishSignal(YIELD_SIGNAL, {"in_reply_to": turn.message_id, "reason": "terminal"}))
        if not turn.order:
            if turn.phase is Phase.SPEAKING:
                self._withdraw_speech(turn, publisher, "the accepted array ends the turn", out)
            if turn.phase not in (Phase.DONE, Phase.REPLIED):
                self._goto(turn, Phase.DONE)
            if over:
                self._log(
                    out,
                    "conversation_over",
                    message_id=turn.message_id,
                    turn=turn.replies,
                    closing="terminal",
                    reason="quiet" if quiet else "unanswered" if closes else "terminal",
                )
            return
        if turn.phase in (Phase.AWAITING_STATES, Phase.LEADING, Phase.DONE):
            self._goto(turn, Phase.AWAITING_SPEAKER)
        elif turn.phase is Phase.SPEAKING:
            slot = self._slot_at(turn, now)
            if slot >= len(turn.order) or turn.order[slot] != self.me or self.me in turn.yielded:
                reason = (
                    "this companion's own closing floor ends the conversation"
                    if self.me in turn.yielded
                    else "the earlier leader's array gives this slot to another companion"
                )
                self._withdraw_speech(turn, publisher, reason, out)
                self._goto(turn, Phase.AWAITING_SPEAKER)

    def _withdraw_speech(self, turn: _Turn, by: str | None, reason: str, out: list[Effect]) -> None:
        out.append(Withdraw(turn.message_id, "speech", reason))
        self._log(out, "speech_withdrawn", message_id=turn.message_id, by=by, reason=reason)

    # --- speaking ------------------------------------------------------------------------------

    def _slot_at(self, turn: _Turn, now: float) -> int:
        """The open slot at ``now`` (``len(order)``: every slot has passed)."""
        if now >= turn.ends:
            return len(turn.order)
        slot = 0
        while slot + 1 < len(turn.order) and turn.slot_opens[slot + 1] <= now:
            slot += 1
        return slot

    def _rebase(self, turn: _Turn, after: int, now: float) -> None:
        """Slot ``after`` is given up: the next one opens now, the later ones a reply deadline apart."""
        for j in range(after + 1, len(turn.order)):
            turn.slot_opens[j] = min(turn.slot_opens[j], now + (j - after - 1) * self.reply_timeout)
        last = turn.slot_opens[-1] + self.reply_timeout if after + 1 < len(turn.order) else now
        turn.ends = min(turn.ends, last)

    def _on_time(self, now: float, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None:
            return
        if turn.states is None:
            ready = [r for r in sorted(turn.pending) if self._due(turn, r) <= now]
            if ready:
                states, publisher = turn.pending.pop(ready[0])
                self._accept(turn, list(states), ready[0], publisher, now, out)
            elif (
                turn.phase is Phase.AWAITING_STATES
                and turn.rank
                and now >= turn.opened_at + self._lead_slot(turn, turn.rank) * self.takeover_after
            ):
                wait = self._lead_slot(turn, turn.rank) * self.takeover_after
                self._log(
                    out,
                    "takeover",
                    "warning",
                    message_id=turn.message_id,
                    rank=turn.rank,
                    reason="no_states",
                    why=f"no states within {wait:g} s from {', '.join(turn.plan.order[: turn.rank])}",
                )
                self._lead(turn, out)
        if turn.closing_at is not None and now >= turn.closing_at:
            self._publish_closing(turn, out)
        if (
            turn.states is None
            or self.bystander
            or turn.phase not in (Phase.AWAITING_SPEAKER, Phase.SPEAKING)
        ):
            return
        slot = self._slot_at(turn, now)
        # issue 33 hook: a slot given up, or a stand-in's slot of an aikyo companion (they speak
        # only as an array's top speaker), opens the next one at once (rules.slot_can_be_filled)
        skipped: list[str] = []
        while slot < len(turn.order) and not slot_can_be_filled(
            turn.order, slot, gave_up=turn.yielded, slotless=self.slotless
        ):
            if turn.order[slot] not in turn.yielded:
                skipped.append(turn.order[slot])
            self._rebase(turn, slot, now)
            slot = self._slot_at(turn, now)
        if skipped:
            self._log(
                out,
                "slots_skipped",
                message_id=turn.message_id,
                skipped=skipped,
                reason="slotless",
                why="these slots belong to companions that do not follow slots (aikyo's speak "
                "only as an array's top speaker): nobody will answer in them",
            )
        if slot != turn.slot:
            previous = turn.order[turn.slot] if 0 <= turn.slot < len(turn.order) else None
            if previous is not None and previous not in turn.yielded and slot < len(turn.order):
                self._log(
                    out,
                    "speaker_silent",
                    "warning",
                    message_id=turn.message_id,
                    silent=previous,
                    speaker=turn.order[slot],
                    slot=slot,
                    why=f"no reply within {self.reply_timeout:g} s; next in the speaking order",
                )
            turn.slot = slot
        if turn.phase is Phase.SPEAKING and (slot >= len(turn.order) or turn.order[slot] != self.me):
            # Its speaking deadline keeps a speaker inside its slot; should the slot end first,
            # the next speaker must not find it still speaking.
            self._withdraw_speech(turn, None, "this node's speaking slot ended", out)
            turn.yielded[self.me or ""] = "slot_ended"
            self._goto(turn, Phase.AWAITING_SPEAKER)
        if slot >= len(turn.order):
            self._unanswered(turn, now, out)
            return
        if turn.order[slot] == self.me and turn.phase is Phase.AWAITING_SPEAKER:
            self._goto(turn, Phase.SPEAKING)
            out.append(PublishSignal(THINKING_SIGNAL, {"in_reply_to": turn.message_id}))
            out.append(self._speak_effect(turn))

    def _speak_effect(self, turn: _Turn) -> Speak:
        assert self.me is not None
        message = turn.message
        recipients = tuple(reply_recipients(message, self.me, self.present))
        people = tuple(self.people)
        fallback = tuple(cid for cid in dict.fromkeys([message.params.from_, *people]) if cid != self.me)
        return Speak(
            turn.message_id,
            message,
            turn.closing,
            turn.replies + 1,
            recipients,
            fallback or recipients,
            people,
        )

    def _unanswered(self, turn: _Turn, now: float, out: list[Effect]) -> None:
        """Every slot of the order passed without a reply: nobody will ever answer this message,
        so the conversation would neither go on nor end. It ends, visibly and the same for all.

        Why end rather than hand the turn back: every addressed companion was in the order (the
        stand-ins are all of them), and each gave its slot up (its model failed, its own limit
        ended the conversation) or stayed silent (it is gone). The sender just spoke; asking it
        to answer its own message would be a monologue, and with a failing provider it fails
        too. People expect a conversation that fell silent to say so and to be over: then
        anyone may open a new one (a person's message always does).

        So the leader whose array counted publishes a *closing array* (every addressee listens,
        ``terminal``, tagged for the message; aikyo reads it as any terminal array) at once; if
        it is gone, the next candidate in the takeover order one leader slot later, and so on.
        Every node and the bystander accept it (:meth:`_offer_closing`) and log
        ``conversation_over`` with reason ``unanswered``."""
        gave_up = _gave_up(turn)
        self._log(
            out,
            "turn_unanswered",
            "warning",
            message_id=turn.message_id,
            order=list(turn.order),
            gave_up=gave_up,
            reason="every candidate stayed silent or gave up",
        )
        self._goto(turn, Phase.DONE)
        turn.unanswered_at = now
        if turn.held_closing is not None:
            states, publisher, rank = turn.held_closing
            self._accept(turn, states, rank, publisher, now, out, closes=True)
        elif turn.rank is not None:
            # one leader slot per candidate before this one, from the leader whose array counted,
            # that will close it: aikyo's never publish a closing array, so they take no slot
            n = len(turn.plan.order)
            ahead = [turn.plan.order[(turn.priority + j) % n] for j in range((turn.rank - turn.priority) % n)]
            k = sum(1 for cid in ahead if not self.slotless(cid))
            turn.closing_at = now + k * self.takeover_after
            if k == 0:
                self._publish_closing(turn, out)

    def _publish_closing(self, turn: _Turn, out: list[Effect]) -> None:
        turn.closing_at = None
        if turn.closed:
            return
        gave_up = ", ".join(f"{cid} ({why})" for cid, why in _gave_up(turn).items())
        self._log(
            out,
            "states_published",
            message_id=turn.message_id,
            rank=turn.rank,
            source="unanswered",
            stage="terminal",
            reason="unanswered",
            why=f"nobody answered the message: {gave_up}; the conversation ends here",
        )
        assert self.me is not None  # a bystander never closes: it never sees a turn unanswered
        states = closing_states(turn.addressed, turn.message, self.me)
        out.append(PublishStates(turn.message_id, states))

    def _on_replied(self, event: ReplyPublished, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None or turn.message_id != event.message_id or turn.phase is not Phase.SPEAKING:
            return
        self._goto(turn, Phase.REPLIED)
        p = event.reply.params
        self._log(
            out,
            "replied",
            message_id=turn.message_id,
            reply_id=p.id,
            to=list(p.to),
            turn=turn.replies + 1,
            closing=turn.closing,
        )

    def _on_failed(self, event: SpeakingFailed, now: float, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None or turn.message_id != event.message_id or turn.phase is not Phase.SPEAKING:
            return
        assert self.me is not None
        slot = turn.order.index(self.me)
        turn.yielded[self.me] = event.reason
        nxt = next((cid for cid in turn.order[slot + 1 :] if cid not in turn.yielded), None)
        self._log(
            out,
            "speaker_failed",
            "warning",
            message_id=turn.message_id,
            reason=event.reason,
            detail=event.detail[:300],
            next=nxt,
            why=f"could not reply ({event.reason}); gave the slot up to {nxt or 'nobody'} at once",
        )
        params = {"in_reply_to": turn.message_id, "reason": event.reason}
        if event.detail:
            params["detail"] = event.detail[:MAX_DETAIL]  # clients show it (listen, the page, the demo)
        out.append(PublishSignal(YIELD_SIGNAL, params))
        self._goto(turn, Phase.AWAITING_SPEAKER)
        self._rebase(turn, slot, now)

    def _on_yield(self, event: YieldSeen, now: float, out: list[Effect]) -> None:
        turn = self.turn
        fields = {"message_id": event.in_reply_to, "yielder": event.companion, "publisher": event.publisher}
        if event.publisher != event.companion and not (event.publisher is None and self.bystander):
            self._log(out, "yield_ignored", "info", reason="signed by another companion", **fields)
        elif turn is not None and turn.message_id == event.in_reply_to:
            self._yield(turn, event.companion, event.reason, now, out, fields)
        elif not self.thread.knows(event.in_reply_to):
            # Its message (gossip keeps no order) is still on the way: the yield waits for it.
            held = self._early_yields.pop(event.in_reply_to, {})
            held.setdefault(event.companion, event.reason)
            _latest(self._early_yields, event.in_reply_to, held, 64)
            self._log(out, "yield_held", "debug", reason="its message has not arrived", **fields)
        else:
            self._log(out, "yield_ignored", "info", reason="not the current turn", **fields)

    def _yield(
        self, turn: _Turn, companion: str, reason: str, now: float, out: list[Effect], fields: dict[str, Any]
    ) -> None:
        """``companion`` gives up its slot of ``turn`` (also before the array is known: it is then
        skipped when its slot comes)."""
        if companion in turn.yielded:
            self._log(out, "yield_ignored", "debug", reason="duplicate", **fields)
            return
        slot: int | None = None
        if turn.states is not None:
            if companion not in turn.order:
                self._log(out, "yield_ignored", "info", reason="not in the speaking order", **fields)
                return
            slot = turn.order.index(companion)
            if turn.slot >= 0 and slot < turn.slot:
                self._log(out, "yield_ignored", "info", reason="its slot has passed", **fields)
                return
        turn.yielded[companion] = reason
        self._log(
            out,
            "speaker_yielded",
            "warning",
            slot=slot,
            reason=reason,
            why=f"{companion} gave its slot up ({reason}); the next in the speaking order goes at once",
            **fields,
        )
        if slot is not None and slot <= max(turn.slot, 0) and not self.bystander:
            self._rebase(turn, slot, now)

    def _on_thinking(self, event: ThinkingSeen, now: float, out: list[Effect]) -> None:
        """``companion`` is preparing its reply: its slot stays open a reply deadline from now."""
        turn = self.turn
        if (
            self.bystander
            or turn is None
            or turn.message_id != event.in_reply_to
            or turn.states is None
            or event.publisher != event.companion
            or event.companion not in turn.order
            or event.companion == self.me
        ):
            return
        slot = turn.order.index(event.companion)
        current = self._slot_at(turn, now)
        if slot < current:
            self._log(out, "thinking_late", "warning", message_id=turn.message_id, speaker=event.companion)
            return
        if slot > current and turn.phase is Phase.SPEAKING:
            # Its node saw this node's slot pass: the later speaker goes on, this one withdraws.
            self._withdraw_speech(turn, event.companion, "a later speaker is already preparing", out)
            turn.yielded[self.me or ""] = "gave_way"
            self._goto(turn, Phase.AWAITING_SPEAKER)
        for j in range(current + 1, slot + 1):
            turn.slot_opens[j] = min(turn.slot_opens[j], now)  # the slots before it are over
        end = now + self.reply_timeout
        for j in range(slot + 1, len(turn.order)):
            turn.slot_opens[j] = max(turn.slot_opens[j], end + (j - slot - 1) * self.reply_timeout)
        turn.ends = max(turn.ends, end + (len(turn.order) - slot - 1) * self.reply_timeout)
        self._log(
            out, "speaker_thinking", "debug", message_id=turn.message_id, speaker=event.companion, slot=slot
        )


def opens_exchange(info: TurnInfo) -> bool:
    """Whether a companion's message opens a new exchange rather than continuing the thread: it
    answers nothing and says ``turn: 0`` (a routine speaking first, a client or tool speaking with
    a companion id). Replies always carry ``in_reply_to``; aikyo's carry no ``turn`` and continue."""
    return info.stamped and info.turn == 0 and info.in_reply_to is None


def _latest(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """Put ``key`` last (the most recent), dropping the oldest entries beyond ``limit``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        table.popitem(last=False)


def _gave_up(turn: _Turn) -> dict[str, str]:
    """Each companion of the speaking order and why it did not answer (a yield reason, or
    ``silent`` when it never said)."""
    return {cid: turn.yielded.get(cid, "silent") for cid in turn.order}


def _state_summary(state: State) -> dict[str, Any]:
    p = state.params
    return {
        "from": p.from_,
        "state": p.state,
        "importance": p.importance,
        "selected": p.selected,
        "closing": p.closing,
    }


def present_diff(present: Collection[str], now: Iterable[str]) -> list[CompanionJoined | CompanionLeft]:
    """The join and leave events that take a machine's ``present`` set to ``now``."""
    current = set(now)
    joined: list[CompanionJoined | CompanionLeft] = [
        CompanionJoined(c) for c in sorted(current - set(present))
    ]
    return joined + [CompanionLeft(c) for c in sorted(set(present) - current)]
