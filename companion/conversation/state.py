"""What the conversation machine knows between two events, and the queries over it.

:class:`MachineState` holds one node's view of the conversation (the thread, who is present and
known, the current turn, who said what, which companions follow speaking slots) and answers the
questions its driver and its rules ask of it. The rules that change it live in
:mod:`companion.conversation.arrays` (which array counts), :mod:`companion.conversation.slots`
(the speaking slots: replies, failures, signals) and :mod:`companion.conversation.machine` (the
table of handlers, messages, leading and time).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from companion.conversation.events import Decision, Effect, Level, Withdraw
from companion.conversation.rules import (
    DEFAULT_REPETITION_THRESHOLD,
    REPETITION_WINDOW,
    ClosingDecision,
    ConversationThread,
    EarlyStates,
    TurnInfo,
    closing_floor,
    leader_slot,
    leading_floor,
    stamp_reply,
    turn_info,
)
from companion.conversation.rules.closing import DEFAULT_MIN_REPLIES, farewell_counts
from companion.conversation.turn import TRANSITIONS, Phase, TransitionError, Turn
from companion.lines.farewell import takes_leave
from companion.protocol import COMPANION_ID_PREFIX, ClosingStage, Message, State

__all__ = ["ONE_MESSAGE", "REPLIED_KEPT", "ClosingSettings", "MachineState", "latest", "state_summary"]

ONE_MESSAGE: Final = "you already replied in this turn (one message per turn); finish without speaking again"
"""What the model hears when it tries to say a second thing in one turn."""
_EVIDENCE: Final = 1024
"""Companions remembered as following slots, or as aikyo's (each table)."""
REPLIED_KEPT: Final = 10_000
"""Messages remembered as answered by this companion (the store keeps as many across restarts)."""
_PREPARING: Final = frozenset({Phase.AWAITING_STATES, Phase.LEADING, Phase.LED, Phase.SPEAKING})
_OVER: Final = frozenset({Phase.DONE, Phase.REPLIED, Phase.CLOSED})
"""Phases in which nobody speaks in this node's turn any more."""
_ANSWERED: Final = frozenset({Phase.REPLIED, Phase.CLOSED})
"""Phases a turn this node answered may be in (a closing array may overtake its reply's echo)."""


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


