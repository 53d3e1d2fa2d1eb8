"""Presence announcements as bookkeeping, on a fake clock: deadlines, leaving, sequence numbers
and replays, pins, bounds, disconnects, and the directory they make with direct bindings."""

from __future__ import annotations

import pytest

from companion.node.announcements import DISCONNECT_GRACE, MEMORY_AGE, NewcomerBudget, PresenceTable
from companion.node.membership import AnnounceRefused, Membership, MembershipEvent
from companion.node.trust import TrustStore
from companion.protocol import (
    Metadata,
    PayloadError,
    Presence,
    PresenceParams,
    encode_presence,
    parse_presence,
)

ME = "PeerMe"
WALL = 1_750_000_000.0
"""The fake wall clock's start (seconds since the epoch); the monotonic one starts at 0."""


def md(key: str, **changes: str) -> Metadata:
    fields = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
    fields.update(changes)
    return Metadata(**fields)


def ann(
    key: str,
    seq: int,
    *,
    ttl: int = 30,
    leaving: bool = False,
    lost: dict[str, int] | None = None,
    **changes: str,
) -> Presence:
    params = PresenceParams(
        metadata=md(key, **changes), seq=seq, ttl=ttl, leaving=leaving, addrs=[], lost=lost or {}
    )
    return Presence(params=params)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    @property
    def wall(self) -> float:
        return WALL + self.now

    def seq(self) -> int:
        """What a sender publishing now puts in ``seq`` (its wall clock in milliseconds)."""
        return int(self.wall * 1000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def members() -> Membership:
    return Membership(ME, md("me"))


def hear(m: Membership, clock: Clock, peer: str, presence: Presence) -> list[MembershipEvent]:
    result = m.announce(peer, presence, now=clock.now, wall=clock.wall)
    assert isinstance(result, list), result
    return result


def kinds(events: list[MembershipEvent]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.companion_id, e.reason) for e in events]


# --- the wire --------------------------------------------------------------------------------


def test_the_announcement_on_the_wire_is_compact_json_in_field_order() -> None:
    data = encode_presence(ann("a", 1750000000123, lost={"12D3KooWLost": 1749999990000}))
    assert data == (
        b'{"jsonrpc":"2.0","method":"presence.announce","params":{"metadata":{"id":"companion_a",'
        b'"name":"a","personality":"p","story":"s","sample":"x"},"seq":1750000000123,"ttl":30,'
        b'"leaving":false,"addrs":[],"lost":{"12D3KooWLost":1749999990000}}}'
    )
    assert parse_presence(data) == ann("a", 1750000000123, lost={"12D3KooWLost": 1749999990000})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff", "not_utf8"),
        (b"{", "not_json"),
        (b"[]", "invalid"),
        (b'{"jsonrpc":"2.0","method":"message.send","params":{}}', "wrong_method"),
        (
            b'{"jsonrpc":"2.0","method":"presence.announce","params":{"metadata":{"id":"companion_a",'
            b'"name":"\\ud800","personality":"p","story":"s","sample":"x"},"seq":1,"ttl":30,"leaving":false}}',
            "invalid_unicode",
        ),
    ],
)
def test_hostile_bytes_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    parsed = parse_presence(data)
    assert isinstance(parsed, PayloadError) and parsed.reason == reason


