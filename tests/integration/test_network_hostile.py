"""Hostile input at running node processes: a raw publisher (no validators, strict signing) sends
a corpus of nasty payloads, hypothesis-generated ones and spoofed senders to node a; node b hears
only what a forwards. Afterwards both run, a's counters show the drops, b saw none of them."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from network_support import Proc, network

from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    TOPICS,
    Action,
    Message,
    Query,
    State,
    encode,
    encode_states,
)

pytestmark = pytest.mark.integration


def message(sender: str, text: str, id: str) -> bytes:
    return encode(Message.create(sender, ["companion_a", "companion_b"], text, id=id))


VALID = json.loads(message("companion_x", "ok", "v"))

CORPUS: list[tuple[str, bytes, str]] = [
    (MESSAGES, b"", "not_json"),
    (MESSAGES, b"\xff\xfe\x00garbage", "not_utf8"),
    (MESSAGES, b'{"jsonrpc":"2.0","method":"message.send","params":{', "not_json"),
    (MESSAGES, b"\xef\xbb\xbf" + message("companion_x", "bom", "bom"), "not_json"),
    (MESSAGES, b"[" * 5000 + b"]" * 5000, "not_json"),
    (MESSAGES, message("companion_x", "x", "nan").replace(b'"x"', b"NaN"), "not_json"),
    (MESSAGES, b"null", "invalid"),
    (MESSAGES, b"[]", "invalid"),
    (MESSAGES, json.dumps({**VALID, "extra": 1}).encode(), "invalid"),
    (MESSAGES, json.dumps({**VALID, "params": {**VALID["params"], "to": "companion_a"}}).encode(), "invalid"),
    (MESSAGES, json.dumps({**VALID, "params": {**VALID["params"], "metadata": None}}).encode(), "invalid"),
    (MESSAGES, encode(Action.create("companion_x", "wave", {})), "wrong_method"),
    (
        MESSAGES,
        json.dumps({**VALID, "params": {**VALID["params"], "message": "a" * 100_000}}).encode(),
        "too_large",
    ),
    (STATES, b"{}", "invalid"),
    (
        STATES,
        b'[{"jsonrpc":"2.0","method":"state.send","params":{"from":"companion_x","state":"speak",'
        b'"importance":1e999,"selected":true,"closing":"none"}}]',
        "invalid",
    ),
    (
        STATES,
        b'[{"jsonrpc":"2.0","method":"state.send","params":{"from":"companion_x","state":"shout",'
        b'"importance":5,"selected":true,"closing":"none"}}]',
        "invalid",
    ),
    (
        QUERIES,
        b'{"jsonrpc":"2.0","method":"query.send","id":"q","params":{"from":"companion_x","type":"t",'
        b'"body":null}}',
        "invalid",
    ),
    (QUERIES, b'{"jsonrpc":"2.0","method":"other.send","id":"q"}', "wrong_method"),
    (QUERIES, b'{"jsonrpc":"2.0","id":"q","result":null}', "invalid"),
    (ACTIONS, b'{"jsonrpc":"2.0","method":"action.send","params":{"from":"companion_x"}}', "invalid"),
    (ACTIONS, b"1e999999", "invalid"),
    # spoofed senders: ids bound to other peers, or a client id from a companion's peer
    (MESSAGES, message("companion_a", "I am a", "spoof-1"), "spoofed_sender"),
    (MESSAGES, message("companion_b", "I am b", "spoof-2"), "spoofed_sender"),
    (MESSAGES, message("user_1", "I am a user", "spoof-3"), "spoofed_sender"),
    (ACTIONS, encode(Action.create("companion_a", "wave", {})), "spoofed_sender"),
    (QUERIES, encode(Query.create("companion_b", "speak", id="spoof-q")), "spoofed_sender"),
    (STATES, encode_states([State.create("companion_a", "speak", 9, True)]), "spoofed_sender"),
]


def generated_payloads() -> list[tuple[str, bytes]]:
    """Hypothesis-made payloads: arbitrary bytes, arbitrary JSON, and envelopes with a wrong field."""
    found: list[tuple[str, bytes]] = []
    json_value = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
        max_leaves=30,
    )
    broken_envelope = st.builds(
        lambda key, value: json.dumps({**VALID, "params": {**VALID["params"], key: value}}).encode(),
        st.sampled_from(["id", "from", "to", "message"]),
        json_value.filter(lambda v: not isinstance(v, str)),
    )
    payload = st.one_of(
        st.binary(max_size=400), json_value.map(lambda v: json.dumps(v).encode()), broken_envelope
    )

    @settings(max_examples=150, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(topic=st.sampled_from(TOPICS), data=payload)
    def collect(topic: str, data: bytes) -> None:
        found.append((topic, data))

    collect()
    return found


def publish(raw: Proc, topic: str, data: bytes, **extra: Any) -> None:
    raw.send({"op": "publish", "topic": topic, "b64": base64.b64encode(data).decode(), **extra})


def heard(proc: Proc, message_id: str, timeout: float) -> bool:
    try:
        proc.event("inbound", timeout, id=message_id)
    except AssertionError:
        return False
    return True


def test_hostile_payloads_are_counted_dropped_and_not_forwarded(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        b, _ = net.companion("b", a_started["addrs"][0])
        raw, _ = net.raw("x")
        raw.send({"op": "connect", "addr": a_started["addrs"][0]})
        raw.event("connected", 15)
        for proc, key in ((a, "b"), (a, "x"), (b, "a")):
            proc.event("companion_joined", 20, companion_id=f"companion_{key}")

        # x -> a -> b works before the flood (the first publishes may precede the mesh)
        assert any(
            publish(raw, MESSAGES, message("companion_x", "warm", f"warm-{n}")) or heard(b, f"warm-{n}", 0.5)
            for n in range(30)
        ), "b never heard x through a"

        generated = generated_payloads()
        for topic, data, _ in CORPUS:
            publish(raw, topic, data)
        for topic, data in generated:
            publish(raw, topic, data)
        publish(raw, MESSAGES, message("companion_x", "after the flood", "after"), ack=True)
        raw.wait_for(
            lambda e: e.get("event") == "published" and e["count"] >= len(CORPUS) + len(generated), 60
        )
        b.event("inbound", 20, id="after")
        assert a.running and b.running

        a_stats = a.stats()
        b_stats = b.stats()
        expected: dict[str, int] = {}
        for _, _, reason in CORPUS:
            expected[reason] = expected.get(reason, 0) + 1
        for reason, count in expected.items():
            assert a_stats["drops"].get(reason, 0) >= count, (reason, a_stats["drops"])
        assert a_stats["dropped"] >= len(CORPUS) + len(generated) // 2
        # b heard nothing of it: a forwarded none of the refused payloads
        assert {k: v for k, v in b_stats["drops"].items() if k != "replay"} == {}
        assert b.count("inbound", id="spoof-1") == b.count("inbound", id="spoof-2") == 0
        assert a.count("inbound", id="spoof-1") == 0
        # each (peer, reason) is logged once a minute, however many arrive
        assert a.count("payload_dropped", reason="spoofed_sender") == 1
        assert a.count("payload_dropped", reason="not_json") == 1
