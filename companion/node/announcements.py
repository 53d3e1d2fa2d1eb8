"""Presence beyond direct connections: signed announcements with deadlines, as pure bookkeeping.

A companion is in aikyo's directory only while directly connected, which forces a full mesh.
Here each companion node also publishes a *presence announcement* on a gossipsub topic of its
own (:data:`PRESENCE_TOPIC`; aikyo nodes do not subscribe to it, so it costs them nothing):
its metadata, a sequence number, a time to live, and ``leaving`` on an orderly stop. Gossipsub
signs it (strict signing) and relays it through any path, so every node learns every companion
while holding a few connections.

This module keeps the announcements a node has heard and says when each expires; it does no
I/O and reads no clock (the caller passes ``now``, a monotonic time, and ``wall``, seconds since
the Unix epoch). Who may announce which id (pins) is :class:`~companion.node.membership.Membership`'s
job; the trio loop that publishes and receives is :mod:`companion.node.presence`.

Rules:

- **Sequence.** ``seq`` is the sender's wall clock in milliseconds, strictly increasing per
  sender (a restarted node continues above its previous run). An announcement whose ``seq`` is
  the last one heard from that peer is a ``replay`` (or a copy that arrived twice), one below
  it is ``stale`` (an old one replayed, or overtaken on another path). The last ``seq`` is
  remembered for :data:`MEMORY_AGE` after the entry went (for a bounded number of peers), and
  an announcement older than that by the receiver's clock is ``too_old``: a captured
  announcement cannot be replayed later to bring a companion back.
- **Deadline.** An entry lasts ``ttl`` seconds from when it was heard; a refresh extends it,
  ``leaving`` ends it at once. :meth:`PresenceTable.deadline` says when the next one expires.
- **Disconnects.** When the direct connection to an announcing peer closes without notice (it
  was killed, or a health check gave up on it), its entry is *suspected*: it lasts at most
  :data:`DISCONNECT_GRACE` more seconds unless a newer announcement arrives or the peer
  connects again (a Noise-authenticated connection proves it alive as well). The node also
  announces itself at once, listing the peer in ``lost`` with the last ``seq`` it heard from it,
  so every other node suspects it too (unless it heard something newer from it, or is connected
  to it). A live peer hears that claim and refutes it by announcing itself; a killed one cannot,
  and leaves every directory within about the grace, whatever the refresh interval (the
  suspicion and refutation of SWIM-style membership). A connection trimmed on purpose (by
  either side, which says so first: :mod:`companion.node.topology`) changes nothing. The
  ``ttl`` remains the bound when no neighbour reports a loss.
- **Bounds.** At most ``capacity`` entries (new peers are refused ``presence_full`` beyond it,
  the present ones keep refreshing) and ``memory`` remembered sequence numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final, Literal, TypeAlias

from companion.protocol import Metadata, Presence

__all__ = [
    "CAPACITY",
    "DEFAULT_INTERVAL",
    "DEFAULT_TTL",
    "DISCONNECT_GRACE",
    "MEMORY",
    "MEMORY_AGE",
    "PRESENCE_TOPIC",
    "Announced",
    "NewcomerBudget",
    "PresenceChange",
    "PresenceRefusal",
    "PresenceTable",
]

PRESENCE_TOPIC: Final = "companion-presence/1"
"""The gossipsub topic of presence announcements: not one of aikyo's four (``messages``,
``states``, ``queries``, ``actions``) and with a character no aikyo topic has, so it cannot
clash; the version lets a later format live beside this one."""

DEFAULT_INTERVAL: Final = 100.0
"""Seconds between a node's announcements (each wait jittered to 75-100 % of it). What the
refresh still does once losses are reported (``lost``) and stops announced (``leaving``): repair
an announcement a node missed, and bound how long a companion stays listed when no neighbour
saw it go. Every announcement costs every node CPU (gossipsub delivers it once per mesh peer:
~9 ms of a core per announcement per node), and the whole network's announcements reach every
node, so the interval is long: idle nodes (``scripts/bench_presence.py``) spent, per node,
0.23 % of a core at 10 nodes (``--idle 60``) and 0.64 % at 30 (``--idle 100``) with an
interval of 60 s, 0.38 % at 30 with 100 s, and 0.11-0.13 % with presence off. Neighbours, not
the refresh, notice a companion that goes (leave notices, ``lost`` reports)."""
DEFAULT_TTL: Final = 300
"""Seconds an announcement lasts (the most :data:`~companion.protocol.PRESENCE_MAX_TTL` allows):
three intervals, so two lost announcements in a row do not
make a live companion leave (soft state as in OSPF hellos or PIM: a dead interval of 3-4
hello intervals)."""
DISCONNECT_GRACE: Final = 5.0
"""Seconds a peer whose connection closed without notice has to be heard again (a live one
announces itself within ``min_gap`` of losing a connection; then it travels a few hops)."""
CAPACITY: Final = 512
MEMORY: Final = 4096
MEMORY_AGE: Final = 3600.0
"""Seconds a peer's last sequence number is remembered after its entry went, and the oldest
announcement (by its ``seq`` clock) accepted at all: clocks may disagree by up to this much."""

PresenceRefusal: TypeAlias = Literal["replay", "stale", "too_old", "presence_full"]
ChangeReason: TypeAlias = Literal["announced", "leaving", "expired", "replaced", "disconnected"]


@dataclass(frozen=True, slots=True)
class Announced:
    """The latest announcement heard from one peer."""

    companion_id: str
    peer_id: str
    metadata: Metadata
    seq: int
    heard: float
    """When it arrived (the caller's monotonic clock)."""
    expires: float


@dataclass(frozen=True, slots=True)
class PresenceChange:
    """An entry appeared (``added``), changed its metadata (``updated``) or went (``removed``);
    ``entry`` is the new one, or the one that went."""

    kind: Literal["added", "updated", "removed"]
    entry: Announced
    reason: ChangeReason


class PresenceTable:
    """The announcements heard, one per peer, with their deadlines and the sequence memory."""

    def __init__(
        self, *, capacity: int = CAPACITY, memory: int = MEMORY, memory_age: float = MEMORY_AGE
    ) -> None:
        if capacity < 1 or memory < capacity:
            raise ValueError(
                f"capacity must be at least 1 and memory at least capacity ({capacity}, {memory})"
            )
        self.capacity = capacity
        self.memory = memory
        self.memory_age = memory_age
        self._by_peer: dict[str, Announced] = {}
        self._by_id: dict[str, Announced] = {}
        self._seqs: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """peer -> (last seq heard, when): least recently heard first."""
        self._suspected: dict[str, float] = {}
        """peer -> the deadline its entry had before its connection closed without notice."""

    # --- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_peer)

    def __iter__(self) -> Iterator[Announced]:
        return iter(list(self._by_peer.values()))

    def get(self, companion_id: str) -> Announced | None:
        return self._by_id.get(companion_id)

    def of_peer(self, peer_id: str) -> Announced | None:
        return self._by_peer.get(peer_id)

    def deadline(self) -> float | None:
        """When the next entry expires (``None``: none held)."""
        return min((e.expires for e in self._by_peer.values()), default=None)

    # --- an announcement arrives ----------------------------------------------------------------

    def screen(self, peer_id: str, presence: Presence, *, now: float, wall: float) -> PresenceRefusal | None:
        """Why the table would refuse this announcement, or ``None``; changes nothing."""
        seq = presence.params.seq
        last = self._last_seq(peer_id, now)
        if last is not None and seq <= last:
            return "replay" if seq == last else "stale"
        if seq < (wall - self.memory_age) * 1000:
            return "too_old"
        if (
            not presence.params.leaving
            and peer_id not in self._by_peer
            and len(self._by_peer) >= self.capacity
        ):
            return "presence_full"
        return None

    def record(self, peer_id: str, presence: Presence, *, now: float) -> list[PresenceChange]:
        """Take an announcement :meth:`screen` let through (the signer may use the id)."""
        params = presence.params
        self._remember(peer_id, params.seq, now)
        old = self._by_peer.get(peer_id)
        if params.leaving:
            return self._drop(peer_id, "leaving") if old is not None else []
        changes: list[PresenceChange] = []
        if old is not None and old.companion_id != params.metadata.id:
            changes += self._drop(peer_id, "replaced")  # the peer now announces another id
            old = None
        new = Announced(params.metadata.id, peer_id, params.metadata, params.seq, now, now + params.ttl)
        previous = self._by_id.get(new.companion_id)
        if previous is not None and previous.peer_id != peer_id:
            changes += self._drop(previous.peer_id, "replaced")  # its pin moved to this peer
        self._by_peer[peer_id] = self._by_id[new.companion_id] = new
        self._suspected.pop(peer_id, None)
        if old is None:
            changes.append(PresenceChange("added", new, "announced"))
        elif old.metadata != new.metadata:
            changes.append(PresenceChange("updated", new, "announced"))
        return changes

    # --- time and connections -------------------------------------------------------------------

    def expire(self, now: float) -> list[PresenceChange]:
        """Remove every entry whose deadline passed."""
        changes: list[PresenceChange] = []
        for entry in [e for e in self._by_peer.values() if e.expires <= now]:
            changes += self._drop(entry.peer_id, "expired")
        return changes

    def suspect(self, peer_id: str, until: float) -> None:
        """``peer_id``'s entry lasts at most until ``until`` unless it is heard again."""
        entry = self._by_peer.get(peer_id)
        if entry is not None and entry.expires > until:
            self._suspected.setdefault(peer_id, entry.expires)
            self._set_expiry(entry, until)

    def reconnected(self, peer_id: str) -> None:
        """``peer_id`` connected again: a suspected entry gets its deadline back."""
        deadline = self._suspected.pop(peer_id, None)
        entry = self._by_peer.get(peer_id)
        if deadline is not None and entry is not None:
            self._set_expiry(entry, deadline)

    def _set_expiry(self, entry: Announced, expires: float) -> None:
        changed = replace(entry, expires=expires)
        self._by_peer[entry.peer_id] = self._by_id[entry.companion_id] = changed

    def leave(self, peer_id: str, seq: int, now: float) -> list[PresenceChange]:
        """``peer_id`` said over its own connection that it leaves, with announcement ``seq`` (a
        leave notice): taken as that ``leaving`` announcement would be, whether or not gossip
        brings it, so an older announcement still on its way is ``stale`` when it comes. An
        entry newer than ``seq`` (the peer is back already) stays."""
        last = self._last_seq(peer_id, now)
        if last is None or seq > last:
            self._remember(peer_id, seq, now)
        entry = self._by_peer.get(peer_id)
        return self._drop(peer_id, "leaving") if entry is not None and entry.seq <= seq else []

    def heard(self, peer_id: str, seq: int, now: float) -> bool:
        """Whether an announcement of ``peer_id`` numbered ``seq`` or later arrived."""
        last = self._last_seq(peer_id, now)
        return last is not None and last >= seq

    def remove(self, peer_id: str, reason: ChangeReason) -> list[PresenceChange]:
        """Forget ``peer_id``'s entry (its sequence number stays remembered)."""
        return self._drop(peer_id, reason) if peer_id in self._by_peer else []

    # --- internals ------------------------------------------------------------------------------

    def _drop(self, peer_id: str, reason: ChangeReason) -> list[PresenceChange]:
        entry = self._by_peer.pop(peer_id)
        self._suspected.pop(peer_id, None)
        if self._by_id.get(entry.companion_id) is entry:
            del self._by_id[entry.companion_id]
        return [PresenceChange("removed", entry, reason)]

    def _last_seq(self, peer_id: str, now: float) -> int | None:
        known = self._seqs.get(peer_id)
        if known is None:
            return None
        if now - known[1] > self.memory_age and peer_id not in self._by_peer:
            del self._seqs[peer_id]
            return None
        return known[0]

    def _remember(self, peer_id: str, seq: int, now: float) -> None:
        self._seqs[peer_id] = (seq, now)
        self._seqs.move_to_end(peer_id)
        while len(self._seqs) > self.memory:
            for peer in self._seqs:  # the least recently heard peer without an entry
                if peer not in self._by_peer:
                    del self._seqs[peer]
                    break
            else:  # cannot happen while memory >= capacity; keep the bound regardless
                self._seqs.popitem(last=False)


class NewcomerBudget:
    """At most ``limit`` ids new to this node per ``window`` seconds may be pinned from
    announcements: each new pin is written to the trust file, and one hostile key pair
    generator would otherwise fill every node's pin store through gossip. A refused newcomer
    is heard again at its next announcement."""

    def __init__(self, limit: int = 32, window: float = 10.0) -> None:
        if limit < 1 or window <= 0:
            raise ValueError(f"a newcomer budget needs a positive limit and window ({limit}, {window})")
        self.limit = limit
        self.window = window
        self._started = float("-inf")
        self._used = 0

    def take(self, now: float) -> bool:
        """``True`` (and one taken) if the current window has room."""
        if now - self._started >= self.window:
            self._started, self._used = now, 0
        if self._used >= self.limit:
            return False
        self._used += 1
        return True