class MachineState:
    """What :class:`~companion.conversation.machine.Conversation` knows, with the queries and the
    small steps its rules share (its arguments are the conversation's)."""

    def __init__(
        self,
        me: str | None,
        *,
        takeover_after: float,
        reply_timeout: float,
        settings: ClosingSettings | None = None,
        known: Iterable[str] = (),
        replied: Iterable[str] = (),
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
        self.turn: Turn | None = None
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
        self._early_plain: deque[tuple[list[State], str | None, float, int]] = deque(maxlen=4)
        """Untagged arrays whose message has not come: the array, its publisher, when it came
        and :attr:`_seen` then."""
        self._seen = 0
        """Messages of the conversation seen so far: the order of what came, without a clock."""
        self._said: OrderedDict[str, tuple[int, str]] = OrderedDict()
        """Each companion's last line that names nothing it answers (aikyo's lines): :attr:`_seen`
        when it came, and its id. A line that names what it answers is placed by that."""
        self._follows: OrderedDict[str, None] = OrderedDict()
        """Companions seen following slots: a stamped reply, a tagged array, a signal, a tool list."""
        self._aikyo_like: OrderedDict[str, None] = OrderedDict()
        """Companions seen behaving as aikyo's: an unstamped message or an untagged array of theirs."""
        self._early_yields: OrderedDict[str, dict[str, str]] = OrderedDict()
        """Yields whose message has not arrived yet: message id -> companion -> reason."""
        self._messages: OrderedDict[str, Message] = OrderedDict()
        self._own_line: Message | None = None
        """This companion's last line, until an array ends the conversation there: it opens no
        turn here, so the end is recorded for it apart (:meth:`ArrayRules._ends_own_line`)."""
        self._live = False
        """Whether an array or a signal answered the current message (the others follow this
        thread: :mod:`companion.conversation.repair`)."""
        self._missed: deque[tuple[list[State], str | None]] = deque(maxlen=8)
        """Tagged arrays that came for a message of the thread while no turn was open for it (a
        turn set aside, a stale message): they count if it comes back."""
        self._replied: OrderedDict[str, None] = OrderedDict()
        """Messages this companion answered (read back from the store at start: a node killed as
        its reply left never answers the same message twice)."""
        for message_id in replied:
            latest(self._replied, message_id, None, REPLIED_KEPT)

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
        return self.turn is not None and self.turn.phase not in _OVER

    def slotless(self, companion_id: str) -> bool:
        """Whether ``companion_id`` is known not to follow speaking slots: it behaved as an aikyo
        companion (unstamped messages, untagged arrays) and never as ours. aikyo lets only an
        array's top speaker talk: it never takes a stand-in's slot, nor one given up, and ignores
        yields, so waiting for its slot is waiting a whole reply deadline for nothing. A companion
        not seen yet either way follows slots (waiting for it costs time, not the conversation)."""
        return companion_id in self._aikyo_like and companion_id not in self._follows

    def follows_slots(self, companion_id: str) -> None:
        """``companion_id`` proved it is one of ours (the driver saw its tool list, its signal)."""
        latest(self._follows, companion_id, None, _EVIDENCE)

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
            latest(self._aikyo_like, companion_id, None, _EVIDENCE)

    def belongs(self, message: Message, info: TurnInfo | None = None) -> bool:
        """Whether ``message`` is part of this conversation: it comes from or addresses this
        companion (a bystander: a companion it knows), or answers a message of the thread
        (``info``: its turn extensions, when the caller read them already)."""
        params = message.params
        if self.me is not None:
            involved = params.from_ == self.me or self.me in params.to
        else:
            involved = params.from_ in self.known or any(cid in self.known for cid in params.to)
        if involved:
            return True
        in_reply_to = (info or turn_info(message)).in_reply_to
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
            if turn is not None and turn.phase in _ANSWERED and self.replied(turn.message_id):
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

    @property
    def speaking_to(self) -> str | None:
        """The message this node is preparing its reply to now (``None``: it is not speaking)."""
        turn = self.turn
        return turn.message_id if turn is not None and turn.phase is Phase.SPEAKING else None

    def may_speak_in(self, message: Message) -> bool:
        """Whether a turn of this node runs for ``message``, which addresses this companion and
        is not its own: it may be chosen to speak (the driver may prepare early)."""
        turn, p = self.turn, message.params
        return (
            self.me is not None
            and p.from_ != self.me
            and self.me in p.to
            and turn is not None
            and turn.message_id == p.id
            and self.in_turn
        )

    @property
    def prepared_for(self) -> str | None:
        """The message a reply prepared early (:class:`~companion.conversation.events.Prepare`)
        may still be this node's for: its turn awaits the array, leads, or speaks."""
        turn = self.turn
        return turn.message_id if turn is not None and turn.phase in _PREPARING else None

    def replied(self, message_id: str) -> bool:
        """Whether this companion answered ``message_id`` (in this run or, per the store, before)."""
        return message_id in self._replied

    def _goto(self, turn: Turn, phase: Phase) -> None:
        if phase not in TRANSITIONS[turn.phase]:
            raise TransitionError(f"turn {turn.message_id}: {turn.phase.name} -> {phase.name} is not allowed")
        turn.phase = phase

    @staticmethod
    def _log(out: list[Effect], event: str, level: Level = "info", **fields: Any) -> None:
        out.append(Decision(event, fields, level))

    def _lead_slot(self, turn: Turn, rank: int) -> int:
        """issue 33 hook: aikyo's candidates after the first take no leader slot (rules.leader_slot)."""
        return leader_slot(turn.plan.order, rank, self.slotless)

    def _due(self, turn: Turn, rank: int) -> float:
        return turn.due(self._lead_slot(turn, rank), self.takeover_after)

    def _finishing(self, answered: str | None) -> frozenset[str]:
        """The aikyo companion that said the message ``answered`` (the one a turn's message
        answers): aikyo's agent is still making its last model call then and ignores every
        states array (:func:`~companion.conversation.rules.held_back`)."""
        said = self._messages.get(answered) if answered is not None else None
        who = None if said is None else said.params.from_
        return frozenset([who]) if who is not None and self.slotless(who) else frozenset()

    def _floor(self, turn: Turn) -> ClosingDecision:
        return closing_floor(
            previous=turn.previous,
            turn=turn.replies,
            utterances=list(self._utterances),
            threshold=self.settings.repetition_threshold,
            max_turns=self.settings.max_turns,
            farewell=self._farewell(turn),
        )

    def _farewell(self, turn: Turn) -> bool:
        """Whether ``turn``'s message took leave in a way that begins closing
        (:func:`~companion.conversation.rules.closing.farewell_counts`). Every node reads the same
        message and count, so every node's floor agrees."""
        params = turn.message.params
        return farewell_counts(params.from_, turn.replies, self.settings.min_replies) and takes_leave(
            params.message
        )

    def _array_floor(self, turn: Turn, own: ClosingDecision | None = None) -> ClosingDecision:
        """The floor of the array this node publishes leading ``turn``
        (:func:`~companion.conversation.rules.leading_floor`): its own (``own``, when the caller
        has it), unless another companion of ours is addressed to close the conversation and no
        aikyo companion is (aikyo's know no limit: one reply more may be theirs, past every
        limit)."""
        floor = self._floor(turn) if own is None else own
        others = [cid for cid in turn.addressed if cid != self.me]
        if not others or any(self.slotless(cid) for cid in others):
            return floor
        return leading_floor(floor, turn.previous, turn=turn.replies, max_turns=self.settings.max_turns)

    def _first_follower(self, turn: Turn, rank: int) -> bool:
        """Whether every leader candidate ranked before ``rank`` is aikyo's (:meth:`slotless`):
        the candidate at ``rank`` is then the first that applies our turn limits."""
        return all(self.slotless(cid) for cid in turn.plan.order[:rank])

    def _withdraw_speech(self, turn: Turn, by: str | None, reason: str, out: list[Effect]) -> None:
        out.append(Withdraw(turn.message_id, "speech", reason))
        self._log(out, "speech_withdrawn", message_id=turn.message_id, by=by, reason=reason)


def latest(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """Put ``key`` last (the most recent), dropping the oldest entries beyond ``limit``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > limit:
        table.popitem(last=False)


def state_summary(state: State) -> dict[str, Any]:
    """One state of an array, as a decision's field."""
    p = state.params
    return {
        "from": p.from_,
        "state": p.state,
        "importance": p.importance,
        "selected": p.selected,
        "closing": p.closing,
    }
