"""Client frames of aikyo's Firehose protocol, as pure functions: text in, a decision out.

A client sends ``{"topic": T, "body": {...}}``; the body is published on topic ``T``. The
bridge answers bad input with an *error frame* ``{"error": {...}}`` and keeps the connection
open. aikyo sends ``{"error": <ZodError>}``, whose JSON is ``{"issues": [...], "name": ...}``;
our error object keeps that shape (``name``, ``issues`` with ``path`` and ``message``) and adds
a stable ``code`` and a one-line ``message`` so a person or a program can act on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Envelope,
    Message,
    PayloadError,
    Query,
    QueryResult,
    loads_json,
    parse_payload,
)

__all__ = [
    "CLIENT_TOPICS",
    "MAX_FRAME_BYTES",
    "FrameError",
    "FrameErrorCode",
    "Issue",
    "PublishRequest",
    "decode_frame",
    "error_frame",
    "frame_ref",
    "interpret_request",
    "session_frame",
]

CLIENT_TOPICS: Final[tuple[str, ...]] = (MESSAGES, QUERIES, ACTIONS)
"""Topics a client may publish on. ``states`` is turn-taking among companions, and its payload
is an array, which a Firehose ``body`` (an object) cannot carry."""

MAX_FRAME_BYTES: Final = 96 * 1024
"""Largest client frame we read: a full-size payload plus the ``topic``/``body`` wrapper."""

COMPANION_PREFIX: Final = "companion_"

SESSION_KEY: Final = "session"
SESSION_MIN: Final = 16
SESSION_MAX: Final = 128

FrameErrorCode: TypeAlias = Literal[
    "too_large",
    "not_utf8",
    "not_json",
    "invalid_frame",
    "unknown_topic",
    "invalid_body",
    "forbidden_sender",
    "hook_failed",
    "publish_failed",
    "rate_limited",
    "unknown_query",
    "already_answered",
    "invalid_session",
]


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in a frame: where (a JSON path) and what."""

    path: tuple[str | int, ...]
    message: str


