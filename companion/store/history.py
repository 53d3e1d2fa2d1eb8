"""The conversation as the engine and the action runtime read it: an append-only list of messages.

:class:`RecentMessages` is what a reader needs; :class:`ConversationHistory` also records.
:class:`InMemoryHistory` serves tests and short-lived nodes, and the SQLite store implements the
same protocol for nodes that remember across runs. :class:`HistoryReader` lends a history to
someone who may read it but not write it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, runtime_checkable

from companion.protocol import Message

__all__ = ["ConversationHistory", "HistoryReader", "InMemoryHistory", "RecentMessages"]


class RecentMessages(Protocol):
    """The messages of a conversation, read only."""

    def recent(self, limit: int) -> list[Message]:
        """The last ``limit`` messages, oldest first (fewer if there are fewer)."""
        ...


@runtime_checkable
class ConversationHistory(RecentMessages, Protocol):
    """Where a node keeps the messages of its conversation, oldest first."""

    def append(self, message: Message) -> None:
        """Record one message. Recording the same message id twice keeps the first copy."""
        ...


class InMemoryHistory:
    """A bounded history in memory.

    Messages are keyed by ``params.id``: a node sees its own messages both when it publishes
    them and when gossip echoes them back, and the conversation must hold them once.
    """

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._messages: OrderedDict[str, Message] = OrderedDict()

    def append(self, message: Message) -> None:
        key = message.params.id
        if key in self._messages:
            return
        self._messages[key] = message
        while len(self._messages) > self._capacity:
            self._messages.popitem(last=False)

    def recent(self, limit: int) -> list[Message]:
        if limit <= 0:
            return []
        items = list(self._messages.values())
        return items[-limit:]

    def __len__(self) -> int:
        return len(self._messages)


class HistoryReader:
    """``source`` read only: what the conversation engine gives the action runtime.

    The engine records every message of the conversation once, when it arrives (this node's own
    when the transport echoes them, see :mod:`companion.ports`). A reader has no ``append``, so
    it is no :class:`ConversationHistory` and the runtime, handed one, records nothing itself.
    """

    def __init__(self, source: RecentMessages) -> None:
        self._source = source

    def recent(self, limit: int) -> list[Message]:
        return self._source.recent(limit)
