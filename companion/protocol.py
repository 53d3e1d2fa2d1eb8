"""The wire: pydantic models of aikyo's JSON-RPC 2.0 envelopes and a parser that never raises.

Everything that crosses the network is one of these models. Inbound bytes go through
:func:`parse_payload` exactly once, at the edge; past it, code handles typed values only.

Strictness mirrors aikyo's zod schemas (``packages/server/schema``): top-level envelopes,
``State`` params and ``Metadata`` reject unknown keys; the ``params`` of Message, Action and
Query, and a QueryResult's ``result``, drop unknown keys. Optional fields may be absent but
not ``null`` (zod's ``.optional()`` accepts only ``undefined``).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

__all__ = [
    "ACTIONS",
    "APPROVAL_QUERY",
    "MAX_PAYLOAD_BYTES",
    "MESSAGES",
    "NODE_TOPICS",
    "PRESENCE_MAX_ADDRS",
    "PRESENCE_MAX_LOST",
    "PRESENCE_MAX_TTL",
    "PREVIEWS",
    "QUERIES",
    "SPEAK_QUERY",
    "STATES",
    "TOPICS",
    "USER_ID_PREFIX",
    "Action",
    "ActionParams",
    "ClosingStage",
    "Message",
    "MessageParams",
    "Metadata",
    "Payload",
    "PayloadError",
    "Presence",
    "PresenceParams",
    "PresenceRequest",
    "PresenceRequestParams",
    "Query",
    "QueryParams",
    "QueryResult",
    "QueryResultBody",
    "State",
    "StateParams",
    "canonical_json",
    "encode",
    "encode_presence",
    "encode_states",
    "loads_json",
    "new_id",
    "parse_metadata",
    "parse_payload",
    "parse_presence",
]

MESSAGES: Final = "messages"
STATES: Final = "states"
QUERIES: Final = "queries"
ACTIONS: Final = "actions"
TOPICS: Final[tuple[str, ...]] = (MESSAGES, STATES, QUERIES, ACTIONS)
PREVIEWS: Final = "companion-previews/1"
"""Our own topic, which aikyo nodes and clients do not subscribe to: a speaker's ``message.send``
exactly as it will go out on :data:`MESSAGES`, published once its text is complete and while it
is still voiced, so the next turn's model work starts early (held until the message itself
arrives and matches; see docs/architecture.md, "One turn, through the code")."""
NODE_TOPICS: Final[tuple[str, ...]] = (*TOPICS, PREVIEWS)
"""Every topic a node subscribes to and validates: aikyo's and our previews."""

MAX_PAYLOAD_BYTES: Final = 64 * 1024
"""Default size limit for one topic payload; larger payloads are dropped before parsing."""

COMPANION_ID_PREFIX: Final = "companion_"
USER_ID_PREFIX: Final = "user_"
"""What a person's id starts with (a client speaks as ``user_...``)."""

SPEAK_QUERY: Final = "speak"
"""The query type a companion sends to have its line voiced; a client with a voice answers it
once the audio has finished."""

APPROVAL_QUERY: Final = "approval"
"""The query type a companion sends before an action that needs a person's yes (clients know it
by this name); only approvers the operator allows may answer it."""

ClosingStage: TypeAlias = Literal["none", "pre-closing", "closing", "terminal"]
CLOSING_ORDER: Final[tuple[ClosingStage, ...]] = ("none", "pre-closing", "closing", "terminal")


def new_id() -> str:
    """A fresh random id for messages, queries and calls (a UUID4, as aikyo uses)."""
    return str(uuid.uuid4())


_WIRE: Final = {"wire": True}
"""Validation context for payloads from the network (stricter than building models in Python)."""


def _from_wire(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("wire"))


