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

from companion.membership import Membership
from companion.node.drops import Drop, DropCounters
from companion.node.guard import EdgeGuard
from companion.node.msgid import js_message_id
from companion.node.replay import ReplayGuard
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    TOPICS,
    Action,
    Message,
    Metadata,
    Query,
    QueryResult,
    State,
    encode,
    encode_states,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def md(key: str) -> Metadata:
    return Metadata(id=f"companion_{key}", name=key, personality="p", story="s", sample="x")


def make_guard(max_bytes: int = 4096, capacity: int = 100) -> tuple[EdgeGuard, Clock]:
    members = Membership("peer-me", md("me"))
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
