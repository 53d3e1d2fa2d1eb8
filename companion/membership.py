"""Who is present: peer id <-> companion id <-> metadata, and who may speak as whom.

Pure and synchronous: the node feeds it connection changes and metadata answers, and asks it
whether the signer of a payload may use the ``from`` id it claims. Every change comes back as
:class:`MembershipEvent` values so the caller decides how to log or forward them.

Binding rules (trust on first use):

- A companion id is bound to the first connected peer that claims it over the metadata protocol.
  The binding outlives the connection, so a disconnected companion's id cannot be taken over
  by a signer of another key; it moves only when another peer claims the id over the metadata
  protocol while the previous owner is not connected (a companion restarted with a new key).
- Our own companion id is bound to our own peer forever.
- A peer that is bound to a companion speaks only as that companion. A peer bound to no
  companion (a bridge relaying clients, or a companion we are not connected to) may use
  any id that is not bound to another peer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from .protocol import COMPANION_ID_PREFIX, Metadata

__all__ = ["BindRefused", "DirectoryView", "Membership", "MembershipEvent"]

EventKind = Literal["joined", "left", "updated"]


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """A companion joined, left, or changed its metadata."""

    kind: EventKind
    companion_id: str
    peer_id: str
    metadata: Metadata
    reason: str
    """Why: ``metadata`` (proved over the metadata protocol), ``rebound`` (took over an id whose
    previous owner is gone), ``replaced`` (the peer now claims another id), ``disconnected``."""


@dataclass(frozen=True, slots=True)
class BindRefused:
    """A metadata claim that was not accepted; the peer stays unbound."""

    peer_id: str
    companion_id: str
    reason: Literal["not_connected", "id_taken", "not_a_companion_id", "our_own_id"]
    owner: str | None = None


class DirectoryView(Mapping[str, Metadata]):
    """A live read-only view: companion id -> metadata of the companions present now."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Metadata]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Metadata:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"DirectoryView({sorted(self._data)})"


class Membership:
    """The companion directory of one node and the sender rules derived from it."""

    def __init__(self, self_peer: str, self_metadata: Metadata | None) -> None:
        self._self_peer = self_peer
        self._connected: set[str] = set()
        self._owner: dict[str, str] = {}
        """companion id -> peer id (sticky: kept after the peer disconnects)."""
        self._companion_of: dict[str, str] = {}
        """peer id -> companion id, for connected, bound peers only."""
        self._present: dict[str, Metadata] = {}
        self.directory: Mapping[str, Metadata] = DirectoryView(self._present)
        if self_metadata is not None:
            self._owner[self_metadata.id] = self_peer
            self._companion_of[self_peer] = self_metadata.id
            self._present[self_metadata.id] = self_metadata

    @property
    def self_peer(self) -> str:
        return self._self_peer

    def owner_of(self, companion_id: str) -> str | None:
        """The peer a companion id is bound to (present or not), if any."""
        return self._owner.get(companion_id)

    def companion_of(self, peer_id: str) -> str | None:
        """The companion id of a connected peer (or of ourselves), if it proved one."""
        return self._companion_of.get(peer_id)

    def is_connected(self, peer_id: str) -> bool:
        return peer_id in self._connected

    def peer_connected(self, peer_id: str) -> None:
        """The first connection to ``peer_id`` is up (metadata may follow)."""
        if peer_id != self._self_peer:
            self._connected.add(peer_id)

    def peer_disconnected(self, peer_id: str) -> list[MembershipEvent]:
        """The last connection to ``peer_id`` closed: its companion leaves (its binding stays)."""
        self._connected.discard(peer_id)
        if peer_id == self._self_peer:
            return []
        companion_id = self._companion_of.pop(peer_id, None)
        if companion_id is None:
            return []
        metadata = self._present.pop(companion_id)
        return [MembershipEvent("left", companion_id, peer_id, metadata, "disconnected")]

    def bind(self, peer_id: str, metadata: Metadata) -> list[MembershipEvent] | BindRefused:
        """``peer_id`` answered the metadata protocol with ``metadata``."""
        cid = metadata.id
        if not cid.startswith(COMPANION_ID_PREFIX):
            return BindRefused(peer_id, cid, "not_a_companion_id")
        if peer_id not in self._connected:
            return BindRefused(peer_id, cid, "not_connected")
        owner = self._owner.get(cid)
        if owner == self._self_peer:
            return BindRefused(peer_id, cid, "our_own_id", owner)
        if owner is not None and owner != peer_id and owner in self._connected:
            return BindRefused(peer_id, cid, "id_taken", owner)

        events: list[MembershipEvent] = []
        previous = self._companion_of.get(peer_id)
        if previous is not None and previous != cid:
            old = self._present.pop(previous)
            del self._owner[previous]
            events.append(MembershipEvent("left", previous, peer_id, old, "replaced"))
        if previous == cid:
            if self._present[cid] != metadata:
                self._present[cid] = metadata
                events.append(MembershipEvent("updated", cid, peer_id, metadata, "metadata"))
            return events
        reason = "rebound" if owner is not None and owner != peer_id else "metadata"
        if owner is not None and owner != peer_id:
            self._companion_of.pop(owner, None)
        self._owner[cid] = peer_id
        self._companion_of[peer_id] = cid
        self._present[cid] = metadata
        events.append(MembershipEvent("joined", cid, peer_id, metadata, reason))
        return events

    def check_sender(self, peer_id: str, claimed: str) -> str | None:
        """Why the signer ``peer_id`` may not send as ``claimed``, or ``None`` if it may."""
        owner = self._owner.get(claimed)
        if owner is not None and owner != peer_id:
            return f"{claimed!r} is bound to peer {owner}"
        own = self._companion_of.get(peer_id)
        if own is not None and own != claimed:
            return f"peer of {own!r} sent as {claimed!r}"
        return None

    def check_states_sender(self, peer_id: str, senders: Iterable[str]) -> str | None:
        """A ``states`` array is published by the leader for every addressed companion, itself
        included: a bound peer's array must contain its own companion; an unbound peer may not
        speak for companions bound to other peers."""
        ids = list(senders)
        if not ids:
            return None
        own = self._companion_of.get(peer_id)
        if own is not None:
            return None if own in ids else f"peer of {own!r} sent states without its own"
        for claimed in ids:
            owner = self._owner.get(claimed)
            if owner is not None and owner != peer_id:
                return f"unbound peer sent states for {claimed!r}, bound to peer {owner}"
        return None