class _Strict(BaseModel):
    """Unknown keys rejected, no type coercion (zod ``.strict()``)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, populate_by_name=True, frozen=True, serialize_by_alias=True
    )


class _Stripping(BaseModel):
    """Unknown keys dropped, no type coercion (a plain zod object)."""

    model_config = ConfigDict(
        extra="ignore", strict=True, populate_by_name=True, frozen=True, serialize_by_alias=True
    )

    @model_validator(mode="before")
    @classmethod
    def _optional_is_not_null(cls, data: Any, info: ValidationInfo) -> Any:
        """On the wire, zod's ``.optional()`` refuses an explicit ``null``; so do we."""
        if _from_wire(info) and isinstance(data, dict):
            for name, field in cls.model_fields.items():
                key = field.alias or name
                if not field.is_required() and key in data and data[key] is None:
                    raise ValueError(f"{key} may be omitted but not null")
        return data


JsonObject: TypeAlias = dict[str, Any]


class Metadata(_Strict):
    """What a companion tells its peers about itself over ``/aikyo/metadata/1.0.0``."""

    id: str
    name: str
    personality: str
    story: str
    sample: str


class MessageParams(_Stripping):
    id: str
    from_: str = Field(alias="from")
    to: list[str]
    message: str
    metadata: JsonObject | None = None


class Message(_Strict):
    """``message.send``: one utterance in the conversation (topic ``messages``)."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["message.send"] = "message.send"
    params: MessageParams

    @classmethod
    def create(
        cls,
        sender: str,
        to: list[str],
        text: str,
        metadata: JsonObject | None = None,
        id: str | None = None,
    ) -> Message:
        return cls(
            params=MessageParams(
                id=id or new_id(), from_=sender, to=list(to), message=text, metadata=metadata
            )
        )


class StateParams(_Strict):
    from_: str = Field(alias="from")
    state: Literal["speak", "listen"]
    importance: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]
    selected: bool
    closing: ClosingStage = "none"


class State(_Strict):
    """``state.send``: one companion's wish to speak or listen; the ``states`` topic carries a list."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["state.send"] = "state.send"
    params: StateParams

    @classmethod
    def create(
        cls,
        sender: str,
        state: Literal["speak", "listen"],
        importance: float,
        selected: bool,
        closing: ClosingStage = "none",
    ) -> State:
        return cls(
            params=StateParams(
                from_=sender, state=state, importance=importance, selected=selected, closing=closing
            )
        )


class QueryParams(_Stripping):
    from_: str = Field(alias="from")
    type: str
    body: JsonObject | None = None
    metadata: JsonObject | None = None
    """Our extensions (a ``speak`` query's place in its line); aikyo's plain zod object drops it."""


class Query(_Strict):
    """``query.send``: a companion asks its clients for something (e.g. ``speak``) on ``queries``."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["query.send"] = "query.send"
    id: str
    params: QueryParams

    @classmethod
    def create(
        cls,
        sender: str,
        type: str,
        body: JsonObject | None = None,
        id: str | None = None,
        metadata: JsonObject | None = None,
    ) -> Query:
        params = QueryParams(from_=sender, type=type, body=body, metadata=metadata)
        return cls(id=id or new_id(), params=params)


class QueryResultBody(_Stripping):
    success: bool
    body: JsonObject


class QueryResult(_Strict):
    """A client's answer to a Query, matched by ``id`` (also on ``queries``)."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: str
    result: QueryResultBody | None = None
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _optional_is_not_null(cls, data: Any, info: ValidationInfo) -> Any:
        if _from_wire(info) and isinstance(data, dict):
            for key in ("result", "error"):
                if key in data and data[key] is None:
                    raise ValueError(f"{key} may be omitted but not null")
        return data


class ActionParams(_Stripping):
    from_: str = Field(alias="from")
    name: str
    params: JsonObject
    metadata: JsonObject | None = None


class Action(_Strict):
    """``action.send``: an instruction to clients (move, light, progress) on topic ``actions``."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["action.send"] = "action.send"
    params: ActionParams

    @classmethod
    def create(
        cls,
        sender: str,
        name: str,
        params: JsonObject,
        metadata: JsonObject | None = None,
    ) -> Action:
        return cls(params=ActionParams(from_=sender, name=name, params=params, metadata=metadata))


PRESENCE_MAX_TTL: Final = 300
"""The longest time to live an announcement may ask for (seconds): one captured announcement
can keep a companion listed for at most this long."""

SEQ_MAX: Final = 2**53 - 1
"""The largest integer JavaScript's JSON.parse reads exactly."""


