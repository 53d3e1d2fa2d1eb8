"""Hostile inputs for the node's edge, shared by the integration tests and ``scripts/bench_hostile.py``:
a corpus of known-bad payloads with the reason each must be dropped for, and hypothesis
strategies for payloads (per topic) and for whole pubsub RPCs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.pubsub.pb import rpc_pb2

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


def message(
    sender: str, text: str, id: str, to: tuple[str, ...] = ("companion_a", "companion_b"), **metadata: Any
) -> bytes:
    return encode(Message.create(sender, list(to), text, metadata or None, id=id))


VALID = json.loads(message("companion_x", "ok", "v"))
VALID_STATE = json.loads(encode_states([State.create("companion_x", "speak", 5, True)]))[0]
VALID_QUERY = json.loads(encode(Query.create("companion_x", "speak", {"text": "t"}, id="q")))
VALID_ACTION = json.loads(encode(Action.create("companion_x", "wave", {"n": 1})))


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


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
TEMPLATES: dict[str, Any] = {
    MESSAGES: VALID,
    STATES: [VALID_STATE],
    QUERIES: VALID_QUERY,
    ACTIONS: VALID_ACTION,
}


def _mutated(topic: str, key: str, value: Any) -> bytes:
    """The topic's valid envelope with one params field replaced (or added) by ``value``."""
    template = TEMPLATES[topic]
    envelope = dict(template[0] if topic == STATES else template)
    envelope["params"] = {**envelope["params"], key: value}
    return json.dumps([envelope] if topic == STATES else envelope).encode()


def _crowded(topic: str, count: int, size: int, tail: str) -> bytes:
    """A well-formed envelope (under the 64 KiB limit) with many and long fields: ``count`` ids
    in ``to`` (or states in the array, keys in a body), strings ``size`` long ending in ``tail``
    (a lone surrogate passes as an escape). What a node logs of it must stay bounded."""
    long = "w" * size + tail
    others = [f"companion_{n:05d}_{'y' * 18}" for n in range(count)]
    if topic == STATES:
        extra = {**VALID_STATE, "params": {**VALID_STATE["params"], "state": "listen", "selected": False}}
        states = [VALID_STATE] + [{**extra, "params": {**extra["params"], "from": o}} for o in others]
        return json.dumps(states).encode()
    template = TEMPLATES[topic]
    params = dict(template["params"])
    if topic == MESSAGES:
        params.update(id=f"crowded-{long}", to=others, message=long, metadata={o: long[:50] for o in others})
    elif topic == QUERIES:
        params.update(type=long, body={o: n for n, o in enumerate(others)})
    else:
        params.update(name=long, params={o: long[:50] for o in others})
    envelope = {**template, "params": params}
    if topic == QUERIES:
        envelope["id"] = f"crowded-{long}"
    return json.dumps(envelope).encode()


def payloads(topics: tuple[str, ...] = TOPICS) -> st.SearchStrategy[tuple[str, bytes]]:
    """(topic, bytes): arbitrary bytes, arbitrary JSON, each topic's envelope with one field
    wrong (a non-string, a lone surrogate, a huge or deep value), and well-formed envelopes
    crowded with long fields and long lists."""
    odd_value = JSON_VALUE | st.sampled_from(["\ud800", "a\udfffb", "x" * 70_000, 10**400, -(2**70)])
    field = st.sampled_from(["id", "from", "to", "message", "state", "importance", "name", "type", "body"])
    topic = st.sampled_from(topics)
    envelope = st.builds(lambda t, k, v: (t, _mutated(t, k, v)), topic, field, odd_value)
    raw = st.tuples(topic, st.binary(max_size=400) | JSON_VALUE.map(lambda v: json.dumps(v).encode()))
    crowded = st.builds(
        lambda t, n, size, tail: (t, _crowded(t, n, size, tail)),
        topic,
        st.integers(0, 700),
        st.integers(0, 12_000),
        st.sampled_from(["", "\ud800", "\udfff!"]),
    )
    return raw | envelope | crowded


def rpcs() -> st.SearchStrategy[bytes]:
    """Serialized pubsub RPCs with arbitrary fields: forged messages, odd subscriptions and
    control messages, garbage sender records; and plain garbage."""
    topic = st.sampled_from([*TOPICS, "", "other"]) | st.text(max_size=40)
    msg = st.builds(
        rpc_pb2.Message,
        from_id=st.binary(max_size=40),
        data=st.binary(max_size=200),
        seqno=st.binary(max_size=10),
        topicIDs=st.lists(topic, max_size=3),
        signature=st.binary(max_size=70),
        key=st.binary(max_size=40),
    )
    ids = st.lists(st.binary(max_size=50), max_size=5)
    control = st.builds(
        rpc_pb2.ControlMessage,
        ihave=st.lists(st.builds(rpc_pb2.ControlIHave, topicID=topic, messageIDs=ids), max_size=3),
        iwant=st.lists(st.builds(rpc_pb2.ControlIWant, messageIDs=ids), max_size=3),
        graft=st.lists(st.builds(rpc_pb2.ControlGraft, topicID=topic), max_size=3),
        prune=st.lists(
            st.builds(rpc_pb2.ControlPrune, topicID=topic, backoff=st.integers(0, 2**64 - 1)), max_size=3
        ),
        idontwant=st.lists(st.builds(rpc_pb2.ControlIDontWant, messageIDs=ids), max_size=3),
    )
    subs = st.lists(st.builds(rpc_pb2.RPC.SubOpts, subscribe=st.booleans(), topicid=topic), max_size=5)
    rpc = st.builds(
        lambda s, p, c, r: rpc_pb2.RPC(
            subscriptions=s, publish=p, control=c, senderRecord=r
        ).SerializeToString(),
        subs,
        st.lists(msg, max_size=3),
        control,
        st.binary(max_size=60),
    )
    return rpc | st.binary(max_size=300)


def collect(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` examples of ``strategy``, the same ones every run."""
    found: list[Any] = []

    @settings(max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def gather(example: Any) -> None:
        found.append(example)

    gather()
    return found
