"""The thread: which message a conversation is at, and the turn extensions messages carry.

Gossip keeps no order across messages, and one network carries many conversations at once.
:class:`ConversationThread` follows one of them: a message that belongs to it (the caller
decides: it addresses this companion, or answers a message of the thread) and answers the
current message moves it on, as does one that answers nothing (a person speaking). A reply to a
message the thread already left is stale; a message whose reply came first is overtaken. A
message that does not belong never moves the thread: it is only noted if it answers something,
so a message of ours that another conversation already answered opens no turn.

Extensions travel in a Message's ``params.metadata`` (aikyo keeps unknown metadata keys and
ignores them); the keys are the ``META_*`` constants:

- ``next_speaker`` (str): the sender nominates the companion that should speak next; the leader
  marks that companion ``selected`` (and nobody else), so the next-speaker rule picks it.
- ``in_reply_to`` (str): the id of the message this reply answers.
- ``turn`` (int): how many companion replies the conversation has had, this one included.
- ``closing`` (str): the closing stage of the state that chose this speaker; the next leader
  advances it (pre-closing -> closing -> terminal), so a closing conversation always ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Literal, TypeAlias

from companion.conversation.rules.closing import closing_stage
from companion.protocol import ClosingStage, Message

__all__ = [
    "META_CLOSING",
    "META_IN_REPLY_TO",
    "META_NEXT_SPEAKER",
    "META_TURN",
    "ConversationThread",
    "Placement",
    "TurnInfo",
    "stamp_opening",
    "stamp_reply",
    "turn_info",
]

META_NEXT_SPEAKER: Final = "next_speaker"
META_IN_REPLY_TO: Final = "in_reply_to"
META_TURN: Final = "turn"
META_CLOSING: Final = "closing"


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """The turn-taking extensions a message carries (defaults for messages without them)."""

    turn: int = 0
    closing: ClosingStage = "none"
    nominated: str | None = None
    in_reply_to: str | None = None
    stamped: bool = False
    """Whether the message carries a ``turn`` count (our nodes stamp their replies, aikyo's do not)."""


def turn_info(message: Message) -> TurnInfo:
    """Read the ``META_*`` keys; a value of the wrong type counts as absent (peers may be sloppy)."""
    meta: Mapping[str, Any] = message.params.metadata or {}
    turn = meta.get(META_TURN)
    closing = meta.get(META_CLOSING)
    nominated = meta.get(META_NEXT_SPEAKER)
    in_reply_to = meta.get(META_IN_REPLY_TO)
    count = turn if isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0 else None
    return TurnInfo(
        turn=count or 0,
        closing=closing_stage(closing),
        nominated=nominated if isinstance(nominated, str) and nominated else None,
        in_reply_to=in_reply_to if isinstance(in_reply_to, str) and in_reply_to else None,
        stamped=count is not None,
    )


def stamp_reply(message: Message, *, in_reply_to: str, turn: int, closing: ClosingStage) -> Message:
    """The reply with its turn extensions added; keys the speaker set itself (emotion,
    ``next_speaker``) are kept."""
    return _with_metadata(message, {META_IN_REPLY_TO: in_reply_to, META_TURN: turn, META_CLOSING: closing})


def stamp_opening(message: Message) -> Message:
    """A companion's message that starts a conversation (a routine's greeting): ``turn: 0`` and
    closing ``none`` tell every node it opens a new exchange, even after one that ended; a message
    that answers something (``in_reply_to``) is left as it is."""
    if (message.params.metadata or {}).get(META_IN_REPLY_TO):
        return message
    return _with_metadata(message, {META_TURN: 0, META_CLOSING: "none"})


def _with_metadata(message: Message, keys: Mapping[str, Any]) -> Message:
    """A copy of ``message`` whose ``params.metadata`` also holds ``keys`` (the others are kept)."""
    meta = {**(message.params.metadata or {}), **keys}
    params = message.params.model_copy(update={"metadata": meta})
    return message.model_copy(update={"params": params})


Placing: TypeAlias = Literal["current", "stale", "overtaken", "outside"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a newly seen message goes in the conversation, and which turn it ends."""

    kind: Placing
    """``current``: the conversation is now at it; ``stale``: a reply that crossed a newer
    message; ``overtaken``: a message whose reply arrived before it; ``outside``: it does not
    belong to this conversation."""
    closes: str | None = None
    """The message whose turn is over now (the previous current one), if any."""


class ConversationThread:
    """Follows which message one conversation is at, whatever order gossip delivers them in.

    A reply to the current message moves the conversation on; a message that is no reply (a
    person speaking) moves it too. A reply to an older message, one the conversation already
    left, is stale: it stays in the history but leads nowhere, so every node keeps following
    the same message. A message whose reply came first is overtaken: if it answers the
    current message, the conversation jumps to the newest reply known in its chain. Every table
    is bounded by ``limit``.
    """

    def __init__(self, current: str | None = None, *, limit: int = 4096) -> None:
        self.current = current
        self._answers: OrderedDict[str, str] = OrderedDict()
        self._known: OrderedDict[str, None] = OrderedDict()
        self._answered_outside: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        if key not in table:
            table[key] = value
            while len(table) > self._limit:
                table.popitem(last=False)

    def _replies_from(self, message_id: str) -> Iterator[str]:
        """``message_id``, then the reply that answered it, and so on, :attr:`_limit` steps at
        most (a reply taken for another's answer can close a cycle)."""
        yield message_id
        for _ in range(self._limit):
            if message_id not in self._answers:
                return
            message_id = self._answers[message_id]
            yield message_id

    def _head(self, message_id: str) -> str:
        *_, head = self._replies_from(message_id)
        return head

    def _leads_to(self, start: str, target: str) -> bool:
        """Whether the replies from ``start`` on lead to ``target``: then ``start`` is no answer
        of ``target`` but one of what it answers (taken for one, the thread went round)."""
        return target in islice(self._replies_from(start), self._limit)

    def knows(self, message_id: str) -> bool:
        """Whether ``message_id`` was placed in this conversation."""
        return message_id in self._known

    def adopt(self, message_id: str) -> str | None:
        """Move the conversation to ``message_id``, a message of it placed before (a stale reply
        whose thread the others followed, see :mod:`companion.conversation.repair`); the
        message it was at."""
        if message_id not in self._known:
            raise ValueError(f"{message_id} was never placed in this conversation")
        previous, self.current = self.current, message_id
        return previous

    def place(
        self,
        message_id: str,
        in_reply_to: str | None,
        *,
        member: bool = True,
        answered_by: str | None = None,
    ) -> Placement:
        """Place one message (each id once; duplicates are the caller's to drop). ``member``:
        whether it belongs to this conversation; one that does not only notes what it answers.
        ``answered_by``: a message placed before that answered this one though it names nothing
        (aikyo's replies name no message; the caller knew it otherwise): as a reply that came
        first."""
        if not member:
            if in_reply_to is not None:
                self._remember(self._answered_outside, in_reply_to, None)
            return Placement("outside")
        previous: str | None = self.current
        self._remember(self._known, message_id, None)
        if in_reply_to is not None:
            self._remember(self._answers, in_reply_to, message_id)
        answer = answered_by if answered_by in self._known else None
        if answer is not None and not self._leads_to(answer, message_id):
            self._remember(self._answers, message_id, answer)
        if message_id in self._answers and self._answers[message_id] != message_id:
            if in_reply_to is not None and in_reply_to == self.current:
                self.current = self._head(message_id)
                return Placement("overtaken", previous)
            return Placement("overtaken")
        if message_id in self._answered_outside:
            return Placement("overtaken")
        if in_reply_to is not None and in_reply_to != self.current and in_reply_to in self._known:
            return Placement("stale")
        self.current = message_id
        return Placement("current", previous)