@dataclass(frozen=True, slots=True)
class FrameError:
    """Why a client frame was not published; sent back to that client as an error frame."""

    code: FrameErrorCode
    message: str
    issues: tuple[Issue, ...] = ()
    ref: str | None = None
    """The id the frame carried (``body.params.id`` or ``body.id``), so a client can match it."""
    retry_after: float | None = None
    """``rate_limited``: seconds until the bridge takes a frame from this client again."""

    def to_json(self) -> str:
        return error_frame(self)


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A valid client frame: publish ``envelope`` on ``topic``."""

    topic: str
    envelope: Envelope
    sender: str | None = field(default=None)
    """``params.from`` of the envelope when it has one (for logs)."""


def error_frame(error: FrameError) -> str:
    """The JSON text of an error frame."""
    body: dict[str, Any] = {
        "name": "FrameError",
        "code": error.code,
        "message": error.message,
        "issues": [{"path": list(i.path), "message": i.message} for i in error.issues],
    }
    if error.ref is not None:
        body["ref"] = error.ref
    if error.retry_after is not None:
        body["retry_after"] = math.ceil(error.retry_after * 1000) / 1000  # never 0: it is a wait
    return json.dumps({"error": body}, ensure_ascii=True, separators=(",", ":"))


def decode_frame(data: str | bytes) -> Any | FrameError:
    """Text or binary WebSocket data to a JSON value (aikyo accepts both: ``evt.toString()``)."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > MAX_FRAME_BYTES:
        return FrameError("too_large", f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return FrameError("not_utf8", f"frame is not UTF-8: {exc}")
    else:
        text = data
    try:
        return loads_json(text)
    except (ValueError, RecursionError) as exc:
        return FrameError("not_json", f"frame is not JSON: {str(exc)[:200]}")


def session_frame(obj: Any) -> str | FrameError | None:
    """A *session frame* ``{"session": KEY}``: one client connected more than once (the page
    switching to WebRTC, or reconnecting) names itself with the same random ``KEY``, so a
    query delivered to one of its connections may be answered from another. ``None`` if
    ``obj`` is not a session frame; the key, or the error that refuses it."""
    if not isinstance(obj, dict) or SESSION_KEY not in obj:
        return None
    key = obj[SESSION_KEY]
    if set(obj) != {SESSION_KEY} or not isinstance(key, str):
        shape = 'a session frame is {"session": "<random key>"} and nothing else'
        return FrameError("invalid_session", shape)
    if not SESSION_MIN <= len(key) <= SESSION_MAX or not key.isascii() or not key.isprintable():
        return FrameError(
            "invalid_session",
            f"a session key is {SESSION_MIN} to {SESSION_MAX} printable ASCII characters, random "
            "(e.g. a UUID): whoever knows it may answer this client's queries",
        )
    return key


def frame_ref(obj: Any) -> str | None:
    """The id a decoded client frame carries (``body.params.id`` or ``body.id``), if any."""
    if isinstance(obj, Mapping) and isinstance(obj.get("body"), Mapping):
        return _ref_of(obj["body"])
    return None


def _ref_of(body: Mapping[str, Any]) -> str | None:
    params = body.get("params")
    if isinstance(params, Mapping) and isinstance(params.get("id"), str):
        return str(params["id"])
    if isinstance(body.get("id"), str):
        return str(body["id"])
    return None


def interpret_request(obj: Any) -> PublishRequest | FrameError:
    """Check a decoded ``{"topic", "body"}`` request and turn it into a typed envelope.

    Pure: the same checks for a plain client frame and for a receive hook's output.
    """
    issues = _shape_issues(obj)
    if issues:
        return FrameError(
            "invalid_frame",
            'a frame is {"topic": "messages"|"queries"|"actions", "body": {...}}',
            tuple(issues),
        )
    topic: str = obj["topic"]
    body: dict[str, Any] = obj["body"]
    ref = _ref_of(body)
    if topic not in CLIENT_TOPICS:
        hint = (
            "states are exchanged among companions only"
            if topic == STATES
            else f"publish on one of {', '.join(CLIENT_TOPICS)}"
        )
        return FrameError(
            "unknown_topic", f"cannot publish on topic {topic!r}: {hint}", (Issue(("topic",), hint),), ref
        )
    try:
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    except (ValueError, TypeError) as exc:
        return FrameError("invalid_body", f"body is not JSON: {exc}", (Issue(("body",), str(exc)),), ref)
    parsed = parse_payload(topic, data)
    if isinstance(parsed, PayloadError):
        return FrameError(
            "invalid_body",
            f"body is not a valid {_expected(topic)}: {parsed.detail}",
            tuple(_detail_issues(parsed.detail)),
            ref,
        )
    assert isinstance(parsed, Message | Query | QueryResult | Action)
    sender = None if isinstance(parsed, QueryResult) else parsed.params.from_
    if sender is not None and sender.startswith(COMPANION_PREFIX):
        return FrameError(
            "forbidden_sender",
            f"clients cannot send as a companion ({sender!r}); use an id such as 'user_NAME'",
            (Issue(("body", "params", "from"), "must not start with 'companion_'"),),
            ref,
        )
    return PublishRequest(topic, parsed, sender)


def _expected(topic: str) -> str:
    return {
        MESSAGES: "message.send",
        QUERIES: "query.send or query result",
        ACTIONS: "action.send",
    }.get(topic, topic)


def _shape_issues(obj: Any) -> list[Issue]:
    if not isinstance(obj, dict):
        return [Issue((), f"expected an object, got {_json_type(obj)}")]
    issues: list[Issue] = []
    if "topic" not in obj:
        issues.append(Issue(("topic",), "required"))
    elif not isinstance(obj["topic"], str):
        issues.append(Issue(("topic",), f"expected a string, got {_json_type(obj['topic'])}"))
    if "body" not in obj:
        issues.append(Issue(("body",), "required"))
    elif not isinstance(obj["body"], dict):
        issues.append(Issue(("body",), f"expected an object, got {_json_type(obj['body'])}"))
    return issues


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _detail_issues(detail: str) -> Sequence[Issue]:
    """Split the parser's ``loc: msg; loc: msg`` detail into issues under ``body``."""
    out: list[Issue] = []
    for part in detail.split("; "):
        where, sep, msg = part.partition(": ")
        if not sep or where.startswith("and "):
            out.append(Issue(("body",), part))
            continue
        path: list[str | int] = ["body"]
        if where != "(root)":
            path.extend(int(p) if p.isdigit() else p for p in where.split("."))
        out.append(Issue(tuple(path), msg))
    return out
