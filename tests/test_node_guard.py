"""The edge every gossipsub payload passes: size, replay, parse, sender authentication, counters."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from companion.node.drops import Drop, DropCounters
from companion.node.guard import ASKED_CAPACITY, EdgeGuard
from companion.node.membership import Membership
from companion.node.msgid import js_message_id
from companion.node.replay import ReplayGuard
from companion.node.trust import TrustStore
from companion.protocol import (
    ACTIONS,
    APPROVAL_QUERY,
    MESSAGES,
    QUERIES,
    STATES,
    TOPICS,
    Action,
    Message,
    Query,
    QueryResult,
    State,
    encode,
    encode_states,
)
from support.cards import metadata as md


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_guard(max_bytes: int = 4096, capacity: int = 100) -> tuple[EdgeGuard, Clock]:
    trust = TrustStore()
    trust.allow("peer-bridge", "approver")
    trust.allow("peer-voice", "answerer")
    members = Membership("peer-me", md("me"), trust)
    members.peer_connected("peer-a")
    assert isinstance(members.bind("peer-a", md("a")), list)
    clock = Clock()
    guard = EdgeGuard(members, DropCounters(clock), replay=ReplayGuard(capacity), max_bytes=max_bytes)
    return guard, clock


def hello(sender: str = "companion_a") -> bytes:
    return encode(Message.create(sender, ["companion_me"], "hello", id="m1"))


def test_valid_payload_is_admitted_once() -> None:
    guard, _ = make_guard()
    inbound = guard.admit(MESSAGES, hello(), "peer-a", b"id-1")
    assert inbound is not None
    assert isinstance(inbound.payload, Message) and inbound.sender_peer == "peer-a"
    assert inbound.raw == hello()
    assert guard.admit(MESSAGES, hello(), "peer-a", b"id-1") is None
    assert guard.drops.snapshot() == {"replay": 1}
    assert guard.accepted == 1


def test_oversized_is_dropped_before_parsing() -> None:
    guard, _ = make_guard(max_bytes=100)
    assert guard.admit(MESSAGES, b"{" * 101, "peer-a", b"id") is None
    assert guard.drops.snapshot() == {"too_large": 1}


@pytest.mark.parametrize(
    ("topic", "data", "reason"),
    [
        (MESSAGES, b"\xff\xfe", "not_utf8"),
        (MESSAGES, b"{not json", "not_json"),
        (MESSAGES, encode(Action.create("companion_a", "wave", {})), "wrong_method"),
        (MESSAGES, hello().replace(b'"hello"', b'"\\ud800"'), "invalid_unicode"),
        (MESSAGES, hello().replace(b'"m1"', b'"m\\udc00"'), "invalid_unicode"),
        (STATES, b"{}", "invalid"),
        ("elsewhere", b"{}", "unknown_topic"),
    ],
)
def test_unparsable_payloads_are_counted_by_reason(topic: str, data: bytes, reason: str) -> None:
    guard, _ = make_guard()
    assert guard.admit(topic, data, "peer-a", b"id") is None
    assert guard.drops.snapshot() == {reason: 1}


@pytest.mark.parametrize(
    ("topic", "data", "signer"),
    [
        (MESSAGES, hello("companion_a"), "peer-evil"),  # an id bound to another peer
        (MESSAGES, hello("companion_me"), "peer-a"),  # a companion sending as another
        (MESSAGES, hello("user_1"), "peer-a"),  # a companion sending as a client
        (ACTIONS, encode(Action.create("companion_a", "wave", {})), "peer-evil"),
        (QUERIES, encode(Query.create("companion_a", "speak")), "peer-evil"),
        (STATES, encode_states([State.create("companion_a", "speak", 5, True)]), "peer-evil"),
        (STATES, encode_states([State.create("companion_me", "speak", 5, True)]), "peer-a"),
    ],
)
def test_spoofed_senders_are_refused(topic: str, data: bytes, signer: str) -> None:
    guard, _ = make_guard()
    assert guard.admit(topic, data, signer, b"id") is None
    assert guard.drops.snapshot() == {"spoofed_sender": 1}
    assert b"id" not in guard.replay  # refused ids are not remembered as handled


@pytest.mark.parametrize(
    ("topic", "data", "signer"),
    [
        (MESSAGES, hello("user_1"), "peer-bridge"),
        (MESSAGES, hello("companion_a"), "peer-a"),
        (QUERIES, encode(QueryResult(id="q1", error="nope")), "peer-bridge"),
        (
            STATES,
            encode_states(
                [
                    State.create("companion_me", "listen", 1, False),
                    State.create("companion_a", "speak", 9, True),
                ]
            ),
            "peer-a",
        ),
    ],
)
def test_genuine_senders_pass(topic: str, data: bytes, signer: str) -> None:
    guard, _ = make_guard()
    assert guard.admit(topic, data, signer, b"id") is not None


def test_a_lone_surrogate_poisons_nothing_after_it() -> None:
    guard, _ = make_guard()
    poison = hello("user_1").replace(b'"hello"', b'"\\ud800"')
    assert guard.admit(MESSAGES, poison, "peer-bridge", b"p") is None
    inbound = guard.admit(MESSAGES, hello("user_1"), "peer-bridge", b"q")
    assert inbound is not None and isinstance(inbound.payload, Message)
    assert guard.drops.snapshot() == {"invalid_unicode": 1}


def test_relayed_states_from_a_pinned_leader_pass_while_it_is_away() -> None:
    guard, _ = make_guard()
    guard.membership.peer_disconnected("peer-a")  # reached only through others now
    states = encode_states(
        [State.create("companion_a", "listen", 1, False), State.create("companion_me", "speak", 9, True)]
    )
    assert guard.admit(STATES, states, "peer-a", b"s1") is not None
    forged = encode_states([State.create("companion_me", "speak", 9, True)])
    assert guard.admit(STATES, forged, "peer-a", b"s2") is None
    assert guard.drops.snapshot() == {"spoofed_sender": 1}


def ask(guard: EdgeGuard, query_type: str, query_id: str) -> None:
    """This node publishes a query (the node tells its guard first), which then passes its edge."""
    query = Query.create("companion_me", query_type, {"message": "hi"}, id=query_id)
    guard.asking(query)
    assert guard.admit(QUERIES, encode(query), "peer-me", f"own-{query_id}".encode()) is not None


def result(query_id: str, **body: Any) -> bytes:
    return encode(QueryResult.model_validate({"id": query_id, "result": {"success": True, "body": body}}))


@pytest.mark.parametrize(
    ("query_type", "signer", "reason"),
    [
        ("speak", "peer-raw", "unauthorized_answer"),
        ("speak", "peer-a", "unauthorized_answer"),  # a companion is no client
        (APPROVAL_QUERY, "peer-raw", "unauthorized_approval"),
        (APPROVAL_QUERY, "peer-voice", "unauthorized_approval"),  # answerers do not approve
    ],
)
def test_answers_to_our_queries_from_peers_that_may_not_answer_are_dropped(
    query_type: str, signer: str, reason: str
) -> None:
    guard, _ = make_guard()
    ask(guard, query_type, "q1")
    assert guard.admit(QUERIES, result("q1", approved=True), signer, b"forged") is None
    assert guard.drops.snapshot() == {reason: 1}
    assert b"forged" not in guard.replay


@pytest.mark.parametrize(
    ("query_type", "signer"),
    [
        ("speak", "peer-bridge"),
        ("speak", "peer-voice"),
        (APPROVAL_QUERY, "peer-bridge"),
        ("speak", "peer-me"),
    ],
)
def test_answers_from_allowed_peers_pass_and_the_first_is_logged(
    query_type: str, signer: str, caplog: pytest.LogCaptureFixture
) -> None:
    guard, _ = make_guard()
    caplog.set_level(logging.INFO, logger="companion")
    ask(guard, query_type, "q1")
    assert guard.admit(QUERIES, result("q1", approved=True), signer, b"r1") is not None
    assert guard.admit(QUERIES, result("q1", approved=True), signer, b"r2") is not None  # a second client
    answered = [r for r in caplog.records if getattr(r, "companion_event", "") == "query_answered"]
    assert [r.companion_fields for r in answered] == [  # type: ignore[attr-defined]
        {"node": "", "query_id": "q1", "type": query_type, "peer": signer, "ok": True}
    ]


def test_results_for_queries_of_other_nodes_are_relayed_unjudged() -> None:
    guard, _ = make_guard()
    ask(guard, "speak", "mine")
    assert guard.admit(QUERIES, result("theirs"), "peer-raw", b"r") is not None
    # a query with our id published by someone else does not teach the guard anything
    other = encode(Query.create("companion_a", "speak", id="q-a"))
    assert guard.admit(QUERIES, other, "peer-a", b"qa") is not None
    assert guard.admit(QUERIES, result("q-a"), "peer-raw", b"ra") is not None
    assert guard.drops.snapshot() == {}


def test_a_bridge_judges_no_answers_to_the_queries_it_relays_for_clients() -> None:
    members = Membership("peer-bridge-node", None)
    guard = EdgeGuard(members, DropCounters(Clock()))
    relayed = encode(Query.create("user_1", "speak", id="q-client"))
    assert guard.admit(QUERIES, relayed, "peer-bridge-node", b"q") is not None
    assert guard.admit(QUERIES, result("q-client"), "peer-other-bridge", b"r") is not None
    assert guard.drops.snapshot() == {}


def test_the_guard_remembers_a_bounded_number_of_own_queries() -> None:
    guard, _ = make_guard()
    for i in range(ASKED_CAPACITY + 10):
        ask(guard, APPROVAL_QUERY, f"q{i}")
    assert len(guard._asked._types) == ASKED_CAPACITY
    assert guard.admit(QUERIES, result(f"q{ASKED_CAPACITY + 9}"), "peer-raw", b"late") is None


def test_each_peer_and_reason_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    guard, clock = make_guard()
    caplog.set_level(logging.DEBUG, logger="companion")
    for i in range(50):
        guard.admit(MESSAGES, b"junk", "peer-x", f"{i}".encode())
    guard.admit(MESSAGES, b"junk", "peer-y", b"y")
    logged = [r for r in caplog.records if getattr(r, "companion_event", "") == "payload_dropped"]
    assert [r.companion_fields["peer"] for r in logged] == ["peer-x", "peer-y"]  # type: ignore[attr-defined]
    clock.now = 61.0
    guard.admit(MESSAGES, b"junk", "peer-x", b"late")
    logged = [r for r in caplog.records if getattr(r, "companion_event", "") == "payload_dropped"]
    assert logged[-1].companion_fields["suppressed_since_last"] == 49  # type: ignore[attr-defined]
    assert guard.drops.snapshot() == {"not_json": 52}


def test_a_bug_inside_the_guard_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    guard, _ = make_guard()

    def broken(*_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(guard.membership, "check_sender", broken)
    assert guard.admit(MESSAGES, hello(), "peer-a", b"id") is None
    assert guard.drops.snapshot() == {"internal_error": 1}


@settings(max_examples=300, deadline=None)
@given(topic=st.sampled_from([*TOPICS, "other"]), data=st.binary(max_size=300), signer=st.text(max_size=20))
def test_guard_never_raises_on_arbitrary_bytes(topic: str, data: bytes, signer: str) -> None:
    guard, _ = make_guard()
    guard.admit(topic, data, signer, data[:8])
    assert guard.accepted + guard.drops.total == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(topic=st.sampled_from(TOPICS), value=json_values)
def test_guard_never_raises_on_arbitrary_json(topic: str, value: Any) -> None:
    import json

    guard, _ = make_guard()
    guard.admit(topic, json.dumps(value).encode(), "peer-a", b"x")
    assert guard.accepted + guard.drops.total == 1


def test_replay_guard_forgets_oldest_beyond_capacity() -> None:
    replay = ReplayGuard(capacity=2)
    assert replay.remember(b"a") and replay.remember(b"b")
    assert not replay.remember(b"a")
    assert replay.remember(b"c")
    assert b"a" not in replay and b"c" in replay and len(replay) == 2
    with pytest.raises(ValueError):
        ReplayGuard(0)


def test_message_id_is_public_key_protobuf_then_seqno() -> None:
    pair = create_new_key_pair()
    peer = ID.from_pubkey(pair.public_key)
    seqno = (7).to_bytes(8, "big")
    msg = rpc_pb2.Message(from_id=peer.to_bytes(), seqno=seqno, data=b"x", topicIDs=["messages"])
    assert js_message_id(msg) == pair.public_key.serialize() + seqno
    # the key field is used when the peer id does not inline the key (RSA peer ids are hashes)
    hashed = rpc_pb2.Message(from_id=b"\x12\x20" + b"h" * 32, seqno=seqno, key=b"KEY")
    assert js_message_id(hashed) == b"KEY" + seqno


def test_message_id_never_raises() -> None:
    class Weird:
        from_id = None
        seqno = 3
        key = b""

    assert js_message_id(Weird()).startswith(b"invalid:")
    assert js_message_id(rpc_pb2.Message()) == b""


def test_drop_counters_bound_their_log_memory() -> None:
    counters = DropCounters(Clock(), max_tracked=3)
    for i in range(10):
        counters.record(Drop("not_json", "x"), peer=f"p{i}", topic=MESSAGES)
    assert len(counters._throttle) == 3
    assert counters.total == 10 and counters.by_topic[MESSAGES] == 10


@pytest.mark.parametrize(
    ("reason", "level"),
    [
        ("replay", logging.DEBUG),
        ("request_limit", logging.DEBUG),
        ("stale", logging.DEBUG),
        ("send_failed", logging.INFO),
        ("too_old", logging.WARNING),
        ("bad_signature", logging.WARNING),
        ("spoofed_sender", logging.WARNING),
    ],
)
def test_routine_drops_are_quiet_and_misbehaviour_warns(
    reason: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Gossip's own artifacts (a copy seen twice, an announcement overtaken on another path:
    about ten warnings per node when 30 companions started together) are not a peer's fault."""
    drops = DropCounters(lambda: 0.0)
    caplog.set_level(logging.DEBUG, logger="companion")
    drops.record(Drop(reason, "detail"), peer="peer-x", topic="t")
    (record,) = [r for r in caplog.records if getattr(r, "companion_event", "") == "payload_dropped"]
    assert record.levelno == level
    assert drops.snapshot() == {reason: 1}
