"""Who is present: peer id <-> companion id <-> metadata, and who may speak as whom.

Pure and synchronous over a :class:`~companion.trust.TrustStore` (the lasting bindings): the
node feeds it connection changes and metadata answers, and asks it whether the signer of a
payload may use the ``from`` id it claims, and whether it may answer a query. Every change
comes back as :class:`MembershipEvent` values so the caller decides how to log or forward them.

Binding rules (trust on first use, see :mod:`companion.trust`):

- A companion id is pinned to the first peer that proves it (over the metadata protocol, or
  through :meth:`Membership.pin` from any other authenticated source). The pin is lasting (in
  the data directory): another key claiming the id is refused ``id_pinned``, whether or not the
  owner is connected, and the owner is always let back in. Only an operator moves a pin.
- Our own companion id is bound to our own peer forever.
- A peer pinned to a companion speaks only as that companion, connected or not (a relayed
  message, or one sent while it reconnects). A peer pinned to no companion (a bridge relaying
  clients) may use any id that is not pinned to another peer.
- Presence (the directory) is separate: a companion is present while the peer that proved
  its id over a connection stays connected.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from .protocol import Metadata
from .trust import PinRefused, TrustStore, is_companion_id

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
    """Why: ``metadata`` (proved over the metadata protocol), ``replaced`` (the peer now claims
    another id), ``rekeyed`` (an operator moved the id to another key, which proved it),
    ``disconnected``."""


RefusalReason = Literal["not_connected", "id_pinned", "pin_store_full", "not_a_companion_id", "our_own_id"]


@dataclass(frozen=True, slots=True)
class BindRefused:
    """A claim that was not accepted; the peer stays unbound. ``owner``: the peer the id is
    pinned to, for ``id_pinned`` and ``our_own_id``."""

    peer_id: str
    companion_id: str
    reason: RefusalReason
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
    """The companion directory of one node and the sender rules derived from it.

    ``trust`` holds the lasting pins and the allowed answerers; nodes of one process share one
    store (in memory when not given)."""

    def __init__(
        self, self_peer: str, self_metadata: Metadata | None, trust: TrustStore | None = None
    ) -> None:
        self._self_peer = self_peer
        self._self_id = self_metadata.id if self_metadata is not None else None
        self.trust = trust if trust is not None else TrustStore()
        self._connected: set[str] = set()
        self._companion_of: dict[str, str] = {}
        """peer id -> companion id, for connected peers that proved it (and ourselves)."""
        self._peer_of: dict[str, str] = {}
        """The reverse: companion id -> the peer it is present through."""
        self._present: dict[str, Metadata] = {}
        self.directory: Mapping[str, Metadata] = DirectoryView(self._present)
        if self_metadata is not None:
            self.trust.hold(self_metadata.id, self_peer, "local")
            self._companion_of[self_peer] = self_metadata.id
            self._peer_of[self_metadata.id] = self_peer
            self._present[self_metadata.id] = self_metadata

    @property
    def self_peer(self) -> str:
        return self._self_peer

    def owner_of(self, companion_id: str) -> str | None:
        """The peer a companion id is pinned to (present or not), if any."""
        if companion_id == self._self_id:
            return self._self_peer
        pin = self.trust.pin_of(companion_id)
        return pin.peer_id if pin is not None else None

    def companion_of(self, peer_id: str) -> str | None:
        """The companion id ``peer_id`` speaks as: the one it proved on its connection, else
        the one pinned to it (a companion relayed through others, or reconnecting)."""
        present = self._companion_of.get(peer_id)
        if present is not None:
            return present
        ids = self._ids_of(peer_id)
        return next(iter(ids)) if len(ids) == 1 else None

    def is_connected(self, peer_id: str) -> bool:
        return peer_id in self._connected

    def peer_connected(self, peer_id: str) -> None:
        """The first connection to ``peer_id`` is up (metadata may follow)."""
        if peer_id != self._self_peer:
            self._connected.add(peer_id)

    def peer_disconnected(self, peer_id: str) -> list[MembershipEvent]:
        """The last connection to ``peer_id`` closed: its companion leaves (its pin stays)."""
        self._connected.discard(peer_id)
        if peer_id == self._self_peer:
            return []
        return self._leave(peer_id, "disconnected")

    def _leave(self, peer_id: str, reason: str) -> list[MembershipEvent]:
        companion_id = self._companion_of.pop(peer_id, None)
        if companion_id is None:
            return []
        del self._peer_of[companion_id]
        metadata = self._present.pop(companion_id)
        return [MembershipEvent("left", companion_id, peer_id, metadata, reason)]

    def pin(self, peer_id: str, companion_id: str) -> BindRefused | None:
        """``peer_id`` proved ``companion_id`` through an authenticated source (the metadata
        protocol on a connection, or a signed announcement relayed by others): pin it on first
        use. ``None`` if the peer holds the id now, else why not. Presence is not changed."""
        if not is_companion_id(companion_id):
            return BindRefused(peer_id, companion_id, "not_a_companion_id")
        if companion_id == self._self_id and peer_id != self._self_peer:
            return BindRefused(peer_id, companion_id, "our_own_id", self._self_peer)
        outcome = self.trust.claim(companion_id, peer_id)
        if isinstance(outcome, PinRefused):
            return BindRefused(peer_id, companion_id, outcome.reason, outcome.owner)
        return None

    def bind(self, peer_id: str, metadata: Metadata) -> list[MembershipEvent] | BindRefused:
        """``peer_id`` answered the metadata protocol with ``metadata`` on a connection."""
        cid = metadata.id
        if not is_companion_id(cid):
            return BindRefused(peer_id, cid, "not_a_companion_id")
        if peer_id not in self._connected:
            return BindRefused(peer_id, cid, "not_connected")
        refused = self.pin(peer_id, cid)
        if refused is not None:
            return refused

        events: list[MembershipEvent] = []
        previous = self._companion_of.get(peer_id)
        if previous == cid:
            if self._present[cid] != metadata:
                self._present[cid] = metadata
                events.append(MembershipEvent("updated", cid, peer_id, metadata, "metadata"))
            return events
        if previous is not None:
            events.extend(self._leave(peer_id, "replaced"))
        holder = self._peer_of.get(cid)
        if holder is not None:  # the pin moved to this peer (an operator re-keyed the id)
            events.extend(self._leave(holder, "rekeyed"))
        self._companion_of[peer_id] = cid
        self._peer_of[cid] = peer_id
        self._present[cid] = metadata
        events.append(MembershipEvent("joined", cid, peer_id, metadata, "metadata"))
        return events

    def _ids_of(self, peer_id: str) -> frozenset[str]:
        """Every companion id ``peer_id`` may speak as (its pins; our own id for ourselves)."""
        if peer_id == self._self_peer:
            return frozenset({self._self_id}) if self._self_id is not None else frozenset()
        return self.trust.ids_of(peer_id)

    def check_sender(self, peer_id: str, claimed: str) -> str | None:
        """Why the signer ``peer_id`` may not send as ``claimed``, or ``None`` if it may."""
        owner = self.owner_of(claimed)
        if owner is not None and owner != peer_id:
            return f"{claimed!r} is pinned to peer {owner}"
        own = self._ids_of(peer_id)
        if own and claimed not in own:
            return f"peer of {min(own)!r} sent as {claimed!r}"
        return None

    def check_states_sender(self, peer_id: str, senders: Iterable[str]) -> str | None:
        """A ``states`` array is published by the leader for every addressed companion, itself
        included: a pinned peer's array must contain its own companion (whether the peer is
        connected to us or relayed by others); a peer pinned to no companion may not speak for
        companions pinned to other peers."""
        ids = list(senders)
        if not ids:
            return None
        own = self._ids_of(peer_id)
        if own:
            return None if own.intersection(ids) else f"peer of {min(own)!r} sent states without its own"
        for claimed in ids:
            owner = self.owner_of(claimed)
            if owner is not None and owner != peer_id:
                return f"unpinned peer sent states for {claimed!r}, pinned to peer {owner}"
        return None

    def may_answer(self, peer_id: str, query_type: str) -> bool:
        """Whether a result signed by ``peer_id`` may settle a query of ``query_type`` this node
        asked: itself, approvers for anything, answerers for anything but approvals."""
        return peer_id == self._self_peer or self.trust.may_answer(peer_id, query_type)