@pytest.mark.parametrize(
    "change",
    [
        ('"ttl":30', '"ttl":0'),
        ('"ttl":30', '"ttl":301'),
        ('"ttl":30', '"ttl":30.5'),
        ('"seq":5', '"seq":-1'),
        ('"seq":5', '"seq":9007199254740992'),
        ('"seq":5', '"seq":"5"'),
        ('"leaving":false', '"leaving":0'),
        ('"leaving":false', '"leaving":false,"extra":1'),
        (',"leaving":false', ""),
        (',"lost":{}', ""),
        (',"addrs":[]', ""),
        ('"addrs":[]', '"addrs":[1]'),
        ('"addrs":[]', '"addrs":[' + ",".join('"/ip4/1.2.3.4/tcp/1"' for _ in range(9)) + "]"),
        ('"lost":{}', '"lost":[]'),
        ('"lost":{}', '"lost":{"0OIl":1}'),
        ('"lost":{}', '"lost":{"12D3KooW":-1}'),
        ('"lost":{}', '"lost":{' + ",".join(f'"P{i}":1' for i in range(17)) + "}"),
        ('"sample":"x"', '"sample":"x","extra":"y"'),
    ],
)
def test_the_schema_is_strict(change: tuple[str, str]) -> None:
    text = encode_presence(ann("a", 5)).decode()
    assert change[0] in text
    parsed = parse_presence(text.replace(change[0], change[1]).encode())
    assert isinstance(parsed, PayloadError) and parsed.reason == "invalid", parsed


def test_oversized_announcements_are_refused_before_parsing() -> None:
    data = encode_presence(ann("a", 5, story="s" * 5000))
    parsed = parse_presence(data, max_bytes=4096)
    assert isinstance(parsed, PayloadError) and parsed.reason == "too_large"


# --- deadlines, leaving, sequence ------------------------------------------------------------


def test_an_announcement_makes_a_companion_present_until_its_ttl(members: Membership, clock: Clock) -> None:
    assert kinds(hear(members, clock, "peer-a", ann("a", clock.seq()))) == [
        ("joined", "companion_a", "announced")
    ]
    assert set(members.directory) == {"companion_me", "companion_a"}
    assert members.presence_deadline() == 30.0
    clock.now = 29.9
    assert members.expire(clock.now) == []
    clock.now = 30.0
    assert kinds(members.expire(clock.now)) == [("left", "companion_a", "expired")]
    assert set(members.directory) == {"companion_me"}
    assert members.presence_deadline() is None


