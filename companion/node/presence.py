"""The trio shell of presence: publish this companion's announcement, take everyone else's.

The bookkeeping (sequence numbers, deadlines, pins) is pure (:mod:`companion.node.announcements`,
:meth:`Membership.announce`); this module owns the clocks and the gossipsub topic:

- **Publishing** (companion nodes only): at once when the node starts, again after 1, 2, 4 and 8
  s (:data:`WARMUP`), then every ``interval`` seconds, each wait jittered to 75-100 % of it
  (nodes started together do not stay in step; never later than ``interval``, so ``ttl`` = 3
  intervals always covers two lost announcements). When a peer connects (once its subscription
  to the topic arrived), the node hands it its latest announcement directly
  (:meth:`PresenceService.peer_connected`: one message to one peer, not an announcement to the
  whole network), and before it trims a connection, to the peer it trims. Triggered
  announcements go to everyone: when a
  ``presence.request`` asks (below), when a connection to an announcing peer closed without
  notice (the announcement lists it in ``lost`` for :data:`~companion.node.announcements.DISCONNECT_GRACE`
  seconds, so others suspect it), and when another node's announcement lists this node in
  ``lost`` (the refutation, repeated once :data:`REFUTE_AGAIN` seconds later), and when a write
  to a peer failed with one of this node's announcements in it (:meth:`PresenceService.unsent`):
  such triggered announcements are coalesced, at most one per ``min_gap`` seconds. On an orderly stop, one
  with ``leaving``, and a leave notice to every connected peer (below).
- **Receiving**: every announcement passes :meth:`PresenceService.validate`, py-libp2p's topic
  validator, once, before gossipsub may forward it: parsed like every payload, then given to
  the membership. A refused one (parse errors, ``id_pinned``, ``stale``, ...) is counted by
  reason in the node's drop counters and neither taken nor forwarded.
- **Asking** (every node, a bridge too): ``presence.request`` once a peer is on the topic, and
  twice later (:data:`REQUEST_AFTER`), so a node that just started learns of everyone within a
  second, not an interval; a companion node that takes one announces soon and relays it, at most
  one per :data:`REQUEST_GAP`. A companion that merely appears in a node's directory (new to it,
  or back after its entry expired) triggers nothing: nodes used to announce on every such
  ``joined``, and under load that fed itself (announcements late, entries expired, every return
  made all N nodes announce: 21 announcements sent per node per second, five times the periodic
  ones, with 20 companions in one process).
- **Leaving**: a stopping companion tells each connected peer on :data:`LEAVE_PROTOCOL` (a
  one-byte notice, :mod:`.notice`) and closes only once they acknowledged (or after
  :data:`LEAVE_NOTICE_TIMEOUT`). The ``leaving`` announcement alone did not make it: a busy
  neighbour whose pubsub reader was behind lost it in the close (py-libp2p drops a stream's
  unread bytes on GO_AWAY), took the close for a failure, kept the companion for the
  disconnect grace and reported it lost to everyone. A peer told waits up to
  :data:`LEAVE_RELAY_WAIT` for the announcement itself (so it relays it to the companions the
  leaver was not connected to); if it did not come, it drops the entry on the notice's word and
  reports the leaver ``lost`` (the others suspect it). The close that follows is on purpose.
- **Expiry**: a task sleeps until the table's next deadline and removes what expired.

Processing happens in the validator (synchronous, never raising), not in a subscription
reader: nothing is queued, and what the pubsub does with deliveries does not matter here (the
node's :class:`~companion.node.pubsub.GuardedPubsub` hands them to the node, which has no
validated payload stashed for them and ignores them).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import decode_uvarint_from_stream, encode_uvarint
from multiaddr import Multiaddr

from companion.log import log_event
from companion.node.announcements import DISCONNECT_GRACE, PRESENCE_TOPIC
from companion.node.drops import Drop, DropCounters
from companion.node.logfilters import reports_stream_failures
from companion.node.membership import AnnounceRefused, Membership, MembershipEvent
from companion.node.notice import acknowledge, tell
from companion.node.pubsub import KeyedMessageCache, reset_quietly
from companion.protocol import (
    PRESENCE_MAX_ADDRS,
    PRESENCE_MAX_LOST,
    Metadata,
    PayloadError,
    Presence,
    PresenceParams,
    PresenceRequest,
    encode_presence,
    parse_presence,
)

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["LEAVE_PROTOCOL", "PresenceService", "PresenceSettings"]

logger = logging.getLogger("companion.node.presence")

JITTER: Final = (0.75, 1.0)
"""The share of ``interval`` each wait between periodic announcements takes (uniform)."""
WARMUP: Final = (1.0, 2.0, 4.0, 8.0)
"""The first waits between periodic announcements after a start (then ``interval``). What a node
publishes while the gossipsub meshes are still forming reaches only part of the network (a
relay whose mesh is empty forwards to nobody, and gossip about it lasts three heartbeats), and
nothing triggers the announcement again once the node knows everyone: measured with twelve
nodes started at once on a loaded machine, some never heard one of them for an interval. Four
more announcements per start, while the meshes settle, reach everyone."""
REQUEST_GAP: Final = 5.0
"""Seconds after serving a ``presence.request`` during which a node refuses (and does not relay)
another one (``request_limit``): one request makes every companion announce once; a flood of
them costs each node at most one announcement per gap."""
REQUEST_AFTER: Final = (0.0, REQUEST_GAP + 1.0, 3 * REQUEST_GAP)
"""When a node that does not announce itself asks, counted from its first peer on the topic
(again later, in case a node refused the first within another request's gap)."""
SUBSCRIPTION_WAIT: Final = 5.0
"""How long a newly connected peer may take to tell us its subscriptions."""
FLUSH_TIMEOUT: Final = 0.5
"""How long an announcement that must precede a close (leaving, a trim) may take to be sent."""
LEAVE_PROTOCOL: Final = TProtocol("/companion/leave/1.0.0")
reports_stream_failures(LEAVE_PROTOCOL)  # a peer without it is no error: see where it is opened
LEAVE_NOTICE_TIMEOUT: Final = 3.0
"""How long a stopping companion waits for its peers to acknowledge its leave notice (all
together), within the node's ``close_timeout`` of 5 s; a peer that did not answer by then
sees a close without notice."""
LEAVE_RELAY_WAIT: Final = 1.0
"""How long a peer told of a leave waits for the ``leaving`` announcement before it answers:
one it took in time it has relayed to the companions the leaver was not connected to."""
LEAVE_VALID: Final = 30.0
"""Seconds a leave notice makes the peer's next disconnect count as on purpose."""

REFUTE_AGAIN: Final = 2.0
"""Seconds after refuting a ``lost`` report before the refutation goes out once more. The others
drop a suspected companion unless they hear it within
:data:`~companion.node.announcements.DISCONNECT_GRACE` (5 s); with 30 companions starting on 2 cores a
single refutation was sometimes lost in full send queues (``outbound_queue_full``) or came too
late, and the companion was out of their directories until its next refresh (up to an
interval). The repeat is coalesced like every triggered announcement (``min_gap``), so a peer
that reports this node lost over and over still gets at most one announcement per gap."""
SEEN_TTL: Final = 120
"""py-libp2p 0.8.1's default for how long pubsub remembers a message id (``seen_ttl``)."""
HAND_OVER_MARGIN: Final = 10.0
"""An announcement is handed over only while it is this much younger than the seen ttl: a peer
that had it still knows it as seen and drops the copy quietly, instead of refusing it as a
``replay`` (a count operators read as hostile)."""

Emit = Callable[[list[MembershipEvent]], None]


class PresenceSettings:
    """What :class:`PresenceService` needs from ``NodeConfig`` (see its ``presence_*`` fields)."""

    __slots__ = ("interval", "max_bytes", "min_gap", "ttl")

    def __init__(self, interval: float, ttl: int, min_gap: float, max_bytes: int) -> None:
        self.interval = interval
        self.ttl = ttl
        self.min_gap = min_gap
        self.max_bytes = max_bytes


@dataclass
class _Telling:
    """The leave notices of one stop: sent at once to the peers connected when it began, and to
    each peer that connects before the notices' common deadline."""

    nursery: trio.Nursery
    host: Any
    seq: bytes
    deadline: float = field(default_factory=lambda: trio.current_time() + LEAVE_NOTICE_TIMEOUT)
    told: set[ID] = field(default_factory=set)

    def tell(self, service: PresenceService, peer: ID) -> None:
        if peer not in self.told and trio.current_time() < self.deadline:
            self.told.add(peer)
            self.nursery.start_soon(service._tell_leaving, self, peer)


class PresenceService:
    """One node's presence: its announcements out, everyone's in (see the module docstring)."""

    def __init__(
        self,
        membership: Membership,
        metadata: Metadata | None,
        settings: PresenceSettings,
        drops: DropCounters,
        emit: Emit,
        *,
        name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.membership = membership
        self.metadata = metadata
        self.settings = settings
        self.drops = drops
        self.name = name
        self._emit = emit
        self._rng = rng or random.Random()
        self._self_peer = membership.self_peer
        self._pubsub: Any = None
        self._addrs: Callable[[], list[str]] = list
        self._seq = 0
        self._last_sent = float("-inf")
        self._last_request = float("-inf")
        self.requests = 0
        self._triggered = trio.Event()
        self._peer_on_topic = trio.Event()
        self._heard = False
        """Whether another node's announcement was accepted since this node last asked."""
        self._table_changed = trio.Event()
        self._accepted_one = trio.Event()
        """Set (and replaced) whenever an announcement was taken."""
        self._gone = False
        """Set once :meth:`leave` began: an announcement after the ``leaving`` one would bring
        this companion back into the directories (measured: a peer connecting during the stop
        triggered one)."""
        self._telling: _Telling | None = None
        """While :meth:`leave` tells peers: where a peer that connects meanwhile is told."""
        self._leaving: dict[str, float] = {}
        """Connected peers that told us they are leaving, and when (one mark per peer)."""
        self._lost: dict[str, tuple[int, float]] = {}
        """Peers lost without notice (or that left without their ``leaving`` announcement
        reaching us): the last seq of each, and until when we say so."""
        self._present = trio.Event()
        self._present.set()
        """Set while this node announces itself; cleared by :meth:`hold`."""
        self._refuting = False
        """Set when an announcement reported this node lost: the refutation goes out twice."""
        self._handing: bytes | None = None
        """The bytes of the latest announcement, while it may be handed over (:meth:`_hand_over`)."""
        self._handing_since = float("-inf")
        self._handed: rpc_pb2.Message | None = None
        """That announcement as gossipsub signed and published it (seen by :meth:`validate`)."""
        self.published = 0
        self.handed_over = 0
        """Announcements handed to one peer (a connection, a trim) instead of published anew."""
        self.accepted = 0
        self.leave_notices: Counter[str] = Counter()
        """Leave notices by outcome: ``heard`` (a peer's ``leaving`` announcement came in time),
        ``unheard`` (it did not: the entry went on the notice), ``unannounced`` (a peer we held
        no announcement of: a bridge, a companion heard only through its connection),
        ``acknowledged`` (our own, by a peer when we stopped)."""
        self.bytes_out = 0
        """Bytes of this node's own announcements handed to gossipsub."""
        self.bytes_in = 0
        """Bytes of announcements this node's validator looked at (each message once: copies
        gossipsub already saw never get here)."""

    def stats(self) -> dict[str, Any]:
        return {
            "presence_published": self.published,
            "presence_handed_over": self.handed_over,
            "presence_accepted": self.accepted,
            "presence_requests": self.requests,
            "presence_entries": len(self.membership.presence),
            "presence_bytes_out": self.bytes_out,
            "presence_bytes_in": self.bytes_in,
            "leave_notices": dict(self.leave_notices),
        }

    # --- running ----------------------------------------------------------------------------

    def hold(self) -> None:
        """Announce nothing until :meth:`release` (before :meth:`start`): the companion is not
        ready to take part yet, and a node that others see present may be chosen to lead a
        turn it cannot lead. Announcements of others are still taken and relayed."""
        if self._present.is_set():
            self._present = trio.Event()

    def release(self) -> None:
        """Ready: announce at once, then as usual."""
        self._present.set()
        self.trigger()

    @property
    def held(self) -> bool:
        return not self._present.is_set()

    async def wait_present(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until this node announces itself; ``False`` if still held,
        or once it is leaving: a companion that announced its stop is not present to anyone, and
        its metadata handed to a peer connecting during the stop put it back into that peer's
        directory (measured: 59 times when 30 companions stopped together)."""
        if not self._gone:
            with trio.move_on_after(timeout):
                await self._present.wait()
        return self._present.is_set() and not self._gone

    def told_leaving(self, peer: str) -> bool:
        """Whether ``peer`` told us, over the connection it holds now, that it is stopping
        (its leave notice; a new connection clears the mark)."""
        return peer in self._leaving

    async def run(
        self,
        pubsub: Any,
        addrs: Callable[[], list[str]],
        *,
        task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Validate, subscribe (to receive and to relay), then run the loops until cancelled;
        started once subscribed. ``addrs`` says where this node listens now (announced, so ring
        neighbours can dial)."""
        self._pubsub = pubsub
        self._addrs = addrs
        pubsub.set_topic_validator(PRESENCE_TOPIC, self.validate, False)
        await pubsub.subscribe(PRESENCE_TOPIC)  # joins the mesh; deliveries go to the node, unused
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_loop)
            nursery.start_soon(self._request_loop)
            if self.metadata is not None:
                nursery.start_soon(self._publish_loop)
            task_status.started()

    async def _publish_loop(self) -> None:
        await self._present.wait()
        warmup = [w for w in WARMUP if w < self.settings.interval]
        while True:
            await self._announce(leaving=False)
            if self._refuting:  # once more, while the others still only suspect us
                self._refuting = False
                wait = REFUTE_AGAIN
            else:
                wait = (warmup.pop(0) if warmup else self.settings.interval) * self._rng.uniform(*JITTER)
            with trio.move_on_after(wait):
                await self._triggered.wait()
                await trio.sleep_until(self._last_sent + self.settings.min_gap)
            self._triggered = trio.Event()

    async def _request_loop(self) -> None:
        """A node that just started knows nobody and others have no reason to announce to it
        before their next interval: it asks, once a peer is on the topic, at
        :data:`REQUEST_AFTER`. Each served request makes every companion announce, so a
        companion asks again only while it heard no announcement since it last asked (its
        request reached nobody yet); a bridge, whose clients learn companions from nothing
        else, asks every time (part of the network may have refused the first, and said
        nothing)."""
        await self._peer_on_topic.wait()
        for wait in REQUEST_AFTER:
            await trio.sleep(wait)
            if self.metadata is not None and self._heard:
                return  # a companion's request was heard; a bridge asks every time (see above)
            self._heard = False
            await self._publish(encode_presence(PresenceRequest()))

    async def _expire_loop(self) -> None:
        while True:
            deadline = self.membership.presence_deadline()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._table_changed.wait()
            self._table_changed = trio.Event()
            self._emit(self.membership.expire(trio.current_time()))

    # --- publishing -------------------------------------------------------------------------

    def trigger(self) -> None:
        """Announce soon (at most one triggered announcement per ``min_gap``)."""
        self._triggered.set()

    def unsent(self, msg: rpc_pb2.Message) -> None:
        """A failed write to a peer took ``msg`` with it (``send_failed``). If it was this node's
        own message on the presence topic, announce again: twelve companions started at once on
        a loaded machine lost a node's announcements to the streams that failed while the
        connections churned, and nothing else made it announce before its next interval (100 s),
        so a node stayed unknown to part of the network. A lost ``presence.request`` is retried
        by its own loop; announcing once more for it costs one announcement per ``min_gap``."""
        pubsub = self._pubsub
        if (
            self.metadata is not None
            and pubsub is not None
            and PRESENCE_TOPIC in msg.topicIDs
            and msg.from_id == pubsub.my_id.to_bytes()
        ):
            log_event(logger, "presence_unsent", logging.DEBUG, node=self.name)
            self.trigger()

    def connection_lost(self, peer: str) -> None:
        """The connection to ``peer`` closed without notice: its entry now has a shorter
        deadline, and we announce ourselves at once, saying we lost it (if it announces) and
        letting it hear from us if it lost us the same way."""
        entry = self.membership.presence.of_peer(peer)
        if entry is not None:
            self._report_lost(peer, entry.seq)
        self._table_changed.set()
        self.trigger()

    def _report_lost(self, peer: str, seq: int) -> None:
        """List ``peer`` in ``lost``, with the last ``seq`` heard of it, for the grace (the
        caller triggers the announcement that says so)."""
        self._lost[peer] = (seq, trio.current_time() + DISCONNECT_GRACE)

    def connection_back(self, peer: str) -> None:
        """``peer`` connected again: it is not lost."""
        self._lost.pop(peer, None)
        self._leaving.pop(peer, None)

    def closed_leaving(self, peer: str) -> bool:
        """Whether the connection to ``peer`` that just closed was its orderly stop (it sent a
        leave notice); forgets the mark."""
        told = self._leaving.pop(peer, None)
        return told is not None and trio.current_time() - told <= LEAVE_VALID

    async def serve_leave(self, stream: Any) -> None:
        """A connected peer is about to stop and says with which ``leaving`` announcement (its
        ``seq``, a uvarint): wait (bounded) for that announcement, so it is relayed to the
        companions the peer was not connected to; take the notice for it either way
        (:meth:`Membership.peer_leaving`: the peer's own word, authenticated by the
        connection, which can take back only its own announcement); acknowledge. If the
        announcement did not come, this node reports the peer ``lost``: the others, which did
        not get it through us either, suspect it."""
        peer: ID = stream.muxed_conn.peer_id
        name = peer.to_base58()
        try:
            with trio.fail_after(LEAVE_NOTICE_TIMEOUT):
                seq = await decode_uvarint_from_stream(stream)
        except Exception as exc:  # too slow, cut short, or not a uvarint: no notice
            log_event(
                logger, "leave_notice_unread", logging.DEBUG, node=self.name, peer=name, error=repr(exc)[:200]
            )
            await reset_quietly(stream)
            return
        if self._pubsub is not None and name not in self._leaving:
            self._leaving[name] = trio.current_time()
            table = self.membership.presence
            outcome = "unannounced"  # nothing of it to take back, relay or report
            if table.of_peer(name) is not None:
                with trio.move_on_after(LEAVE_RELAY_WAIT):
                    while not table.heard(name, seq, trio.current_time()):
                        await self._accepted_one.wait()
                outcome = "heard" if table.heard(name, seq, trio.current_time()) else "unheard"
            self.leave_notices[outcome] += 1
            log_event(logger, "peer_leaving", node=self.name, peer=name, seq=seq, announcement=outcome)
            self._emit(self.membership.peer_leaving(name, seq, now=trio.current_time()))
            if outcome == "unheard":
                self._report_lost(name, seq)
                self.trigger()
            self._table_changed.set()
        await acknowledge(stream, LEAVE_NOTICE_TIMEOUT, node=self.name)

    async def peer_connected(self, peer: ID) -> None:
        """A peer connected: once it subscribed to the topic (bounded wait), hand it this
        companion's latest announcement (:meth:`_hand_over`; a new announcement to everyone only
        when there is none to hand over) and, the first time, start asking
        (:meth:`_request_loop`). During a stop it is told instead (:meth:`leave`).

        Each connection used to trigger an announcement to the whole network, so that the new
        peer heard this companion: with 30 companions one per process, connections come and go
        while the DHT, the ring and the bound settle, and those announcements were most of the
        network's traffic (16 published per node in the first two minutes, each delivered to
        all 30 nodes from several mesh peers, ~9 ms of a core per node each)."""
        if self._gone:
            if self._telling is not None:
                self._telling.tell(self, peer)
            return
        if self._pubsub is None:
            return
        with trio.move_on_after(SUBSCRIPTION_WAIT):
            try:
                await self._pubsub.wait_for_subscription(peer, PRESENCE_TOPIC, timeout=SUBSCRIPTION_WAIT)
            except Exception:  # too slow (an aikyo peer never subscribes to it), or gone
                return
            self._peer_on_topic.set()
            if not self._hand_over([peer]):
                self.trigger()

    def _hand_over(self, peers: Sequence[ID]) -> bool:
        """Send this companion's latest announcement, as it was signed and published, to
        ``peers`` alone; ``False`` (nothing sent) when there is none that may be sent again.

        The message is the one gossipsub published (same signature, same message id): a peer
        that already has it drops it as seen without forwarding it, one that missed it takes it
        and forwards it to its own mesh like any new message, so it goes exactly where it was
        missing. Only an announcement that reports nobody ``lost`` and is not ``leaving`` is
        handed over: an old loss report would make the peer suspect a companion that refuted
        it long ago (and the refutation is not sent with it), so those cases announce anew."""
        message = self._handed
        router = getattr(self._pubsub, "router", None)
        if message is None or router is None or self._gone or self.held:
            return False
        seen_for = getattr(getattr(self._pubsub, "seen_messages", None), "ttl", SEEN_TTL)
        if trio.current_time() - self._handing_since > seen_for - HAND_OVER_MARGIN:
            return False  # peers that had it may have forgotten it: they would refuse it as a replay
        sent = False
        for peer in self._on_topic(peers):
            router.send_rpc(peer, rpc_pb2.RPC(publish=[message]))
            self.handed_over += 1
            sent = True
        return sent

    def _on_topic(self, peers: Iterable[ID]) -> list[ID]:
        """Those of ``peers`` on the presence topic: the only ones that hold announcements
        (aikyo's nodes, bridges and clients never subscribe to it)."""
        on_topic = getattr(self._pubsub, "peer_topics", {}).get(PRESENCE_TOPIC, ())
        return [peer for peer in peers if peer in on_topic]

    async def announce_now(self, peers: Sequence[str] = ()) -> None:
        """Make sure ``peers`` hold this companion's latest announcement and wait (bounded)
        until it was handed to them: what a node does just before it closes a connection on
        purpose (a trim), so the peer keeps it in its directory. The latest announcement is
        handed over (:meth:`_hand_over`) where it can be, else a new one goes to everyone.

        Only peers on the presence topic hold announcements: for one that is not (an aikyo
        node, a bridge, a client) nothing is sent. A node trimming such a peer used to announce
        anew to the whole network instead: with 30 idle companions and a client that kept
        dialling back the nodes that trimmed it, 8 such announcements in 90 s beside the ~30
        periodic refreshes, each read by every node from several mesh peers."""
        if self.metadata is None or self.held:
            return
        holders = self._on_topic(map(ID.from_base58, peers))
        if not holders:
            return
        if not self._hand_over(holders):
            await self._announce(leaving=False)
        await self._flush()

    async def leave(self) -> None:
        """The orderly stop: announce ``leaving``, give it a moment to go out, and tell every
        connected peer (a node that never announced itself has nothing to take back), those
        that connect meanwhile included: one dialled by the DHT, the ring or a peer's restart
        holds the announcement too, and would take the close that follows for a failure."""
        if self.metadata is not None and self._pubsub is not None and not self.held:
            self._gone = True
            await self._announce(leaving=True)
            await self._flush()
            self._forget_earlier_announcements()
            host = self._pubsub.host
            try:
                async with trio.open_nursery() as nursery:  # all at once, each within the deadline
                    self._telling = _Telling(nursery, host, encode_uvarint(self._seq))
                    for peer in list(host.get_network().connections):
                        self._telling.tell(self, peer)
            finally:
                # Once every notice went out the nursery is closed, while the node goes on
                # closing: a peer connecting now is not told (starting its notice there raised,
                # and ended the stop in an error).
                self._telling = None

    def _forget_earlier_announcements(self) -> None:
        """Once ``leaving`` went out, take this companion's earlier announcements out of
        gossipsub's message cache: a peer that connected during the stop was replayed them on
        subscribing (py-libp2p replays a topic's recent messages), the ``leaving`` one after
        them, and listed the companion for a moment. Only the latest (``leaving``) stays."""
        cache = getattr(getattr(self._pubsub, "router", None), "mcache", None)
        if not isinstance(cache, KeyedMessageCache):
            return
        me = ID.from_base58(self._self_peer).to_bytes()
        own = {
            mid: msg
            for mid, msg in cache.msgs.items()
            if msg.from_id == me and list(msg.topicIDs) == [PRESENCE_TOPIC]
        }
        if len(own) > 1:
            latest = max(own, key=lambda mid: int.from_bytes(own[mid].seqno, "big"))
            cache.forget(own.keys() - {latest})

    async def _tell_leaving(self, telling: _Telling, peer: ID) -> None:
        timeout = max(0.0, telling.deadline - trio.current_time())
        outcome = await tell(telling.host, peer, LEAVE_PROTOCOL, timeout, node=self.name, payload=telling.seq)
        if outcome == "taken":
            self.leave_notices["acknowledged"] += 1

    async def _announce(self, *, leaving: bool) -> None:
        assert self.metadata is not None
        if self._pubsub is None or self.held or (self._gone and not leaving):
            return
        self._seq = max(self._seq + 1, time.time_ns() // 1_000_000)
        lost = self._lost_now()
        presence = Presence(
            params=PresenceParams(
                metadata=self.metadata,
                seq=self._seq,
                ttl=self.settings.ttl,
                leaving=leaving,
                addrs=[a for a in self._addrs() if len(a) <= 300][:PRESENCE_MAX_ADDRS],
                lost=lost,
            )
        )
        data = encode_presence(presence)
        self._handed = None  # until the validator sees this one go out
        self._handing = data if not (leaving or lost) else None
        self._handing_since = trio.current_time()
        await self._publish(data)

    async def _publish(self, data: bytes) -> None:
        if self._pubsub is None:
            return
        if len(data) > self.settings.max_bytes:
            log_event(
                logger,
                "presence_too_large",
                logging.WARNING,
                node=self.name,
                size=len(data),
                limit=self.settings.max_bytes,
            )
            return
        self._last_sent = trio.current_time()
        try:
            await self._pubsub.publish(PRESENCE_TOPIC, data)
            self.published += 1
            self.bytes_out += len(data)
        except Exception as exc:  # a publish that fails must not end the loop
            log_event(
                logger, "presence_publish_failed", logging.WARNING, node=self.name, error=repr(exc)[:200]
            )

    def _lost_now(self) -> dict[str, int]:
        """The peers to report lost: those lost within the grace, the most recent first."""
        now = trio.current_time()
        for peer in [p for p, (_, until) in self._lost.items() if until <= now]:
            del self._lost[peer]
        recent = sorted(self._lost.items(), key=lambda item: item[1][1], reverse=True)
        return {peer: seq for peer, (seq, _) in recent[:PRESENCE_MAX_LOST]}

    async def _flush(self) -> None:
        """Wait until py-libp2p's per-peer send queues are empty, within :data:`FLUSH_TIMEOUT`.
        py-libp2p 0.8.1 has no event for it: the queues are looked at every 10 ms."""
        queues = getattr(self._pubsub, "peer_queues", {})
        with trio.move_on_after(FLUSH_TIMEOUT):
            while any(len(q) for q in list(queues.values())):
                await trio.sleep(0.01)
            await trio.sleep(0.02)  # the RPC taken last may still be in its write

    # --- receiving --------------------------------------------------------------------------

    def validate(self, forwarder: ID, msg: Any) -> bool:
        """py-libp2p's topic validator: take the announcement, or count why not. Never raises
        (a raising validator stops py-libp2p's pubsub)."""
        try:
            return self._validate(forwarder, msg)
        except Exception as exc:
            self.drops.record(Drop("internal_error", repr(exc)), peer=str(forwarder), topic=PRESENCE_TOPIC)
            return False

    def _validate(self, forwarder: ID, msg: Any) -> bool:
        if len(msg.topicIDs) != 1:
            self._drop("multi_topic", f"{len(msg.topicIDs)} topics in one message", str(forwarder))
            return False
        signer = ID(msg.from_id).to_base58()
        if signer == self._self_peer:  # our own, on its way out
            if self._handing is not None and msg.data == self._handing:
                self._handed = msg  # signed, as peers that connect later are handed it
            return True
        self.bytes_in += len(msg.data)
        parsed = parse_presence(msg.data, max_bytes=self.settings.max_bytes)
        if isinstance(parsed, PayloadError):
            self._drop(parsed.reason, parsed.detail, signer)
            return False
        if isinstance(parsed, PresenceRequest):
            return self._requested(signer)
        result = self.membership.announce(signer, parsed, now=trio.current_time(), wall=time.time())
        if isinstance(result, AnnounceRefused):
            self._refused(result)
            return False
        self.accepted += 1
        self._heard = True
        self._table_changed.set()
        self._accepted_one.set()
        self._accepted_one = trio.Event()
        self._learn_addrs(signer, parsed.params.addrs)
        if self._self_peer in parsed.params.lost and self.metadata is not None:
            self._refuting = True  # someone lost us: tell everyone we are here, twice
            self.trigger()
        if result:
            self._emit(result)  # a companion that joined asked for announcements itself
        return True

    def _requested(self, signer: str) -> bool:
        """Someone asked for announcements: announce soon and relay the request, unless one was
        served within :data:`REQUEST_GAP`."""
        now = trio.current_time()
        if now - self._last_request < REQUEST_GAP:
            self._drop("request_limit", f"a presence request within {REQUEST_GAP:g} s of another", signer)
            return False
        self._last_request = now
        self.requests += 1
        if self.metadata is not None:
            self.trigger()
        return True

    def _learn_addrs(self, signer: str, addrs: list[str]) -> None:
        """Make the addresses a companion announced for itself (those that end in its own peer
        id and parse; the rest are ignored) the peerstore's addresses of it, unless it is
        connected (identify knows them then). Replaced, never added to: py-libp2p's peerstore
        appends without bound, and each announcement could carry new ones."""
        if self._pubsub is None:
            return
        host = self._pubsub.host
        peer = ID.from_base58(signer)
        if host.get_network().connections.get(peer):
            return
        suffix = f"/p2p/{signer}"
        usable = []
        for text in addrs:
            if not text.endswith(suffix):
                continue
            try:
                usable.append(Multiaddr(text[: -len(suffix)]))
            except Exception:
                continue
        if usable:
            store = host.get_peerstore()
            wanted = usable[:PRESENCE_MAX_ADDRS]
            try:
                held = {str(a) for a in store.addrs(peer)}
            except Exception:  # py-libp2p raises for a peer it holds no addresses of
                held = set()
            if held == {str(a) for a in wanted}:
                return  # every refresh repeats them: clearing costs py-libp2p a peer-record check
            store.clear_addrs(peer)
            store.add_addrs(peer, wanted)

    def _refused(self, refused: AnnounceRefused) -> None:
        owner = f", pinned to peer {refused.owner}" if refused.owner else ""
        self._drop(refused.reason, f"announcement for {refused.companion_id[:80]!r}{owner}", refused.peer_id)
        if refused.reason in ("id_pinned", "our_own_id"):
            log_event(
                logger,
                "presence_refused",
                logging.DEBUG,
                node=self.name,
                peer=refused.peer_id,
                companion_id=refused.companion_id[:80],
                reason=refused.reason,
                owner=refused.owner,
            )

    def _drop(self, reason: str, detail: str, peer: str) -> None:
        self.drops.record(Drop(reason, detail), peer=peer, topic=PRESENCE_TOPIC)
