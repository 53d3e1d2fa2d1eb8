"""Who is present: peer id <-> companion id <-> metadata, and who may speak as whom.

Pure and synchronous over a :class:`~companion.node.trust.TrustStore` (the lasting bindings): the
node feeds it connection changes and metadata answers, and asks it whether the signer of a
payload may use the ``from`` id it claims, and whether it may answer a query. Every change
comes back as :class:`MembershipEvent` values so the caller decides how to log or forward them.

Binding rules (trust on first use, see :mod:`companion.node.trust`):

- A companion id is pinned to the first peer that proves it (over the metadata protocol, or
  through :meth:`Membership.pin` from any other authenticated source). The pin is lasting (in
  the data directory): another key claiming the id is refused ``id_pinned``, whether or not the
  owner is connected, and the owner is always let back in. Only an operator moves a pin.
- Our own companion id is bound to our own peer forever.
- A peer pinned to a companion speaks only as that companion, connected or not (a relayed
  message, or one sent while it reconnects). A peer pinned to no companion (a bridge relaying
  clients) may use any id that is not pinned to another peer.
- Presence (the directory) is separate from pins: a companion is present while the peer that
  proved its id over a connection stays connected (a *binding*, as in aikyo), **or** while its
  latest signed presence announcement, relayed by anyone, has not expired (see
  :mod:`companion.node.announcements`). An announcement is checked against the pins like any claim (an
  id pinned to another key is refused ``id_pinned``) and pins the id on first use; a peer bound
  to one id over a connection may not announce another (``id_mismatch``). The directory's
  metadata is the binding's while there is one, else the announcement's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from companion.node.announcements import (
    DISCONNECT_GRACE,
    NewcomerBudget,
    PresenceChange,
    PresenceRefusal,
    PresenceTable,
)
from companion.node.trust import PinRefused, TrustStore, is_companion_id
from companion.protocol import Metadata, Presence

__all__ = ["AnnounceRefused", "BindRefused", "DirectoryView", "Membership", "MembershipEvent"]

EventKind = Literal["joined", "left", "updated"]


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """A companion joined, left, or changed its metadata."""

    kind: EventKind
    companion_id: str
    peer_id: str
    metadata: Metadata
    reason: str
    """Why: ``metadata`` (proved over the metadata protocol), ``announced`` (a presence
    announcement), ``replaced`` (the peer now claims another id), ``rekeyed`` (an operator moved
    the id to another key, which proved it), ``disconnected``, ``expired`` (its announcement's
    time to live passed), ``leaving`` (it announced an orderly stop)."""


RefusalReason = Literal["not_connected", "id_pinned", "pin_store_full", "not_a_companion_id", "our_own_id"]


@dataclass(frozen=True, slots=True)
class BindRefused:
    """A claim that was not accepted; the peer stays unbound. ``owner``: the peer the id is
    pinned to, for ``id_pinned`` and ``our_own_id``."""

    peer_id: str
    companion_id: str
    reason: RefusalReason
    owner: str | None = None


AnnounceRefusalReason = Literal[
    PresenceRefusal,
    "id_pinned",
    "pin_store_full",
    "not_a_companion_id",
    "our_own_id",
    "id_mismatch",
    "newcomer_limit",
]


@dataclass(frozen=True, slots=True)
class AnnounceRefused:
    """A presence announcement that was not taken; ``owner`` as in :class:`BindRefused`. The
    reasons are drop labels: ``stale`` (a sequence number not above the last one: a replay or an
    overtaken copy), ``too_old``, ``presence_full``, ``newcomer_limit`` (too many new ids at
    once, see :class:`~companion.node.announcements.NewcomerBudget`), ``id_mismatch`` (the peer proved
    another id on its connection), and the pin refusals of :class:`BindRefused`."""

    peer_id: str
    companion_id: str
    reason: AnnounceRefusalReason
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
        self,
        self_peer: str,
        self_metadata: Metadata | None,
        trust: TrustStore | None = None,
        *,
        presence: PresenceTable | None = None,
        newcomers: NewcomerBudget | None = None,
    ) -> None:
        self._self_peer = self_peer
        self._self_id = self_metadata.id if self_metadata is not None else None
        self.trust = trust if trust is not None else TrustStore()
        self.presence = presence if presence is not None else PresenceTable()
        self._newcomers = newcomers if newcomers is not None else NewcomerBudget()
        self._connected: set[str] = set()
        self._companion_of: dict[str, str] = {}
        """peer id -> companion id, for connected peers that proved it (and ourselves)."""
        self._peer_of: dict[str, str] = {}
        """The reverse: companion id -> the peer it is bound through."""
        self._bound: dict[str, Metadata] = {}
        """companion id -> the metadata its peer proved on a connection (and ourselves)."""
        self._present: dict[str, Metadata] = {}
        """The directory: bound or announced."""
        self.directory: Mapping[str, Metadata] = DirectoryView(self._present)
        if self_metadata is not None:
            self.trust.hold(self_metadata.id, self_peer, "local")
            self._companion_of[self_peer] = self_metadata.id
            self._peer_of[self_metadata.id] = self_peer
            self._bound[self_metadata.id] = self_metadata
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
        """The first connection to ``peer_id`` is up (metadata may follow); an announcement
        suspected since its last connection closed gets its deadline back."""
        if peer_id != self._self_peer:
            self._connected.add(peer_id)
            self.presence.reconnected(peer_id)

    def bound_peers(self) -> frozenset[str]:
        """Connected peers that proved a companion id over the metadata protocol."""
        return frozenset(p for p in self._companion_of if p != self._self_peer)

    def announcing_peers(self) -> frozenset[str]:
        """Peers whose presence announcement holds now, connected or not."""
        return frozenset(entry.peer_id for entry in self.presence)

    def peer_disconnected(
        self, peer_id: str, *, now: float | None = None, on_purpose: bool = False
    ) -> list[MembershipEvent]:
        """The last connection to ``peer_id`` closed: its binding ends (its pin stays). With
        ``now`` and not ``on_purpose`` (a trim by either side), its presence announcement must
        be renewed within :data:`~companion.node.announcements.DISCONNECT_GRACE` (a killed peer is not);
        without ``now`` presence is left alone."""
        self._connected.discard(peer_id)
        if peer_id == self._self_peer:
            return []
        if now is not None and not on_purpose:
            self.presence.suspect(peer_id, now + DISCONNECT_GRACE)
        return self._leave(peer_id, "disconnected")

    def peer_leaving(self, peer_id: str, seq: int, *, now: float) -> list[MembershipEvent]:
        """Connected ``peer_id`` said it is stopping, with its ``leaving`` announcement ``seq``
        (a leave notice on its own connection, as good as its signature): its announcement
        goes as that one would take it (:meth:`PresenceTable.leave`); its binding ends when
        the connection closes."""
        return self._apply(self.presence.leave(peer_id, seq, now))

    def _leave(self, peer_id: str, reason: str) -> list[MembershipEvent]:
        companion_id = self._companion_of.pop(peer_id, None)
        if companion_id is None:
            return []
        del self._peer_of[companion_id]
        del self._bound[companion_id]
        return self._settle(companion_id, peer_id, reason)

    def _settle(self, companion_id: str, peer_id: str, reason: str) -> list[MembershipEvent]:
        """Bring the directory entry of ``companion_id`` in line with its binding and its
        announcement; the events that makes (a join, a leave, an update, or none)."""
        announced = self.presence.get(companion_id)
        metadata = self._bound.get(companion_id) or (announced.metadata if announced else None)
        old = self._present.get(companion_id)
        if metadata is None:
            if old is None:
                return []
            del self._present[companion_id]
            return [MembershipEvent("left", companion_id, peer_id, old, reason)]
        self._present[companion_id] = metadata
        if old is None:
            return [MembershipEvent("joined", companion_id, peer_id, metadata, reason)]
        if old != metadata:
            return [MembershipEvent("updated", companion_id, peer_id, metadata, reason)]
        return []

    def _apply(self, changes: list[PresenceChange]) -> list[MembershipEvent]:
        events: list[MembershipEvent] = []
        for change in changes:
            events += self._settle(change.entry.companion_id, change.entry.peer_id, change.reason)
        return events

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
            self._bound[cid] = metadata
            return self._settle(cid, peer_id, "metadata")
        if previous is not None:
            events.extend(self._leave(peer_id, "replaced"))
        holder = self._peer_of.get(cid)
        if holder is not None:  # the pin moved to this peer (an operator re-keyed the id)
            events.extend(self._leave(holder, "rekeyed"))
        stale = self.presence.get(cid)
        if stale is not None and stale.peer_id != peer_id:  # announced by the id's old key
            events.extend(self._apply(self.presence.remove(stale.peer_id, "replaced")))
        self._companion_of[peer_id] = cid
        self._peer_of[cid] = peer_id
        self._bound[cid] = metadata
        return events + self._settle(cid, peer_id, "metadata")

    # --- presence announcements -------------------------------------------------------------------

    def announce(
        self, peer_id: str, presence: Presence, *, now: float, wall: float
    ) -> list[MembershipEvent] | AnnounceRefused:
        """``peer_id`` signed ``presence`` (relayed by anyone): the events it makes, or why it
        was refused. ``now`` is a monotonic clock (deadlines), ``wall`` seconds since the epoch
        (the age of ``seq``). Our own announcements change nothing."""
        cid = presence.params.metadata.id
        if peer_id == self._self_peer:
            return []
        bound = self._companion_of.get(peer_id)
        if bound is not None and bound != cid:
            return AnnounceRefused(peer_id, cid, "id_mismatch")
        refusal = self.presence.screen(peer_id, presence, now=now, wall=wall)
        if refusal is not None:
            return AnnounceRefused(peer_id, cid, refusal)
        events: list[MembershipEvent] = []
        if presence.params.leaving:  # nothing to pin; the peer's own entry (if any) goes
            owner = self.owner_of(cid)
            if owner is not None and owner != peer_id:
                return AnnounceRefused(peer_id, cid, "id_pinned", owner)
        else:
            if self.owner_of(cid) != peer_id and is_companion_id(cid) and not self._newcomers.take(now):
                return AnnounceRefused(peer_id, cid, "newcomer_limit")
            refused = self.pin(peer_id, cid)
            if refused is not None:
                assert refused.reason != "not_connected"  # pin() needs no connection
                return AnnounceRefused(peer_id, cid, refused.reason, refused.owner)
            holder = self._peer_of.get(cid)
            if holder is not None and holder != peer_id:  # bound through the id's old key
                events += self._leave(holder, "rekeyed")
        events += self._apply(self.presence.record(peer_id, presence, now=now))
        self._suspect_lost(peer_id, presence, now)
        return events

    def _suspect_lost(self, claimer: str, presence: Presence, now: float) -> None:
        """``claimer`` lost the connections to the peers in ``lost``: each of them (unless it is
        connected to us, or we heard from it since the claimer last did) must be heard again
        within the grace. A false claim costs the claimed peer one announcement (it refutes it,
        see :mod:`companion.node.presence`); it cannot remove a live, reachable companion."""
        for peer, last_seq in presence.params.lost.items():
            if peer in (claimer, self._self_peer) or peer in self._connected:
                continue
            entry = self.presence.of_peer(peer)
            if entry is not None and entry.seq <= last_seq:
                self.presence.suspect(peer, now + DISCONNECT_GRACE)

    def expire(self, now: float) -> list[MembershipEvent]:
        """Announcements whose time to live passed: those companions leave unless bound."""
        return self._apply(self.presence.expire(now))

    def presence_deadline(self) -> float | None:
        """When the next announcement expires (call :meth:`expire` then)."""
        return self.presence.deadline()

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