def test_a_refresh_extends_the_deadline_and_is_not_an_event(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    clock.now = 10.0
    assert hear(members, clock, "peer-a", ann("a", clock.seq())) == []
    assert members.presence_deadline() == 40.0
    clock.now = 35.0
    assert members.expire(clock.now) == []
    assert "companion_a" in members.directory


def test_new_metadata_in_an_announcement_is_an_update(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    clock.now = 1.0
    events = hear(members, clock, "peer-a", ann("a", clock.seq(), name="A2"))
    assert [(e.kind, e.metadata.name) for e in events] == [("updated", "A2")]
    assert members.directory["companion_a"].name == "A2"


def test_leaving_ends_presence_at_once(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    clock.now = 1.0
    assert kinds(hear(members, clock, "peer-a", ann("a", clock.seq(), leaving=True))) == [
        ("left", "companion_a", "leaving")
    ]
    assert members.presence_deadline() is None


def test_a_leave_notice_ends_presence_and_outdates_what_is_still_on_its_way(
    members: Membership, clock: Clock
) -> None:
    """Measured on six processes under load: a neighbour took a stopping companion's notice,
    then read a periodic announcement the companion had sent just before (its pubsub reader
    was behind), lost the ``leaving`` one in the close, and kept the companion for its whole
    time to live. The notice carries the ``leaving`` seq, so the late one is stale."""
    members.peer_connected("peer-a")
    members.bind("peer-a", md("a"))
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    late, leaving = clock.seq() + 1, clock.seq() + 2  # sent before it stopped, still on the way
    assert not members.presence.heard("peer-a", leaving, clock.now)
    clock.now = 1.0
    assert members.peer_leaving("peer-a", leaving, now=clock.now) == []  # bound until the close
    assert members.presence.heard("peer-a", leaving, clock.now)
    refused = members.announce("peer-a", ann("a", late), now=clock.now, wall=clock.wall)
    assert isinstance(refused, AnnounceRefused) and refused.reason == "stale"
    assert kinds(members.peer_disconnected("peer-a", now=clock.now, on_purpose=True)) == [
        ("left", "companion_a", "disconnected")
    ]
    assert members.presence_deadline() is None
    # back later (restarted): its new announcements are newer than the notice
    clock.now = 5.0
    assert kinds(hear(members, clock, "peer-a", ann("a", clock.seq()))) == [
        ("joined", "companion_a", "announced")
    ]


def test_a_leave_notice_older_than_the_entry_leaves_it(members: Membership, clock: Clock) -> None:
    """A notice is the peer's word on its own announcement: one numbered before the entry we
    hold (a restart that overtook it) removes nothing, and a peer without an entry loses
    nothing but what it said."""
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    assert members.peer_leaving("peer-a", clock.seq() - 1, now=clock.now) == []
    assert "companion_a" in members.directory
    assert members.peer_leaving("peer-nobody", clock.seq(), now=clock.now) == []
    assert set(members.directory) == {"companion_me", "companion_a"}


def test_stale_sequence_numbers_and_replays_are_refused(members: Membership, clock: Clock) -> None:
    first = ann("a", clock.seq())
    hear(members, clock, "peer-a", first)
    clock.now = 1.0
    second = ann("a", clock.seq(), name="A2")
    hear(members, clock, "peer-a", second)
    for old, reason in ((first, "stale"), (second, "replay")):  # overtaken; the latest again
        refused = members.announce("peer-a", old, now=clock.now, wall=clock.wall)
        assert isinstance(refused, AnnounceRefused) and refused.reason == reason
    assert members.directory["companion_a"].name == "A2"
    # after an orderly stop, the last announcement replayed does not bring it back
    clock.now = 2.0
    hear(members, clock, "peer-a", ann("a", clock.seq(), leaving=True))
    refused = members.announce("peer-a", second, now=clock.now, wall=clock.wall)
    assert isinstance(refused, AnnounceRefused) and refused.reason == "stale"
    assert "companion_a" not in members.directory


def test_a_replay_after_the_memory_forgot_is_too_old_by_its_clock(clock: Clock) -> None:
    members = Membership(ME, md("me"))
    recorded = ann("a", clock.seq())
    hear(members, clock, "peer-a", recorded)
    clock.now = 30.0
    members.expire(clock.now)  # it died
    clock.now = MEMORY_AGE + 31.0  # its sequence number is forgotten now
    refused = members.announce("peer-a", recorded, now=clock.now, wall=clock.wall)
    assert isinstance(refused, AnnounceRefused) and refused.reason == "too_old"
    # a live announcement of the same peer is welcome (a restart continues its clock)
    assert kinds(hear(members, clock, "peer-a", ann("a", clock.seq()))) == [
        ("joined", "companion_a", "announced")
    ]


def test_a_sender_clock_behind_by_less_than_the_memory_age_is_accepted(
    members: Membership, clock: Clock
) -> None:
    behind = int((clock.wall - MEMORY_AGE / 2) * 1000)
    assert kinds(hear(members, clock, "peer-a", ann("a", behind))) == [("joined", "companion_a", "announced")]


# --- pins ----------------------------------------------------------------------------------


def test_an_announcement_pins_its_id_and_a_forgery_is_refused(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    assert members.owner_of("companion_a") == "peer-a"
    clock.now = 1.0
    forged = members.announce("peer-evil", ann("a", clock.seq(), name="evil"), now=clock.now, wall=clock.wall)
    assert forged == AnnounceRefused("peer-evil", "companion_a", "id_pinned", "peer-a")
    leave = members.announce("peer-evil", ann("a", clock.seq(), leaving=True), now=clock.now, wall=clock.wall)
    assert leave == AnnounceRefused("peer-evil", "companion_a", "id_pinned", "peer-a")
    assert members.directory["companion_a"].name == "a"
    assert hear(members, clock, "peer-a", ann("a", clock.seq())) == []  # the real one goes on


def test_an_id_pinned_by_the_metadata_protocol_or_an_operator_is_refused(clock: Clock) -> None:
    trust = TrustStore()
    trust.hold("companion_b", "peer-b", "flag")
    members = Membership(ME, md("me"), trust)
    members.peer_connected("peer-a")
    assert isinstance(members.bind("peer-a", md("a")), list)
    for cid, owner in (("a", "peer-a"), ("b", "peer-b")):
        refused = members.announce("peer-evil", ann(cid, clock.seq()), now=clock.now, wall=clock.wall)
        assert refused == AnnounceRefused("peer-evil", f"companion_{cid}", "id_pinned", owner)
    refused = members.announce("peer-evil", ann("me", clock.seq()), now=clock.now, wall=clock.wall)
    assert refused == AnnounceRefused("peer-evil", "companion_me", "our_own_id", ME)
    refused = members.announce("peer-x", ann("x", clock.seq(), id="user_x"), now=clock.now, wall=clock.wall)
    assert isinstance(refused, AnnounceRefused) and refused.reason == "not_a_companion_id"


def test_a_bound_peer_may_not_announce_another_id(members: Membership, clock: Clock) -> None:
    members.peer_connected("peer-a")
    members.bind("peer-a", md("a"))
    refused = members.announce("peer-a", ann("b", clock.seq()), now=clock.now, wall=clock.wall)
    assert refused == AnnounceRefused("peer-a", "companion_b", "id_mismatch")
    assert members.owner_of("companion_a") == "peer-a" and members.owner_of("companion_b") is None


def test_a_peer_announcing_another_id_replaces_its_entry(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    clock.now = 1.0
    assert kinds(hear(members, clock, "peer-a", ann("b", clock.seq()))) == [
        ("left", "companion_a", "replaced"),
        ("joined", "companion_b", "announced"),
    ]
    assert members.owner_of("companion_a") is None  # its first-use pin moved (a card's id changed)


def test_ourselves_are_never_changed_by_our_own_announcements(members: Membership, clock: Clock) -> None:
    assert hear(members, clock, ME, ann("me", clock.seq(), leaving=True)) == []
    assert "companion_me" in members.directory


# --- what a presence-only companion may send ------------------------------------------------


def test_a_companion_known_only_by_presence_speaks_through_relays(members: Membership, clock: Clock) -> None:
    """Its messages and its states arrays are signed by it and relayed by others: the signer is
    never connected to us, and the checks use the pin its announcement made."""
    hear(members, clock, "peer-far", ann("far", clock.seq()))
    members.peer_connected("peer-b")
    members.bind("peer-b", md("b"))
    assert not members.is_connected("peer-far")
    assert members.companion_of("peer-far") == "companion_far"
    assert members.check_sender("peer-far", "companion_far") is None
    assert members.check_sender("peer-far", "companion_b") is not None
    assert members.check_sender("peer-b", "companion_far") is not None
    everyone = ["companion_b", "companion_far", "companion_me"]
    assert members.check_states_sender("peer-far", everyone) is None
    assert members.check_states_sender("peer-far", ["companion_b", "companion_me"]) is not None
    assert members.check_states_sender("peer-unpinned", everyone) is not None


# --- bindings and presence together ----------------------------------------------------------


def test_present_through_either_path_and_one_join_and_one_leave(members: Membership, clock: Clock) -> None:
    members.peer_connected("peer-a")
    assert kinds(members.bind("peer-a", md("a"))) == [("joined", "companion_a", "metadata")]  # type: ignore[arg-type]
    assert hear(members, clock, "peer-a", ann("a", clock.seq())) == []  # already present
    clock.now = 0.5
    # trimmed by us: still announced, so still present
    assert members.peer_disconnected("peer-a", now=clock.now, on_purpose=True) == []
    assert "companion_a" in members.directory
    clock.now = 30.0
    assert kinds(members.expire(clock.now)) == [("left", "companion_a", "expired")]


def test_the_bindings_metadata_wins_over_the_announcements(members: Membership, clock: Clock) -> None:
    hear(members, clock, "peer-a", ann("a", clock.seq(), name="announced"))
    members.peer_connected("peer-a")
    events = members.bind("peer-a", md("a", name="proved"))
    assert [(e.kind, e.metadata.name) for e in events] == [("updated", "proved")]  # type: ignore[union-attr]
    clock.now = 1.0
    hear(members, clock, "peer-a", ann("a", clock.seq(), name="announced again"))
    assert members.directory["companion_a"].name == "proved"
    events = members.peer_disconnected("peer-a", now=clock.now, on_purpose=True)
    assert [(e.kind, e.metadata.name) for e in events] == [("updated", "announced again")]


def test_a_killed_neighbour_leaves_within_the_grace_a_trimmed_or_live_one_stays(
    members: Membership, clock: Clock
) -> None:
    for key in ("a", "b", "c"):
        members.peer_connected(f"peer-{key}")
        members.bind(f"peer-{key}", md(key))
        hear(members, clock, f"peer-{key}", ann(key, clock.seq()))
    clock.now = 1.0  # a was killed; b's connection was trimmed; c's failed a health check
    assert members.peer_disconnected("peer-a", now=clock.now) == []
    assert members.peer_disconnected("peer-b", now=clock.now, on_purpose=True) == []
    assert members.peer_disconnected("peer-c", now=clock.now) == []
    assert members.presence_deadline() == clock.now + DISCONNECT_GRACE
    clock.now = 2.0  # c, alive, announced itself when it lost us; it reached us through others
    assert hear(members, clock, "peer-c", ann("c", clock.seq())) == []
    clock.now = 1.0 + DISCONNECT_GRACE
    assert kinds(members.expire(clock.now)) == [("left", "companion_a", "expired")]
    assert set(members.directory) == {"companion_me", "companion_b", "companion_c"}
    assert members.announcing_peers() == {"peer-b", "peer-c"}


def test_a_suspected_peer_that_connects_again_keeps_its_deadline(members: Membership, clock: Clock) -> None:
    members.peer_connected("peer-a")
    hear(members, clock, "peer-a", ann("a", clock.seq()))
    clock.now = 1.0
    members.peer_disconnected("peer-a", now=clock.now)  # a health check gave up on it
    assert members.presence_deadline() == clock.now + DISCONNECT_GRACE
    clock.now = 2.0
    members.peer_connected("peer-a")  # it redialled: alive
    assert members.presence_deadline() == 30.0
    clock.now = 29.0
    assert members.expire(clock.now) == []


def test_aikyo_companions_are_present_by_their_binding_alone(members: Membership, clock: Clock) -> None:
    members.peer_connected("peer-aikyo")
    members.bind("peer-aikyo", md("aikyo"))
    assert members.bound_peers() == {"peer-aikyo"} and members.announcing_peers() == frozenset()
    clock.now = 100.0
    assert members.expire(clock.now) == []
    assert kinds(members.peer_disconnected("peer-aikyo", now=clock.now)) == [
        ("left", "companion_aikyo", "disconnected")
    ]


def test_a_rekeyed_id_announced_by_its_new_key_replaces_the_old_binding(clock: Clock) -> None:
    trust = TrustStore()
    members = Membership(ME, md("me"), trust)
    members.peer_connected("peer-old")
    members.bind("peer-old", md("a"))
    trust.hold("companion_a", "peer-new", "flag")  # an operator moved it (here: for this run)
    events = hear(members, clock, "peer-new", ann("a", clock.seq(), name="new key"))
    assert [(e.kind, e.peer_id, e.reason) for e in events] == [
        ("left", "peer-old", "rekeyed"),
        ("joined", "peer-new", "announced"),
    ]
    assert members.bound_peers() == frozenset()
    assert members.directory["companion_a"].name == "new key"


# --- bounds ----------------------------------------------------------------------------------


def test_the_table_is_bounded_and_its_present_entries_keep_refreshing(clock: Clock) -> None:
    members = Membership(ME, md("me"), presence=PresenceTable(capacity=3, memory=8))
    for i in range(3):
        hear(members, clock, f"peer-{i}", ann(str(i), clock.seq()))
    refused = members.announce("peer-9", ann("9", clock.seq()), now=clock.now, wall=clock.wall)
    assert refused == AnnounceRefused("peer-9", "companion_9", "presence_full")
    assert members.owner_of("companion_9") is None  # refused before it could pin anything
    clock.now = 1.0
    assert hear(members, clock, "peer-0", ann("0", clock.seq())) == []
    assert len(members.directory) == 4


def test_the_sequence_memory_is_bounded() -> None:
    table = PresenceTable(capacity=2, memory=4)
    clock = Clock()
    for i in range(50):
        peer = f"peer-{i}"
        table.record(peer, ann(str(i), clock.seq()), now=clock.now)
        table.remove(peer, "leaving")
        clock.now += 1.0
    assert len(table._seqs) <= 4 and len(table) == 0
    # the most recent peers are still remembered: their replays stay stale
    assert table.screen("peer-49", ann("49", 1), now=clock.now, wall=clock.wall) == "stale"


def test_newcomers_are_rate_limited_known_ids_are_not(clock: Clock) -> None:
    members = Membership(ME, md("me"), newcomers=NewcomerBudget(limit=2, window=10.0))
    hear(members, clock, "peer-0", ann("0", clock.seq()))
    hear(members, clock, "peer-1", ann("1", clock.seq()))
    refused = members.announce("peer-2", ann("2", clock.seq()), now=clock.now, wall=clock.wall)
    assert refused == AnnounceRefused("peer-2", "companion_2", "newcomer_limit")
    assert members.owner_of("companion_2") is None
    clock.now = 1.0
    assert hear(members, clock, "peer-0", ann("0", clock.seq())) == []  # pinned already: no budget
    clock.now = 10.0
    assert kinds(hear(members, clock, "peer-2", ann("2", clock.seq()))) == [
        ("joined", "companion_2", "announced")
    ]


@pytest.mark.parametrize(("capacity", "memory"), [(0, 10), (10, 5)])
def test_impossible_bounds_are_refused(capacity: int, memory: int) -> None:
    with pytest.raises(ValueError):
        PresenceTable(capacity=capacity, memory=memory)


# --- lost peers: suspicion and refutation ---------------------------------------------------


def test_a_peer_reported_lost_must_be_heard_again_within_the_grace(members: Membership, clock: Clock) -> None:
    hear(members, clock, "PeerP", ann("p", clock.seq()))
    last = clock.seq()
    clock.now = 5.0
    hear(members, clock, "PeerC", ann("c", clock.seq(), lost={"PeerP": last}))
    assert members.presence_deadline() == 5.0 + DISCONNECT_GRACE
    clock.now = 5.0 + DISCONNECT_GRACE
    assert kinds(members.expire(clock.now)) == [("left", "companion_p", "expired")]


def test_a_live_peer_refutes_a_report_that_it_is_lost(members: Membership, clock: Clock) -> None:
    hear(members, clock, "PeerP", ann("p", clock.seq()))
    last = clock.seq()
    clock.now = 5.0
    hear(members, clock, "PeerC", ann("c", clock.seq(), lost={"PeerP": last}))
    clock.now = 6.0
    assert hear(members, clock, "PeerP", ann("p", clock.seq())) == []  # its refutation
    refuted = members.presence.get("companion_p")
    assert refuted is not None and refuted.expires == 6.0 + 30
    clock.now = 5.0 + DISCONNECT_GRACE
    assert members.expire(clock.now) == []


def test_a_report_older_than_what_we_heard_or_about_a_connected_peer_is_ignored(
    members: Membership, clock: Clock
) -> None:
    old = clock.seq()
    clock.now = 1.0
    hear(members, clock, "PeerP", ann("p", clock.seq()))  # newer than what the claimer had
    members.peer_connected("PeerQ")
    hear(members, clock, "PeerQ", ann("q", clock.seq()))
    claim = {"PeerP": old, "PeerQ": clock.seq(), "PeerC": clock.seq(), ME: clock.seq(), "PeerX": 1}
    clock.now = 2.0
    hear(members, clock, "PeerC", ann("c", clock.seq(), lost=claim))
    assert members.presence_deadline() == 31.0  # p's and q's deadlines untouched
    assert set(members.directory) == {"companion_me", "companion_p", "companion_q", "companion_c"}
