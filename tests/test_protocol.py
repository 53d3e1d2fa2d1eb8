"""The wire protocol: models, the never-raising parser, and aikyo-exact serialization."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from companion.conversation.rules import select_leader
from companion.protocol import (
    ACTIONS,
    MAX_PAYLOAD_BYTES,
    MESSAGES,
    NODE_TOPICS,
    PREVIEWS,
    QUERIES,
    STATES,
    TOPICS,
    Action,
    Message,
    Metadata,
    PayloadError,
    Query,
    QueryResult,
    State,
    canonical_json,
    encode,
    encode_states,
    js_number,
    parse_metadata,
    parse_payload,
)
from support.cards import metadata as md

VECTORS = Path(__file__).resolve().parent / "vectors" / "leader.json"


def _vectors() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(VECTORS.read_text(encoding="utf-8"))
    return data


def test_leader_vectors_all_match_aikyo() -> None:
    vectors = _vectors()
    assert len(vectors) == 300
    mismatches = []
    for index, vector in enumerate(vectors):
        parsed = parse_payload(MESSAGES, vector["raw"].encode("utf-8"))
        if not vector["valid"]:
            assert isinstance(parsed, PayloadError), index
            continue
        assert isinstance(parsed, Message), (index, parsed)
        text = canonical_json(parsed)
        digest = hashlib.md5(text.encode("utf-8")).hexdigest()
        leader = select_leader(parsed, vector["active"])
        if (text, digest, leader) != (vector["canonical"], vector["md5"], vector["leader"]):
            mismatches.append(index)
    assert mismatches == []


def _message(**params: Any) -> bytes:
    body = {"id": "m1", "from": "companion_a", "to": ["companion_b"], "message": "hi"}
    body.update(params)
    return json.dumps({"jsonrpc": "2.0", "method": "message.send", "params": body}).encode()


def _state(**params: Any) -> dict[str, Any]:
    body = {"from": "companion_a", "state": "speak", "importance": 5, "selected": False}
    body.update(params)
    return {"jsonrpc": "2.0", "method": "state.send", "params": body}


def test_message_roundtrip_keeps_schema_order_and_non_ascii() -> None:
    message = Message.create("companion_a", ["companion_b", "user_1"], "こんにちは", {"emotion": "joy"})
    wire = encode(message)
    assert wire.decode("utf-8").startswith('{"jsonrpc":"2.0","method":"message.send","params":{"id":')
    assert "こんにちは".encode() in wire
    assert parse_payload(MESSAGES, wire) == message


def test_message_params_drop_unknown_keys_but_envelope_rejects_them() -> None:
    parsed = parse_payload(MESSAGES, _message(extra="x"))
    assert isinstance(parsed, Message)
    assert "extra" not in encode(parsed).decode()
    envelope = json.loads(_message())
    envelope["extra"] = 1
    result = parse_payload(MESSAGES, json.dumps(envelope).encode())
    assert isinstance(result, PayloadError) and result.reason == "invalid"


def test_optional_fields_may_be_absent_but_not_null() -> None:
    assert isinstance(parse_payload(MESSAGES, _message()), Message)
    result = parse_payload(MESSAGES, _message(metadata=None))
    assert isinstance(result, PayloadError) and "metadata" in result.detail


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"message": 5}, "message"),
        ({"to": "companion_b"}, "to"),
        ({"from": None}, "from"),
        ({"metadata": [1, 2]}, "metadata"),
    ],
)
def test_message_wrong_types_are_refused_with_the_field(change: dict[str, Any], field: str) -> None:
    result = parse_payload(MESSAGES, _message(**change))
    assert isinstance(result, PayloadError)
    assert result.reason == "invalid" and field in result.detail


def test_states_array_parses_and_defaults_closing() -> None:
    result = parse_payload(STATES, json.dumps([_state(), _state(closing="terminal")]).encode())
    assert isinstance(result, list) and len(result) == 2
    assert result[0].params.closing == "none" and result[1].params.closing == "terminal"


@pytest.mark.parametrize(
    "bad",
    [
        {"importance": 11},
        {"importance": -0.5},
        {"state": "shout"},
        {"selected": 1},
        {"closing": "over"},
        {"extra": True},
    ],
)
def test_state_params_are_strict(bad: dict[str, Any]) -> None:
    result = parse_payload(STATES, json.dumps([_state(**bad)]).encode())
    assert isinstance(result, PayloadError) and result.reason == "invalid"


def test_states_topic_needs_an_array() -> None:
    result = parse_payload(STATES, json.dumps(_state()).encode())
    assert isinstance(result, PayloadError) and "array" in result.detail


def test_queries_topic_carries_queries_and_results() -> None:
    query = Query.create("companion_a", "speak", {"text": "hello"})
    assert parse_payload(QUERIES, encode(query)) == query
    ok = QueryResult.model_validate({"id": query.id, "result": {"success": True, "body": {}}})
    assert parse_payload(QUERIES, encode(ok)) == ok
    failed = QueryResult(id=query.id, error="no speaker")
    assert parse_payload(QUERIES, encode(failed)) == failed


def test_action_roundtrip() -> None:
    action = Action.create("companion_a", "wave", {"hand": "left"}, {"call_id": "c1"})
    assert parse_payload(ACTIONS, encode(action)) == action


def test_wrong_method_for_topic_is_named() -> None:
    action = Action.create("companion_a", "wave", {})
    result = parse_payload(MESSAGES, encode(action))
    assert isinstance(result, PayloadError) and result.reason == "wrong_method"


def test_metadata_is_strict() -> None:
    md("a", name="A")
    with pytest.raises(ValueError):
        Metadata.model_validate(
            {"id": "companion_a", "name": "A", "personality": "p", "story": "s", "sample": "x", "age": 3}
        )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "not_utf8"),
        (b"{", "not_json"),
        (b'{"a": NaN}', "not_json"),
        (b"[" * 60_000, "not_json"),
        (b'"just a string"', "invalid"),
        (b"x" * (MAX_PAYLOAD_BYTES + 1), "too_large"),
    ],
)
def test_hostile_bytes_get_a_reason(data: bytes, reason: str) -> None:
    result = parse_payload(MESSAGES, data)
    assert isinstance(result, PayloadError)
    assert result.reason == reason


def test_previews_carry_a_message_on_a_topic_aikyo_never_sees() -> None:
    message = Message.create("companion_a", ["user_x"], "Three boats came in.", {"emotion": "calm"})
    assert parse_payload(PREVIEWS, encode(message)) == message
    wrong = parse_payload(PREVIEWS, encode(Action.create("companion_a", "wave", {})))
    assert isinstance(wrong, PayloadError) and wrong.reason == "wrong_method"
    assert PREVIEWS not in TOPICS and set(NODE_TOPICS) == {*TOPICS, PREVIEWS}


def test_unknown_topic() -> None:
    result = parse_payload("secrets", b"{}")
    assert isinstance(result, PayloadError) and result.reason == "unknown_topic"


def test_states_encoding_is_a_json_array() -> None:
    states = [State.create("companion_a", "speak", 7.5, True, "closing")]
    wire = encode_states(states)
    assert wire.startswith(b'[{"jsonrpc":"2.0","method":"state.send","params":{"from":"companion_a"')
    assert parse_payload(STATES, wire) == states


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.1, "0.1"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (0.000001, "0.000001"),
        (123456789012345678901234, "1.2345678901234569e+23"),
        (2**53 + 1, "9007199254740992"),
        (-3.14159, "-3.14159"),
        (float("inf"), "null"),
        (10**400, "null"),
    ],
)
def test_javascript_number_spelling(value: float, text: str) -> None:
    assert js_number(value) == text


def test_metadata_keys_follow_javascript_property_order() -> None:
    message = Message.create("companion_a", [], "", {"b": 1, "10": 2, "2": 3, "01": 4, "a": 5}, id="x")
    assert canonical_json(message).endswith('"metadata":{"2":3,"10":2,"b":1,"01":4,"a":5}}}')


def test_lone_surrogates_are_escaped_like_javascript() -> None:
    # a message built here (never one parsed from the wire: those are refused, below)
    message = Message.create("companion_a", ["companion_b"], "\ud800x", id="m1")
    assert '"message":"\\ud800x"' in canonical_json(message)
    encode(message).decode("utf-8")  # still valid UTF-8 on the wire


_LONE = "\ud800"
_SURROGATE_PAYLOADS = [
    (MESSAGES, _message(message=_LONE), "params.message"),
    (MESSAGES, _message(message="ok " + "\udfff"), "params.message"),
    (MESSAGES, _message(id=_LONE), "params.id"),
    (MESSAGES, _message(**{"from": "user_" + _LONE}), "params.from"),
    (MESSAGES, _message(to=["companion_b", _LONE]), "params.to.1"),
    (MESSAGES, _message(metadata={"emotion": _LONE}), "params.metadata.emotion"),
    (MESSAGES, _message(metadata={_LONE: 1}), "params.metadata (a key)"),
    (MESSAGES, _message(metadata={"deep": [{"x": [_LONE]}]}), "params.metadata.deep.0.x.0"),
    (MESSAGES, _message(extra_param=_LONE), "params.extra_param"),  # even where it is dropped
    (STATES, json.dumps([_state(**{"from": _LONE})]).encode(), "0.params.from"),
    (
        QUERIES,
        json.dumps(
            {**json.loads(encode(Query.create("companion_a", "speak", id="q"))), "id": _LONE}
        ).encode(),
        "id",
    ),
    (
        QUERIES,
        encode(Query.create("companion_a", "speak", {"message": _LONE}, id="q")),
        "params.body.message",
    ),
    (QUERIES, json.dumps({"jsonrpc": "2.0", "id": "q", "error": _LONE}).encode(), "error"),
    (
        QUERIES,
        json.dumps({"jsonrpc": "2.0", "id": "q", "result": {"success": True, "body": {"a": _LONE}}}).encode(),
        "result.body.a",
    ),
    (ACTIONS, encode(Action.create("companion_a", "wave", {"who": _LONE})), "params.params.who"),
]


@pytest.mark.parametrize(("topic", "data", "where"), _SURROGATE_PAYLOADS)
def test_lone_surrogates_anywhere_are_refused_as_invalid_unicode(topic: str, data: bytes, where: str) -> None:
    assert b"\\ud" in data.lower()  # valid JSON, valid UTF-8: the escape is plain ASCII
    result = parse_payload(topic, data)
    assert isinstance(result, PayloadError), result
    assert result.reason == "invalid_unicode"
    assert result.detail.startswith(where + ":"), result.detail
    str(result).encode("utf-8")  # the detail itself is loggable


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    emoji = parse_payload(MESSAGES, _message(message="\U0001f600"))  # json.dumps writes a pair
    assert isinstance(emoji, Message) and emoji.params.message == "\U0001f600"
    literal = parse_payload(
        MESSAGES,
        b'{"jsonrpc":"2.0","method":"message.send","params":{"id":"m",'
        b'"from":"user_a","to":[],"message":"\\\\ud800"}}',
    )
    assert isinstance(literal, Message) and literal.params.message == "\\ud800"


def test_metadata_answer_is_parsed_with_the_same_checks() -> None:
    good = {"id": "companion_a", "name": "A", "personality": "p", "story": "s", "sample": "x"}
    assert parse_metadata(json.dumps(good).encode()) == Metadata(**good)
    for bad, reason in [
        (json.dumps({**good, "name": _LONE}).encode(), "invalid_unicode"),
        (json.dumps({**good, "age": 3}).encode(), "invalid"),
        (b"\xff", "not_utf8"),
        (b"[" * 60_000, "not_json"),
        (b"x" * 70_000, "too_large"),
    ]:
        result = parse_metadata(bad)
        assert isinstance(result, PayloadError) and result.reason == reason, (bad[:40], result)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(["message", "id", "from"]),
    text=st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=6),
)
def test_any_string_with_a_lone_surrogate_is_refused_and_others_parse(field: str, text: str) -> None:
    result = parse_payload(MESSAGES, _message(**{field: text}))
    decoded = json.loads(json.dumps(text))  # a high surrogate escape followed by a low one is a pair
    if any(0xD800 <= ord(c) <= 0xDFFF for c in decoded):
        assert isinstance(result, PayloadError) and result.reason == "invalid_unicode"
    else:
        assert isinstance(result, Message)
        assert result.model_dump(by_alias=True)["params"][field] == decoded


# --- properties: nothing escapes the parser, whatever the bytes --------------------------------

_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
_json = st.recursive(
    _json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.sampled_from([*TOPICS, "other"]), data=st.binary(max_size=512))
def test_random_bytes_never_raise(topic: str, data: bytes) -> None:
    result = parse_payload(topic, data)
    assert isinstance(result, PayloadError | Message | list | Query | QueryResult | Action)


_VALID_SAMPLES = [
    (MESSAGES, encode(Message.create("companion_a", ["companion_b"], "hi", {"emotion": "joy"}))),
    (STATES, encode_states([State.create("companion_a", "listen", 0, False)])),
    (QUERIES, encode(Query.create("companion_a", "speak", {"text": "x"}))),
    (ACTIONS, encode(Action.create("companion_a", "wave", {"n": 1}))),
]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    sample=st.sampled_from(_VALID_SAMPLES),
    position=st.integers(min_value=0, max_value=400),
    insert=st.binary(max_size=8),
    cut=st.integers(min_value=0, max_value=8),
)
def test_mutated_payloads_never_raise(
    sample: tuple[str, bytes], position: int, insert: bytes, cut: int
) -> None:
    topic, data = sample
    position %= len(data) + 1
    mutated = data[:position] + insert + data[position + cut :]
    parse_payload(topic, mutated)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.sampled_from(TOPICS), body=_json)
def test_structurally_wrong_json_never_raises(topic: str, body: Any) -> None:
    envelope = {"jsonrpc": "2.0", "method": "message.send", "params": body}
    for candidate in (body, envelope, [envelope]):
        parse_payload(topic, json.dumps(candidate).encode())


@settings(max_examples=200)
@given(
    text=st.text(max_size=40),
    to=st.lists(st.text(max_size=12), max_size=4),
    metadata=st.dictionaries(st.text(max_size=6), _json, max_size=4),
)
def test_encode_then_parse_is_identity(text: str, to: list[str], metadata: dict[str, Any]) -> None:
    message = Message.create("companion_a", to, text, metadata)
    parsed = parse_payload(MESSAGES, encode(message))
    assert isinstance(parsed, Message)
    assert canonical_json(parsed) == canonical_json(message)
