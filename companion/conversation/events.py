"""The vocabulary of the conversation machine: the events it is fed and the effects it returns.

The machine (:mod:`companion.conversation.machine`) takes one :data:`Event` at a time with the
current time and answers with a list of :data:`Effect`; its driver (:mod:`companion.engine.driver`)
turns network payloads into events and carries the effects out. Everything here is a plain value:
frozen, comparable, printable in a test.

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

Both are accepted only when the publisher's authenticated companion id is the ``from``.
:func:`parse_signal` is the one reader of both, for the machine, the transcript and the
clients alike: a signal is network input, bounded here once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args

from companion.conversation.rules import StateDecision, TurnInfo, turn_info
from companion.protocol import COMPANION_ID_PREFIX, Action, ClosingStage, Message, State

__all__ = [
    "MAX_DETAIL",
    "MAX_SIGNAL_ID",
    "THINKING_SIGNAL",
    "YIELD_REASONS",
    "YIELD_SIGNAL",
    "CompanionJoined",
    "CompanionLeft",
    "Decision",
    "DropAhead",
    "Effect",
    "Event",
    "Lead",
    "LeadAhead",
    "Level",
    "MessagePreviewed",
    "MessageSeen",
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
    "Withdraw",
    "YieldSeen",
    "effect_table",
    "parse_signal",
    "present_diff",
    "read_signal",
]

YIELD_SIGNAL: Final = "companion.yield"
THINKING_SIGNAL: Final = "companion.thinking"
YIELD_REASONS: Final = ("model_error", "timeout", "crashed", "no_reply", "stopping", "terminal")
MAX_DETAIL: Final = 200
"""Longest ``detail`` a yield carries (the model error's reason, for people to read)."""
MAX_SIGNAL_ID: Final = 200
"""Longest ``in_reply_to`` a signal may name (a longer one names no message: dropped)."""
_MAX_REASON: Final = 64
_MAX_SHOWN_DETAIL: Final = 4 * MAX_DETAIL
"""What a parsed yield keeps of its ``detail``: enough for a client to show ``MAX_DETAIL``
characters once control characters are folded away, and no more."""
_T = TypeVar("_T")

Level: TypeAlias = Literal["debug", "info", "warning", "error"]


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageSeen:
    """A ``message.send`` arrived (this node's own come back too: the transport echoes them)."""

    message: Message
    publisher: str | None = None
    """The authenticated companion id of its publisher, if it proved one."""
    replayed: bool = False
    """Read back from the store at start-up: it moves the thread but opens no turn."""
    info: TurnInfo = field(init=False, repr=False, compare=False)
    """The message's turn extensions, read once here for everyone who asks."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "info", turn_info(self.message))


@dataclass(frozen=True, slots=True)
class MessagePreviewed:
    """A speaker's ``message.send`` arrived early on :data:`~companion.protocol.PREVIEWS`: its
    text is complete and still being voiced. Nothing of the conversation moves until the message
    itself arrives; only the next turn's model work may start, held (see
    :mod:`companion.conversation.preview`)."""

    message: Message
    publisher: str | None = None
    """The authenticated companion id of its publisher (a preview counts only from its ``from``)."""


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
    """This node's reply to ``message_id`` goes out now (stamped by :meth:`Conversation.outgoing`,
    its mark committed): fed just before the publish, so the turn is REPLIED while it leaves."""

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
    """A ``companion.yield`` signal arrived (:func:`read_signal`)."""

    in_reply_to: str
    companion: str
    reason: str
    publisher: str | None = None
    detail: str = ""
    """Why, in words (network input, cut at four times :data:`MAX_DETAIL` characters: show it
    bounded)."""


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
    | MessagePreviewed
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
    real one asks for the same reply. ``ahead``: from a message only previewed
    (:mod:`.preview`), whose line is still being voiced, so a model server that answers one
    request at a time is idle now."""

    speak: Speak
    ahead: bool = False


@dataclass(frozen=True, slots=True)
class LeadAhead:
    """Ask the model for the states of a message only previewed (:class:`MessagePreviewed`): the
    answer is held by the driver and given for the :class:`Lead` of the same message only when
    that asks the model the same; nothing is published from it before."""

    lead: Lead


@dataclass(frozen=True, slots=True)
class DropAhead:
    """The work started for a previewed message (a :class:`LeadAhead`, a :class:`Prepare`) is
    cancelled: the message differed from its preview, or did not come in time."""

    message_id: str
    reason: str


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


Effect: TypeAlias = (
    Lead | LeadAhead | DropAhead | PublishStates | Speak | Prepare | Withdraw | PublishSignal | Decision
)


def effect_table(table: Mapping[type[Any], _T]) -> Mapping[type[Any], _T]:
    """``table`` (a driver's: how it carries out each effect), checked to have an entry for every
    :data:`Effect` type and for nothing else. A new effect without its entry fails where the
    table is built, at the driver's import, rather than being dropped at run time."""
    kinds = set(get_args(Effect))
    missing, extra = kinds - set(table), set(table) - kinds
    if missing or extra:
        names = ", ".join(sorted(k.__name__ for k in missing | extra))
        raise TypeError(f"the table of effects must name every effect type and no other; wrong: {names}")
    return MappingProxyType(dict(table))


def parse_signal(speaker: str, name: str, params: Mapping[str, Any]) -> YieldSeen | ThinkingSeen | None:
    """The yield or thinking signal in an action's ``name`` and ``params`` from ``speaker``, or
    ``None`` (another action, not from a companion, or lacking what a signal must carry: dropped).
    The publisher is the caller's to fill in."""
    if name not in (YIELD_SIGNAL, THINKING_SIGNAL) or not speaker.startswith(COMPANION_ID_PREFIX):
        return None
    in_reply_to = params.get("in_reply_to")
    if not isinstance(in_reply_to, str) or not 0 < len(in_reply_to) <= MAX_SIGNAL_ID:
        return None
    if name == THINKING_SIGNAL:
        return ThinkingSeen(in_reply_to, speaker)
    reason, detail = params.get("reason"), params.get("detail")
    if not isinstance(reason, str):
        return None
    kept = detail[:_MAX_SHOWN_DETAIL] if isinstance(detail, str) else ""
    return YieldSeen(in_reply_to, speaker, reason[:_MAX_REASON], detail=kept)


def read_signal(action: Action) -> YieldSeen | ThinkingSeen | None:
    """:func:`parse_signal` of an ``action.send``."""
    p = action.params
    return parse_signal(p.from_, p.name, p.params)


def present_diff(present: Collection[str], now: Iterable[str]) -> list[CompanionJoined | CompanionLeft]:
    """The join and leave events that take a machine's ``present`` set to ``now``."""
    current = set(now)
    joined: list[CompanionJoined | CompanionLeft] = [
        CompanionJoined(c) for c in sorted(current - set(present))
    ]
    return joined + [CompanionLeft(c) for c in sorted(set(present) - current)]
