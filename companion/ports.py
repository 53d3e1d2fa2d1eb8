"""The seams between the conversation core and the world, with the semantics both sides rely on.

The engine (:mod:`companion.engine.driver`) and the action runtime see the network, the directory and
the disk only through these. The libp2p node, :class:`companion.memory.MemoryHub` and the
SQLite :class:`companion.store.sqlite.Store` implement them; tests implement them with plain objects.

**The echo rule** (one for every transport): a node receives its own publications back as
:class:`Inbound` payloads, through the same edge as everyone else's (parsed, authenticated,
deduplicated by the node), in no particular order with other payloads. gossipsub does this by
itself and :class:`~companion.memory.MemoryHub` delivers to every endpoint, the publisher
included. The engine relies on it: this node's reply and states array count when they come
back, exactly as a peer's do, and the history records each message once, when it arrives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from companion.protocol import Action, Envelope, Message, Metadata, Payload, State

__all__ = [
    "ConversationStore",
    "Directory",
    "Inbound",
    "NodeLike",
    "OutgoingHook",
    "Publisher",
]


@dataclass(frozen=True, slots=True)
class Inbound:
    """One payload that passed the edge: parsed, with the peer that signed it."""

    topic: str
    payload: Payload
    sender_peer: str
    """The authenticated origin (libp2p peer id, base58), or the endpoint name in memory."""
    raw: bytes = b""
    """The bytes as they arrived (the bridge forwards these to clients unchanged)."""


class Publisher(Protocol):
    """Publishes one envelope (or the states array) on a topic. Fire and forget, like gossipsub:
    returning means handed to the network, not delivered. What it publishes comes back to this
    node as an :class:`Inbound` (the echo rule above)."""

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None: ...


class Directory(Protocol):
    """Who the companions are, as this node can tell.

    ``companions`` is a live read-only mapping of the companions present now (this node's own
    included), companion id -> metadata. ``companion_of`` names the companion a peer proved to
    be (over the metadata protocol), or ``None``: the authenticated author of a payload, which
    its ``from`` field only claims. A companion once present is *known*: the engine remembers
    every id it ever saw here in its store, across restarts, and only known companions lead.
    ``CompanionNode`` provides both (``directory`` and ``membership.companion_of``).
    """

    @property
    def companions(self) -> Mapping[str, Metadata]: ...

    def companion_of(self, peer: str) -> str | None: ...


class NodeLike(Publisher, Protocol):
    """What wiring an engine to a node needs from it: a publisher with a live ``directory``
    (``CompanionNode`` is one; it also has ``membership.companion_of``)."""

    @property
    def directory(self) -> Mapping[str, Metadata]: ...


class ConversationStore(Protocol):
    """What the engine keeps on disk (:class:`~companion.store.sqlite.Store`) or in memory
    (:class:`~companion.store.sqlite.MemoryStore`). Every call but :meth:`flush` is short and
    synchronous; a call that raises changed nothing, and the engine then leaves its conversation
    as it was. Writes reach the disk a little later, in order (:meth:`flush` waits for them)."""

    @property
    def writes(self) -> int:
        """How many writes were made so far: a mark for :meth:`flush`'s ``since``."""
        ...

    async def flush(self, timeout: float, *, since: int = 0) -> bool:
        """Wait, without blocking the loop, until every write so far is committed: ``True``, or
        ``False`` if one after the first ``since`` (a :attr:`writes` mark) was lost to a failing
        disk or ``timeout`` seconds passed. In memory: ``True`` at once."""
        ...

    def record(self, message: Message) -> bool:
        """Record a message of the conversation, once: ``False`` if its id was recorded before
        (a duplicate, e.g. gossip replaying it after a restart)."""
        ...

    def recent(self, limit: int) -> list[Message]:
        """The last ``limit`` recorded messages, oldest first."""
        ...

    def mark_replied(self, message_id: str) -> bool:
        """Note, before the reply goes out, that this companion answered ``message_id`` (the
        engine flushes the mark before it publishes the reply)."""
        ...

    def replied(self, message_id: str) -> bool: ...

    def replied_ids(self) -> list[str]:
        """Every message this companion is noted to have answered, oldest first: read back into
        the conversation machine at start, which then knows them (it never answers one twice)."""
        ...

    def remember_companion(self, companion_id: str) -> None:
        """Note a companion id this node saw present (it stays known)."""
        ...

    def known_companions(self) -> list[str]: ...

    def memory(self) -> dict[str, Any]:
        """The working memory the speaker's model sees, by key."""
        ...


OutgoingHook: TypeAlias = Callable[[str, Message | Action], Awaitable["Message | Action | str"]]
"""``async (topic, envelope) -> envelope | refusal``: the action runtime awaits it for every
envelope an action produced, before publishing it. It returns the envelope to publish (possibly
stamped), or a sentence saying why it may not go out (the call then ends ``refused`` with that
message). It may wait (the engine waits for its store to commit the reply's mark)."""