PRESENCE_MAX_ADDRS: Final = 8
"""The most addresses one announcement may carry."""
PRESENCE_MAX_LOST: Final = 16
"""The most peers one announcement may report lost."""

PeerIdText = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
"""A libp2p peer id in base58 (shape only; the table looks it up, never dials it)."""


class PresenceParams(_Strict):
    metadata: Metadata
    seq: Annotated[int, Field(ge=0, le=SEQ_MAX)]
    """Milliseconds since the Unix epoch when it was published, strictly increasing per sender."""
    ttl: Annotated[int, Field(ge=1, le=PRESENCE_MAX_TTL)]
    """Seconds the announcement stays valid; the sender refreshes well before."""
    leaving: bool
    addrs: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=300)]], Field(max_length=PRESENCE_MAX_ADDRS)
    ]
    """Where the sender listens (multiaddrs ending in ``/p2p/<its peer id>``): how a node that
    must connect to it (a ring neighbour) finds it without asking the DHT."""
    lost: Annotated[
        dict[PeerIdText, Annotated[int, Field(ge=0, le=SEQ_MAX)]], Field(max_length=PRESENCE_MAX_LOST)
    ]
    """Peers whose direct connection to the sender closed without notice in the last few
    seconds, each with the last ``seq`` the sender heard from it: a hint that they may be gone,
    which each of them refutes by announcing itself again."""


