"""Client frames: what is published, and the error frame for everything else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from companion.bridge.frames import (
    MAX_FRAME_BYTES,
    FrameError,
    PublishRequest,
    decode_frame,
    error_frame,
    interpret_request,
)
from companion.protocol import Action, Message, Query, QueryResult


def message_body(**params: Any) -> dict[str, Any]:
    base = {"id": "m-1", "from": "user_yamada", "to": ["companion_aya"], "message": "hello"}
    base.update(params)
    return {"jsonrpc": "2.0", "method": "message.send", "params": base}


def test_aikyo_tutorial_frame_is_published_as_a_message() -> None:
    frame = json.dumps({"topic": "messages", "body": message_body()})
    obj = decode_frame(frame)
    request = interpret_request(obj)
    assert isinstance(request, PublishRequest)
    assert request.topic == "messages"
    assert isinstance(request.envelope, Message)
    assert request.envelope.params.message == "hello"
    assert request.sender == "user_yamada"


def test_binary_frames_are_accepted_like_text() -> None:
    frame = json.dumps({"topic": "messages", "body": message_body()}).encode()
    assert isinstance(interpret_request(decode_frame(frame)), PublishRequest)


def test_query_result_and_action_and_query_are_accepted() -> None:
    result = {"jsonrpc": "2.0", "id": "q-1", "result": {"success": True, "body": {"spoken": True}}}
    req = interpret_request({"topic": "queries", "body": result})
    assert isinstance(req, PublishRequest) and isinstance(req.envelope, QueryResult)
    assert req.sender is None
    query = {"jsonrpc": "2.0", "method": "query.send", "id": "q-2", "params": {"from": "user_a", "type": "x"}}
    req = interpret_request({"topic": "queries", "body": query})
    assert isinstance(req, PublishRequest) and isinstance(req.envelope, Query)
    action = {
        "jsonrpc": "2.0",
        "method": "action.send",
        "params": {"from": "user_a", "name": "wave", "params": {}},
    }
    req = interpret_request({"topic": "actions", "body": action})
    assert isinstance(req, PublishRequest) and isinstance(req.envelope, Action)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("{not json", "not_json"),
        (b"\xff\xfe", "not_utf8"),
        ("NaN", "not_json"),
        ("x" * (MAX_FRAME_BYTES + 1), "too_large"),
    ],
)
def test_undecodable_frames(data: str | bytes, code: str) -> None:
    result = decode_frame(data)
    assert isinstance(result, FrameError)
    assert result.code == code


@pytest.mark.parametrize(
    ("obj", "paths"),
    [
        ([1, 2], [[]]),
        ({}, [["topic"], ["body"]]),
        ({"topic": 3, "body": {}}, [["topic"]]),
        ({"topic": "messages", "body": []}, [["body"]]),
        ({"topic": "messages"}, [["body"]]),
    ],
)
def test_badly_shaped_frames_name_every_problem(obj: Any, paths: list[list[str]]) -> None:
    result = interpret_request(obj)
    assert isinstance(result, FrameError)
    assert result.code == "invalid_frame"
    assert [list(i.path) for i in result.issues] == paths


def test_states_and_unknown_topics_are_refused_with_a_hint() -> None:
    states = interpret_request({"topic": "states", "body": {}})
    assert isinstance(states, FrameError) and states.code == "unknown_topic"
    assert "among companions" in states.message
    other = interpret_request({"topic": "chat", "body": {}})
    assert isinstance(other, FrameError) and other.code == "unknown_topic"
    assert "messages, queries, actions" in other.message


def test_invalid_body_points_at_the_field_and_echoes_the_id() -> None:
    body = message_body()
    del body["params"]["to"]
    result = interpret_request({"topic": "messages", "body": body})
    assert isinstance(result, FrameError)
    assert result.code == "invalid_body"
    assert result.ref == "m-1"
    assert ("body", "params", "to") in [i.path for i in result.issues]


def test_wrong_method_for_topic_is_invalid_body() -> None:
    result = interpret_request({"topic": "actions", "body": message_body()})
    assert isinstance(result, FrameError) and result.code == "invalid_body"


def test_clients_cannot_speak_as_a_companion() -> None:
    result = interpret_request({"topic": "messages", "body": message_body(**{"from": "companion_aya"})})
    assert isinstance(result, FrameError)
    assert result.code == "forbidden_sender"
    assert result.issues[0].path == ("body", "params", "from")


def test_error_frame_keeps_zod_shape_and_adds_code() -> None:
    result = interpret_request({"topic": 1})
    assert isinstance(result, FrameError)
    frame = json.loads(error_frame(result))
    assert set(frame) == {"error"}
    err = frame["error"]
    assert err["name"] == "FrameError"
    assert err["code"] == "invalid_frame"
    assert err["message"]
    assert {"path": ["topic"], "message": "expected a string, got number"} in err["issues"]
    assert "ref" not in err


def test_a_lone_surrogate_is_refused_and_the_error_frame_can_still_be_sent() -> None:
    """``"\\ud800"`` is valid JSON but not text: the body is refused, and the error frame that
    echoes the id is still encodable (it is written as JSON escapes, pure ASCII)."""
    for body in (
        message_body(id="\ud800"),
        message_body(message="hi \udfff"),
        message_body(**{"from": "user_\ud800"}),
    ):
        error = interpret_request(decode_frame(json.dumps({"topic": "messages", "body": body})))
        assert isinstance(error, FrameError) and error.code == "invalid_body"
        error.to_json().encode("utf-8")
    assert json.loads(error_frame(FrameError("invalid_body", "x", ref="\ud800")))["error"]["ref"] == "\ud800"