class Presence(_Strict):
    """``presence.announce``: a companion says it is on the network (our own topic, see
    :mod:`companion.node.announcements`; aikyo nodes do not subscribe to it). Every ``params`` key is
    required."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["presence.announce"] = "presence.announce"
    params: PresenceParams


class PresenceRequestParams(_Strict):
    pass


class PresenceRequest(_Strict):
    """``presence.request``: a node that just joined (a companion, a bridge, the clients' node)
    asks every companion to announce now, instead of waiting up to an interval for the periodic
    announcements. No fields: it changes nothing but when the next
    announcement goes out."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["presence.request"] = "presence.request"
    params: PresenceRequestParams = PresenceRequestParams()


Envelope: TypeAlias = Message | State | Query | QueryResult | Action
Payload: TypeAlias = Message | list[State] | Query | QueryResult | Action

PayloadErrorReason: TypeAlias = Literal[
    "too_large", "not_utf8", "not_json", "invalid_unicode", "unknown_topic", "wrong_method", "invalid"
]


@dataclass(frozen=True, slots=True)
class PayloadError:
    """Why a payload was refused. ``reason`` is a stable label for counters; ``detail`` is for logs."""

    reason: PayloadErrorReason
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


_METHOD_FOR_TOPIC: Final[dict[str, str]] = {
    MESSAGES: "message.send",
    PREVIEWS: "message.send",
    QUERIES: "query.send",
    ACTIONS: "action.send",
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json(text: str) -> Any:
    """JSON.parse semantics: no NaN/Infinity literals (``ValueError``, as for any bad JSON)."""
    return json.loads(text, parse_constant=_reject_constant)


def _describe_validation(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(root)"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - len(parts)
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _may_hold_surrogates(text: str) -> bool:
    """Whether JSON text may decode to a surrogate: only a ``\\uD800``-``\\uDFFF`` escape can
    (UTF-8 cannot encode one). Text without a backslash, most of it, costs one ``memchr``."""
    first = text.find("\\")
    return first >= 0 and _SURROGATE_ESCAPE.search(text, first) is not None


def _lone_surrogate_at(obj: Any) -> str | None:
    """The path of the first string (key or value) holding a lone surrogate, else ``None``.

    ``json.loads`` turns ``"\\ud800"`` into a string that is not Unicode text: it cannot be
    encoded as UTF-8, so every later write of it (the store, a log line, a reply quoting it)
    raises. Iterative, so nesting the parser accepted cannot overflow the stack here."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where or "(root)"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return f"{where or '(root)'} (a key)"
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}.{i}" if where else str(i), item) for i, item in enumerate(value))
    return None


def _decode(data: Any, max_bytes: int) -> Any:
    """Bytes to a JSON value of Unicode text only, or the :class:`PayloadError` saying why not."""
    if not isinstance(data, bytes | bytearray | memoryview):
        return PayloadError("invalid", f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        return PayloadError("too_large", f"{len(data)} bytes > limit {max_bytes}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        return PayloadError("not_utf8", str(exc))
    try:
        obj = loads_json(text)
    except (ValueError, RecursionError) as exc:
        return PayloadError("not_json", str(exc)[:200])
    if _may_hold_surrogates(text):
        where = _lone_surrogate_at(obj)
        if where is not None:
            return PayloadError("invalid_unicode", f"{where[:200]}: a lone UTF-16 surrogate is not text")
    return obj


def parse_metadata(data: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Metadata | PayloadError:
    """A metadata protocol answer (``/aikyo/metadata/1.0.0``) as :class:`Metadata`, or why not.

    The same checks as :func:`parse_payload` (UTF-8, JSON, Unicode text only, aikyo's strict
    schema); never raises."""
    try:
        obj = _decode(data, max_bytes)
        if isinstance(obj, PayloadError):
            return obj
        return Metadata.model_validate(obj, context=_WIRE)
    except ValidationError as exc:
        return PayloadError("invalid", _describe_validation(exc))
    except RecursionError:
        return PayloadError("not_json", "nested too deeply")
    except Exception as exc:  # a parser must not raise; keep the type for the log
        return PayloadError("invalid", f"{type(exc).__name__}: {exc}")


def parse_payload(topic: str, data: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Payload | PayloadError:
    """Turn raw topic bytes into a typed value, or a :class:`PayloadError` saying why not.

    Never raises, whatever the bytes: the caller is usually a gossipsub validator, where an
    exception would take the whole node down.
    """
    try:
        return _parse(topic, data, max_bytes)
    except RecursionError:
        return PayloadError("not_json", "nested too deeply")
    except Exception as exc:  # a parser must not raise; keep the type for the log
        return PayloadError("invalid", f"{type(exc).__name__}: {exc}")


def _parse(topic: str, data: bytes, max_bytes: int) -> Payload | PayloadError:
    if topic not in NODE_TOPICS:
        return PayloadError("unknown_topic", f"no such topic {topic!r}")
    obj = _decode(data, max_bytes)
    if isinstance(obj, PayloadError):
        return obj
    try:
        if topic == STATES:
            if not isinstance(obj, list):
                return PayloadError("invalid", "the states topic carries a JSON array of State")
            return [State.model_validate(item, context=_WIRE) for item in obj]
        if not isinstance(obj, dict):
            return PayloadError("invalid", f"expected a JSON object, got {type(obj).__name__}")
        method = obj.get("method")
        if topic == QUERIES:
            if method is None:
                return QueryResult.model_validate(obj, context=_WIRE)
            if method != "query.send":
                return PayloadError("wrong_method", f"{method!r} is not sent on {topic!r}")
            return Query.model_validate(obj, context=_WIRE)
        expected = _METHOD_FOR_TOPIC[topic]
        if method != expected:
            return PayloadError("wrong_method", f"{method!r} is not sent on {topic!r}")
        if topic in (MESSAGES, PREVIEWS):
            return Message.model_validate(obj, context=_WIRE)
        return Action.model_validate(obj, context=_WIRE)
    except ValidationError as exc:
        return PayloadError("invalid", _describe_validation(exc))


def parse_presence(
    data: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES
) -> Presence | PresenceRequest | PayloadError:
    """A presence announcement as :class:`Presence` (or a :class:`PresenceRequest`), or why not:
    the checks of :func:`parse_payload` (size, UTF-8, JSON, Unicode text only, strict schema);
    never raises."""
    try:
        obj = _decode(data, max_bytes)
        if isinstance(obj, PayloadError):
            return obj
        if isinstance(obj, dict) and obj.get("method") == "presence.request":
            return PresenceRequest.model_validate(obj, context=_WIRE)
        if isinstance(obj, dict) and obj.get("method") != "presence.announce":
            return PayloadError(
                "wrong_method", f"{str(obj.get('method'))[:80]!r} is not a presence announcement"
            )
        return Presence.model_validate(obj, context=_WIRE)
    except ValidationError as exc:
        return PayloadError("invalid", _describe_validation(exc))
    except RecursionError:
        return PayloadError("not_json", "nested too deeply")
    except Exception as exc:  # a parser must not raise; keep the type for the log
        return PayloadError("invalid", f"{type(exc).__name__}: {exc}")


# --- Serialization: JSON.stringify of the schema-ordered object -------------------------------


def encode(envelope: Envelope) -> bytes:
    """The bytes to publish: compact JSON in schema field order, as aikyo's nodes send it."""
    return _stringify(envelope.model_dump(by_alias=True, exclude_none=True)).encode("utf-8")


def encode_states(states: list[State]) -> bytes:
    """The ``states`` topic payload: a JSON array of State envelopes."""
    return _stringify([s.model_dump(by_alias=True, exclude_none=True) for s in states]).encode("utf-8")


def encode_presence(presence: Presence | PresenceRequest) -> bytes:
    """A presence announcement's bytes: compact JSON in schema field order, like every payload."""
    return _stringify(presence.model_dump(by_alias=True)).encode("utf-8")


def canonical_json(message: Message) -> str:
    """``JSON.stringify`` of a parsed Message as an aikyo 1.6 node computes it (leader election).

    Schema field order, object keys inside ``metadata`` in JavaScript property order, JavaScript
    number spelling, non-ASCII kept, lone surrogates escaped.
    """
    return _stringify(message.model_dump(by_alias=True, exclude_none=True))


_MAX_ARRAY_INDEX: Final = 2**32 - 2


def _is_array_index(key: str) -> bool:
    """JavaScript orders these keys first, ascending: canonical decimal integers below 2**32-1."""
    if not key.isdigit() or not key.isascii():
        return False
    if len(key) > 1 and key[0] == "0":
        return False
    return int(key) <= _MAX_ARRAY_INDEX


def _js_key_order(obj: dict[str, Any]) -> list[str]:
    indices = sorted((k for k in obj if _is_array_index(k)), key=int)
    return indices + [k for k in obj if not _is_array_index(k)]


_ESCAPES: Final[dict[str, str]] = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]*')
"""A string JSON.stringify writes as it is: no quote, backslash, control character or lone
surrogate (the common case, matched in C; every publish encodes each string of its envelope)."""


def _js_string(value: str) -> str:
    if _PLAIN.fullmatch(value):
        return f'"{value}"'
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def js_number(value: float | int) -> str:
    """ECMAScript ``Number::toString`` for a JSON number (every JS number is a double)."""
    try:
        number = float(value)
    except OverflowError:
        return "null"
    if math.isnan(number) or math.isinf(number):
        return "null"
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    digits, exponent = _shortest_digits(abs(number))
    k = len(digits)
    n = exponent  # value = 0.digits * 10**n
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
        body = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + body


def _shortest_digits(number: float) -> tuple[str, int]:
    """Shortest round-trip digits and the exponent n with value = 0.d1d2... * 10**n."""
    text = repr(number)  # Python's repr is the shortest round-trip form, like JS
    mantissa, _, exp = text.partition("e")
    exp10 = int(exp) if exp else 0
    whole, _, frac = mantissa.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    leading_zeros = len(whole + frac) - len((whole + frac).lstrip("0"))
    n = len(whole) + exp10 - leading_zeros
    digits = digits.rstrip("0") or "0"
    return digits, n


def _stringify(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _js_string(value)
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, dict):
        items = (f"{_js_string(k)}:{_stringify(value[k])}" for k in _js_key_order(value))
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_stringify(v) for v in value) + "]"
    raise TypeError(f"cannot serialize {type(value).__name__} as JSON")


def parse_message_text(text: str) -> Message | PayloadError:
    """Convenience for tests and tools: parse a Message from JSON text."""
    result = parse_payload(MESSAGES, text.encode("utf-8", "surrogatepass"))
    if isinstance(result, PayloadError):
        return result
    assert isinstance(result, Message)
    return result
