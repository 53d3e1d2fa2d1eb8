"""A fake language-model server on 127.0.0.1 for provider tests: real HTTP, scripted replies.

It speaks just enough of two wire formats: OpenAI-compatible chat completions
(``POST /v1/chat/completions``, ``GET /v1/models``) and Anthropic messages
(``POST /v1/messages``, ``GET /v1/models``). Each model request pops the next scripted
:class:`Reply` (or calls a function of the request body that returns one); an unscripted
request gets HTTP 500 so a test that sends more requests than it expects fails loudly.
Every request is recorded. It runs in a thread and is stopped by the test.

A :class:`ServerProfile` makes it behave on the wire like one real server (see
:data:`PROFILES`): which ``tool_choice`` values and ``response_format`` types it refuses (with
that server's status and error body), which it ignores, and how it returns tool calls. A scripted
reply says what the *model* means; the profile decides what of it reaches the client, as the
real server would: a tool call the server does not let through (its tools or forcing ignored)
arrives as the profile's plain prose, and a tool call under a JSON-schema grammar arrives as
that JSON in the text.

A request with ``"stream": true`` is answered as the real servers stream: server-sent events
over a chunked response, a first chunk with the role and no content, the text a token at a
time, a tool call's id and name first and then its arguments as fragments of JSON cut anywhere
(inside strings and escapes too), ``finish_reason`` in a chunk of its own, the usage in a last
chunk with no choices (when ``stream_options.include_usage`` asks for it and the profile sends
one: llama-cpp-python's never does), then ``[DONE]``;
several events may share one write and one event may be split across two. With ``ttft`` and
``token_rate`` the first token comes after ``ttft`` seconds and the others at ``token_rate``
tokens a second, as a hosted or a local model writes; :attr:`Reply.cut_after` breaks the
connection after that many tokens, as a server that dies mid-answer does; with
:attr:`FakeLLMServer.after_finish` what follows the finish chunk waits, as llama-cpp-python's
``[DONE]`` waits for its cache copy. A :attr:`ServerProfile.serial` server (llama-cpp-python)
answers one request at a time, in the order they came. :attr:`FakeLLMServer.most_in_flight` says
how many requests were ever at the server at once, :attr:`FakeLLMServer.most_answering` how many
answers were ever written at once.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "PROFILES",
    "CooperativeModel",
    "FakeLLMServer",
    "Recorded",
    "Reply",
    "ServerProfile",
    "addressees",
    "free_port",
    "hang",
    "http_error",
    "running_server",
    "text",
    "tokens",
    "tool_call",
    "tool_calls",
]

_HANG_LIMIT = 20.0
"""A hung request is released after this many seconds even if nobody stops it."""
TOGETHER_LIMIT = 10.0
"""Seconds an answer waits at most for :attr:`FakeLLMServer.answer_together` requests."""


@dataclass(frozen=True)
class Reply:
    """One scripted answer: tool calls and/or text, an HTTP error, or a hang."""

    calls: tuple[tuple[str, Any], ...] = ()
    text: str | None = None
    status: int = 200
    error: str = ""
    hang: bool = False
    cut_after: int | None = None
    """Streamed: the connection breaks after this many tokens (no finish, no ``[DONE]``)."""


def tool_call(name: str, args: Mapping[str, Any] | str) -> Reply:
    """A reply calling one tool; ``args`` as a dict, or a raw string (to send broken JSON)."""
    return Reply(calls=((name, args),))


def tool_calls(*calls: tuple[str, Mapping[str, Any]]) -> Reply:
    return Reply(calls=tuple(calls))


def text(content: str) -> Reply:
    return Reply(text=content)


def http_error(status: int, message: str = "scripted failure") -> Reply:
    return Reply(status=status, error=message)


def hang() -> Reply:
    """Hold the request without answering until the client gives up or the server stops."""
    return Reply(hang=True)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    refused: bool = False
    """The server profile refused this request (an HTTP error, no model involved)."""
    at: float = field(default_factory=time.monotonic)
    """When the request arrived (``time.monotonic``)."""
    interrupted: bool = False
    """Its stream ended early because another request waited (:attr:`ServerProfile.interrupts`)."""
    served: float | None = None
    """When its answer began (``time.monotonic``): at once, or on a :attr:`ServerProfile.serial`
    server once the answers before it were complete."""
    finished: float | None = None
    """When its answer was out as far as its client can tell (``time.monotonic``): set just
    before the chunk with the ``finish_reason`` (a whole answer: the response) is written, so
    before anything the client does about it; what follows that chunk may still hold a serial
    server (:attr:`answered`). A request that got no answer: when the server was done with it."""
    answered: float | None = None
    """When its answer was complete (``time.monotonic``), if it was."""


ReplyScript = Reply | Callable[[Any], Reply]


_PROSE = "Hope you're doing well! How's your day been so far?"
"""What a small model writes when its server did not let a tool call through (measured: SmolLM2
behind llama-cpp-python answered ``tool_choice: "required"`` with this kind of line)."""


@dataclass(frozen=True)
class Outcome:
    """What a server makes of one request: a refusal, or what the model may produce."""

    status: int = 200
    error: Any = None
    """The error body, in the server's own shape."""
    forced: str | None = None
    """The tool whose call the server enforces (a named tool choice it honours)."""
    forced_any: bool = False
    """A tool call of some tool is enforced (``"required"`` honoured)."""
    tools_visible: bool = False
    """The model may call the request's tools (they reached it and the server parses calls)."""
    json: bool = False
    """The answer is constrained to JSON (``response_format`` honoured)."""


@dataclass(frozen=True)
class ServerProfile:
    """How one real OpenAI-compatible server treats tools, tool choices and response formats.

    ``screen(body)`` is the server's decision for a request. Every choice below is what the real
    server does, from its source and from measurements against it (see
    ``companion/models/servers.py``).
    """

    name: str
    owned_by: str
    tools: str = "ok"
    """``ok``; ``refused`` (llama.cpp without --jinja); ``unsupported_model`` (an Ollama model
    without tool support)."""
    choices: Mapping[str, str] = field(default_factory=dict)
    """How each ``tool_choice`` kind (``named``, ``required``, ``auto``, ``absent``) is treated:
    ``honour``, ``ignore`` (tools do not reach the model, prose comes back), ``as_auto`` (the
    model may call tools but nothing is forced), or ``refuse``."""
    formats: Mapping[str, str] = field(default_factory=dict)
    """How each ``response_format`` type (``json_schema``, ``json_object``) is treated:
    ``honour`` or ``refuse``."""
    refusal: Callable[[str, str], tuple[int, Any]] = field(default=lambda what, value: (400, {}))
    """``(what, value) -> (status, body)`` of a refused request."""
    null_content: str = "ok"
    """``refuse``: an assistant message with ``content: null`` fails the request validation
    (llama-cpp-python, measured: HTTP 500 ``7 validation errors ...``)."""
    tool_call_content: Any = None
    """``content`` beside tool calls (``None``, or ``""`` as Ollama sends)."""
    call_id: str = "call_{seq}_{i}"
    cut_call_finish: str = "length"
    """The ``finish_reason`` of a streamed tool call the token limit cut: llama-cpp-python (measured,
    0.3.36, a named tool) says ``tool_calls`` beside arguments whose JSON stops mid-string."""
    stream_usage: bool = True
    """``False``: a stream carries no usage chunk, even when ``stream_options.include_usage``
    asks for one (llama-cpp-python 0.3.36, measured: its server ignores ``stream_options``)."""
    stream_auto: str = "ok"
    """``refuse``: a streamed request whose tools the model may call at will (``tool_choice``
    ``auto`` or none) fails (llama-cpp-python's chatml-function-calling raises "Automatic
    streaming tool choice is not supported": HTTP 500)."""
    serial: bool = False
    """One answer at a time, in the order the requests came: a request waits until the answer
    before it was complete, its stream to the end (what follows the finish chunk too). The
    llama-cpp-python server takes a lock around each request for its one ``Llama`` and holds it
    while it streams; a companion that sends two requests side by side there gets the second
    only after the first, and a test of that needs the fake to queue them the same way."""
    props: bool = False
    """``GET /props`` answers the server's settings, ``total_slots`` among them (llama.cpp's
    server; beside ``/v1``, not under it)."""
    interrupts: bool = False
    """A stream in progress ends as soon as another request waits for its turn (on a
    :attr:`serial` profile): ``data: [DONE]`` at its next token, with no finish chunk, so the
    client reads a line cut mid-sentence as a stream that ended. llama-cpp-python 0.3.36 does
    this by default (``interrupt_requests``; measured: a story streaming for 0.5 s ended after 24
    chunks, no ``finish_reason``, when a second request came). :attr:`Recorded.interrupted` marks
    the answers so cut."""

    def screen(self, body: Mapping[str, Any]) -> Outcome:
        tools = body.get("tools") or []
        if self.null_content == "refuse" and any(
            m.get("role") == "assistant" and m.get("content") is None for m in body.get("messages") or []
        ):
            return Outcome(*self.refusal("messages", "null content"))
        choice = body.get("tool_choice")
        kind = "absent" if choice is None else "named" if isinstance(choice, Mapping) else str(choice)
        if tools and self.tools == "refused":
            return Outcome(*self.refusal("tools", ""))
        if choice is not None and self.tools == "refused":
            return Outcome(*self.refusal("tool_choice", kind))
        if tools and self.tools == "unsupported_model":
            return Outcome(*self.refusal("tools", str(body.get("model", ""))))
        json_constrained = False
        fmt = body.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
            treatment = self.formats.get(str(fmt["type"]), "refuse")
            if treatment == "refuse":
                return Outcome(*self.refusal("response_format", str(fmt["type"])))
            json_constrained = True
        if not tools:
            return Outcome(json=json_constrained)
        treatment = self.choices.get(kind, "honour")
        if treatment == "refuse":
            return Outcome(*self.refusal("tool_choice", kind))
        if self.stream_auto == "refuse" and body.get("stream") and kind in ("auto", "absent"):
            return Outcome(*self.refusal("stream", kind))
        if treatment == "ignore":
            return Outcome(json=json_constrained)
        if treatment == "as_auto" or kind in ("auto", "absent"):
            return Outcome(tools_visible=True, json=json_constrained)
        if kind == "named":
            assert isinstance(choice, Mapping)
            return Outcome(forced=str(choice["function"]["name"]), tools_visible=True)
        return Outcome(forced_any=True, tools_visible=True)

    def realise(self, outcome: Outcome, reply: Reply) -> Reply:
        """What of the model's ``reply`` the client receives under ``outcome``."""
        if not reply.calls:
            return reply
        if outcome.tools_visible:
            if outcome.forced is not None:
                return Reply(calls=tuple(c for c in reply.calls if c[0] == outcome.forced) or reply.calls[:1])
            return reply
        if outcome.json:
            _, args = reply.calls[0]
            return Reply(text=args if isinstance(args, str) else json.dumps(args))
        # The model writes out what it meant to say (SmolLM2's prose varies from turn to turn).
        _, args = reply.calls[0]
        meant = args.get("message") if isinstance(args, Mapping) else None
        return Reply(text=meant if isinstance(meant, str) and meant else _PROSE)


def _openai_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _llama_cpp_refusal(what: str, value: str) -> tuple[int, Any]:
    message = {
        "tools": "tools param requires --jinja flag",
        "tool_choice": "Unsupported param: tool_choice",
    }.get(what, f'response_format type must be one of "text" or "json_object", but got: {value}')
    return 500, {"error": {"code": 500, "message": message, "type": "server_error"}}


def _llama_cpp_python_refusal(what: str, value: str) -> tuple[int, Any]:
    if what == "messages":
        message = (
            "7 validation errors:\n  {'type': 'literal_error', 'loc': ('body', 'messages', 2, "
            "'ChatCompletionRequestSystemMessage', 'role'), 'msg': \"Input should be 'system'\", "
            "'input': 'assistant'}"
        )
        return 500, {
            "error": {"message": message, "type": "internal_server_error", "param": None, "code": None}
        }
    if what == "response_format":
        message = (
            "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
            f"'msg': \"Input should be 'text' or 'json_object'\", 'input': '{value}'}}"
        )
        return 500, {
            "error": {"message": message, "type": "internal_server_error", "param": None, "code": None}
        }
    if what == "stream":
        message = "Automatic streaming tool choice is not supported"
        return 500, {
            "error": {"message": message, "type": "internal_server_error", "param": None, "code": None}
        }
    # chatml-function-calling: `assert tool_choice == "auto"` fails, with an empty message.
    return 500, {"error": {"message": "", "type": "internal_server_error", "param": None, "code": None}}


def _ollama_refusal(what: str, value: str) -> tuple[int, Any]:
    return 400, _openai_error(f"registry.ollama.ai/library/{value} does not support tools", "api_error")


def _vllm_refusal(what: str, value: str) -> tuple[int, Any]:
    if what == "tool_choice":
        message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    else:
        message = f"response_format type {value} is not supported"
    return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def _lmstudio_refusal(what: str, value: str) -> tuple[int, Any]:
    return 400, {"error": "'response_format.type' must be 'json_schema' or 'text'"}


_BOTH_FORMATS: dict[str, str] = {"json_schema": "honour", "json_object": "honour"}

PROFILES: dict[str, ServerProfile] = {
    "openai": ServerProfile("openai", "system", formats=_BOTH_FORMATS),
    "llama.cpp": ServerProfile(
        "llama.cpp",
        "llamacpp",
        tools="refused",
        props=True,
        formats=_BOTH_FORMATS,
        refusal=_llama_cpp_refusal,
        call_id="{rand}",
    ),
    "llama.cpp-jinja": ServerProfile(
        "llama.cpp-jinja",
        "llamacpp",
        props=True,
        # A named choice is read as "auto"; a forced call came back as text with small templates.
        choices={"named": "as_auto", "required": "ignore"},
        formats=_BOTH_FORMATS,
        refusal=_llama_cpp_refusal,
        call_id="{rand}",
    ),
    "llama-cpp-python": ServerProfile(
        "llama-cpp-python",
        "me",
        choices={"required": "ignore", "auto": "ignore", "absent": "ignore"},
        formats={"json_object": "honour"},
        refusal=_llama_cpp_python_refusal,
        null_content="refuse",
        call_id="call__0_{name}_cmpl-{rand}",
        cut_call_finish="tool_calls",
        stream_usage=False,
        serial=True,
        interrupts=True,
    ),
    "llama-cpp-python-fc": ServerProfile(
        "llama-cpp-python-fc",
        "me",
        choices={"required": "refuse", "absent": "ignore"},
        stream_auto="refuse",
        formats={"json_object": "honour"},
        refusal=_llama_cpp_python_refusal,
        null_content="refuse",
        call_id="call__0_{name}_cmpl-{rand}",
        stream_usage=False,
        serial=True,
        interrupts=True,
    ),
    "ollama": ServerProfile(
        "ollama",
        "library",
        choices={"named": "as_auto", "required": "as_auto"},  # tool_choice is not read at all
        formats=_BOTH_FORMATS,
        refusal=_ollama_refusal,
        tool_call_content="",
        call_id="call_{rand}",
    ),
    "ollama-no-tools": ServerProfile(
        "ollama-no-tools",
        "library",
        tools="unsupported_model",
        formats=_BOTH_FORMATS,
        refusal=_ollama_refusal,
    ),
    "vllm": ServerProfile(
        "vllm",
        "vllm",
        choices={"auto": "refuse"},  # without --enable-auto-tool-choice
        formats=_BOTH_FORMATS,
        refusal=_vllm_refusal,
        call_id="chatcmpl-tool-{rand}",
    ),
    "lmstudio": ServerProfile(
        "lmstudio",
        "organization_owner",
        formats={"json_schema": "honour"},
        refusal=_lmstudio_refusal,
    ),
}
"""Every server profile by name. ``openai`` (the default) honours everything."""


@dataclass
class FakeLLMServer:
    """Scripted replies in, recorded requests out. Use :func:`running_server` to run one."""

    models: tuple[str, ...] = ("fake-1",)
    profile: ServerProfile = field(default_factory=lambda: PROFILES["openai"])
    """The real server this one behaves like on the wire."""
    api_key: str | None = None
    """When set, requests without this key (Bearer or x-api-key) get HTTP 401."""
    models_status: int = 200
    """Set to e.g. 404 to make ``GET /v1/models`` fail."""
    hang_models: bool = False
    """Hold ``GET /v1/models`` without answering (like a hung server)."""
    slots: int | None = 4
    """What ``GET /props`` tells of the slots on a :attr:`ServerProfile.props` profile (4:
    llama.cpp's ``llama-server`` run without ``-np`` since late 2025; ``None``: a ``/props``
    without ``total_slots``). With 1 the server answers one request at a time, in order, as a
    :attr:`ServerProfile.serial` one does."""
    hang_props: bool = False
    """Hold ``GET /props`` without answering (a server that never tells its slots)."""
    props_status: int = 200
    """Another status makes ``GET /props`` fail with it."""
    props_raw: bytes | None = None
    """Answer ``GET /props`` with these bytes, not JSON (a page some other program serves)."""
    models_gate: threading.Event | None = None
    """When given, ``GET /v1/models`` is answered only once this is set (or after the hang
    limit): a server that is slow to come up. ``arrived`` is set when such a request came."""
    ttft: float = 0.0
    """Streamed answers: seconds before the first token (after the request arrived)."""
    answer_together: int = 0
    """Hold every model answer until this many model requests have arrived (at most
    :data:`TOGETHER_LIMIT` seconds): requests a client sends side by side are then in flight
    together however slow the machine is, so a test of "side by side" waits on that, not on
    ``ttft`` being longer than a busy machine's delays."""
    token_rate: float = 0.0
    """Streamed answers: tokens a second after the first (0: as fast as the socket takes them)."""
    after_finish: threading.Event | None = None
    """Streamed OpenAI answers: what follows the chunk with the ``finish_reason`` (a usage chunk,
    ``[DONE]``) is held until this is set (at most :data:`_HANG_LIMIT` seconds), as
    llama-cpp-python with ``--cache true`` holds ``[DONE]`` while it copies its state.
    :attr:`finish_written` is set when that chunk has gone out, :attr:`done_written` when
    ``[DONE]`` has."""
    finish_written: threading.Event = field(default_factory=threading.Event)
    done_written: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    """Set when a hung request has arrived."""
    disconnected: threading.Event = field(default_factory=threading.Event)
    """Set when the client of a hung request closed its connection."""
    stopping: threading.Event = field(default_factory=threading.Event)
    most_in_flight: int = 0
    """The most model requests ever at the server at once, each from its arrival (its wait for
    its turn included) until its answer was out (:attr:`Recorded.finished`). 1: no client ever
    sent a request before the one before it was answered, so on a serial server none waited
    while another was written (where llama-cpp-python would cut that one short)."""
    most_answering: int = 0
    """The most model answers ever written at once (a :attr:`ServerProfile.serial` profile: 1)."""
    _in_flight: int = 0
    _answering_now: int = 0
    _tickets: int = 0
    """Model answers that asked for their turn so far (a serial profile serves them in order)."""
    _serving: int = 0
    """The ticket whose turn it is on a serial profile: every answer before it is complete."""
    _script: deque[ReplyScript] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _arrivals: threading.Condition = field(init=False)
    """Notified at each request recorded and at each answer complete (under :attr:`_lock`)."""

    def __post_init__(self) -> None:
        self._arrivals = threading.Condition(self._lock)

    @property
    def serial(self) -> bool:
        """Answers are written one at a time, in the order they were asked: a serial profile's, or
        a llama.cpp server's with one slot."""
        return self.profile.serial or (self.profile.props and self.slots == 1)

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *replies: ReplyScript) -> None:
        with self._lock:
            self._script.extend(replies)

    def _wait_together(self) -> None:
        """Block (this request's thread) until :attr:`answer_together` requests arrived."""
        with self._arrivals:
            self._arrivals.wait_for(
                lambda: sum(r.method == "POST" for r in self.requests) >= self.answer_together,
                timeout=TOGETHER_LIMIT,
            )

    @contextmanager
    def _answering(self, record: Recorded) -> Iterator[None]:
        """The block in which ``record``'s answer is written: on a :attr:`ServerProfile.serial`
        profile only once every answer that asked before it is complete (or the server stops)."""
        with self._arrivals:
            ticket = self._tickets
            self._tickets += 1
            while self.serial and self._serving != ticket and not self.stopping.is_set():
                self._arrivals.wait(0.05)  # woken when the answer before it ends; stopping is polled
            self._answering_now += 1
            self.most_answering = max(self.most_answering, self._answering_now)
            record.served = time.monotonic()
        try:
            yield
        finally:
            with self._arrivals:
                self._answering_now -= 1
                self._serving += 1
                self._arrivals.notify_all()

    def _came(self, record: Recorded) -> None:
        """A model request arrived: it is in flight until :meth:`_out`."""
        if isinstance(record.body, dict):
            with self._lock:
                self._in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self._in_flight)

    def _out(self, record: Recorded) -> None:
        """``record``'s answer is out (:attr:`Recorded.finished`); once, whatever calls it again."""
        with self._lock:
            if record.finished is None:
                record.finished = time.monotonic()
                if isinstance(record.body, dict):
                    self._in_flight -= 1

    def _someone_waits(self) -> bool:
        """Whether an answer asked for its turn after the one being written."""
        with self._lock:
            return self._tickets > self._serving + 1

    def model_requests(self) -> list[Recorded]:
        """The recorded generation requests (not model listings, nor a body that never arrived
        whole), oldest first."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and isinstance(r.body, dict)]

    def refusals(self) -> list[Recorded]:
        """The generation requests the profile refused (HTTP error), oldest first."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.refused]

    def unused_replies(self) -> int:
        with self._lock:
            return len(self._script)

    def _next(self, body: Any) -> Reply | None:
        with self._lock:
            script = self._script.popleft() if self._script else None
        if script is None:
            return None
        return script if isinstance(script, Reply) else script(body)


def plain_value(schema: Mapping[str, Any]) -> Any:
    """The plainest value a JSON Schema accepts (first enum value, minimum, false, empty)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {name: plain_value(sub) for name, sub in schema.get("properties", {}).items()}
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "array":
        return [plain_value(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    return "something"


_SCHEMA_IN_TEXT = re.compile(r"JSON Schema\)?:\s*")


class CooperativeModel:
    """A model that answers what each request asks, from what the request shows: the output
    tool's schema, the ``response_format`` schema, or the schema written in the instructions;
    and for speaking, a line to the recipients the prompt names (without a turn line naming them,
    to the senders of the lines the task follows). It rotates the speaker, one per
    states call, so a group conversation moves on. It calls tools when the request has tools and
    writes JSON or its line as text when it has none; the server profile decides what of that
    reaches the client."""

    def __init__(self) -> None:
        self.turn = 0
        self.lines = 0

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools") or []}
        messages = body.get("messages") or []
        system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
        # the last user turn: the task (earlier ones are the conversation's chat turns)
        user = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
        wanted = self._schema(body, tools, system + "\n" + user)
        if wanted is not None:
            name, schema = wanted
            args = self._states(schema) if _is_states(schema) else plain_value(schema)
            return tool_call(name, args) if name in tools else text(json.dumps(args))
        to = addressees(user)
        self.lines += 1
        line = f"Reply number {self.lines}."
        if "speak" in tools:
            return tool_call("speak", {"message": line, "to": to, "emotion": "happy"})
        return text(line)

    @staticmethod
    def _schema(
        body: Mapping[str, Any], tools: Mapping[str, Any], system: str
    ) -> tuple[str, dict[str, Any]] | None:
        for name in ("set_states", "set_params"):
            if name in tools:
                return name, tools[name]["parameters"]
        fmt = body.get("response_format")
        schema: Any = None
        if isinstance(fmt, Mapping):
            schema = fmt.get("schema") or (fmt.get("json_schema") or {}).get("schema")
        shown = _SCHEMA_IN_TEXT.search(system)
        if schema is None and shown is not None and "JSON object" in system:
            schema = json.JSONDecoder().raw_decode(system, shown.end())[0]
        if not isinstance(schema, dict):
            return None
        return ("set_states" if _is_states(schema) else "set_params"), schema

    def _states(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        count = schema["properties"]["speak"]["minItems"]
        speaker = self.turn % count
        self.turn += 1
        return {"speak": [7 if index == speaker else 0 for index in range(count)]}


def addressees(user: str) -> list[str]:
    """Whom a model answering the speaker's last user turn ``user`` addresses: the recipients its
    turn line names, or without one whoever spoke in the lines the task follows (``id: line``)."""
    address = re.search(r"Address: (.*?)\.(?:\n|$)", user)
    if address:
        return [a.strip() for a in address.group(1).split(",")]
    return list(dict.fromkeys(re.findall(r"^([\w.-]+): ", user.split("\n\n")[0], re.MULTILINE)))


def _is_states(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` is the leader's states answer (``companion.models.structured``): one
    number per companion under ``speak``, not a card's parameters."""
    speak = schema.get("properties", {}).get("speak")
    return isinstance(speak, Mapping) and speak.get("type") == "array" and "minItems" in speak


def _openai_completion(
    reply: Reply, model: str, seq: int, profile: ServerProfile, limit: int | None = None
) -> dict[str, Any]:
    """A whole answer; past ``limit`` tokens (the request's ``max_tokens``) it stops where the
    stream would (:func:`_openai_stream_events`), with its ``finish_reason``: text mid-word,
    tool-call arguments mid-JSON."""
    if limit is not None and _written(reply) > limit:
        return _cut_completion(reply, model, seq, profile, limit)
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.calls:
        if reply.text is None:
            message["content"] = profile.tool_call_content
        message["tool_calls"] = [
            {
                "id": profile.call_id.format(seq=seq, i=i, name=name, rand=f"{seq:08x}{i:04x}"),
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for i, (name, args) in enumerate(reply.calls)
        ]
    return {
        "id": f"chatcmpl-{seq}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.calls else "stop"}
        ],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": _written(reply),
            "total_tokens": 11 + _written(reply),
        },
    }


def _cut_completion(reply: Reply, model: str, seq: int, profile: ServerProfile, limit: int) -> dict[str, Any]:
    """The whole answer the stream cut at ``limit`` tokens adds up to."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = "length"
    for event, _token in _openai_stream_events(reply, model, seq, profile, usage=False, limit=limit):
        for choice in (event or {}).get("choices") or ():
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or ():
                call = calls.setdefault(part["index"], {"id": part.get("id"), "type": "function"})
                named = call.setdefault("function", {"name": part["function"].get("name"), "arguments": ""})
                named["arguments"] += part["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or profile.tool_call_content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "id": f"chatcmpl-{seq}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": limit, "total_tokens": 11 + limit},
    }


def _written(reply: Reply) -> int:
    """The tokens a reply's text and tool-call arguments take (:func:`tokens`): what a whole
    answer counts as completion and takes to generate."""
    written = (reply.text or "") + "".join(
        args if isinstance(args, str) else json.dumps(args, ensure_ascii=False) for _, args in reply.calls
    )
    return len(tokens(written))


def _finishes(event: dict[str, Any]) -> bool:
    """Whether an OpenAI stream's ``event`` is the chunk with its ``finish_reason``."""
    return any(choice.get("finish_reason") for choice in event.get("choices") or ())


def _sse(event: dict[str, Any] | None) -> bytes:
    """One server-sent event: ``[DONE]`` for ``None``; an Anthropic event (it has a ``type``)
    with its ``event:`` line as Anthropic sends it."""
    if event is None:
        return b"data: [DONE]\n\n"
    kind = event.get("type")
    head = f"event: {kind}\n" if isinstance(kind, str) else ""
    return f"{head}data: {json.dumps(event)}\n\n".encode()


_TOKEN = re.compile(r"\s*[^\s]{1,4}|\s+$")


def tokens(text: str) -> list[str]:
    """``text`` cut as a tokenizer roughly does: runs of up to four characters, each with the
    white space before it (about the four characters a token of English takes)."""
    return _TOKEN.findall(text)


def _openai_stream_events(
    reply: Reply, model: str, seq: int, profile: ServerProfile, usage: bool, limit: int | None = None
) -> Iterator[tuple[dict[str, Any] | None, bool]]:
    """``(event, is_token)`` of a streamed completion in order; ``None`` is ``[DONE]``. At
    ``limit`` tokens (the request's ``max_tokens``) the answer stops where it is, with
    ``finish_reason`` "length", as OpenAI's and llama.cpp's servers stop: mid-word, mid-JSON."""
    base = {"id": f"chatcmpl-{seq}", "object": "chat.completion.chunk", "created": 1_700_000_000}
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""}), False
    produced = 0
    finish = "tool_calls" if reply.calls else "stop"
    for piece in tokens(reply.text or ""):
        if produced == limit:
            finish = "length"
            break
        produced += 1
        yield chunk({"content": piece}), True
    for i, (name, args) in enumerate(reply.calls if finish != "length" else ()):
        call_id = profile.call_id.format(seq=seq, i=i, name=name, rand=f"{seq:08x}{i:04x}")
        head = {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        yield chunk({"tool_calls": [head]}), False
        for piece in tokens(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)):
            if produced == limit:
                finish = "length"
                break
            produced += 1
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), True
        if finish == "length":
            finish = profile.cut_call_finish
            break
    yield chunk({}, finish), False
    if usage:
        counted = {"prompt_tokens": 11, "completion_tokens": produced, "total_tokens": 11 + produced}
        yield {**base, "choices": [], "usage": counted}, False
    yield None, False


def _anthropic_stream_events(
    reply: Reply, model: str, seq: int
) -> Iterator[tuple[dict[str, Any] | None, bool]]:
    """``(event, is_token)`` of a streamed Anthropic message, as its SSE ``data`` lines (each
    carries its ``type``, which the SDK reads); no ``[DONE]``: ``message_stop`` ends it."""
    start = _anthropic_message(Reply(), model, seq)
    start.update(content=[], stop_reason=None, usage={"input_tokens": 11, "output_tokens": 1})
    yield {"type": "message_start", "message": start}, False
    index = produced = 0
    if reply.text:
        yield (
            {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            False,
        )
        for piece in tokens(reply.text):
            produced += 1
            yield (
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                },
                True,
            )
        yield {"type": "content_block_stop", "index": index}, False
        index += 1
    for i, (name, args) in enumerate(reply.calls):
        block = {"type": "tool_use", "id": f"toolu_{seq}_{i}", "name": name, "input": {}}
        yield {"type": "content_block_start", "index": index, "content_block": block}, False
        for piece in tokens(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)):
            produced += 1
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield {"type": "content_block_delta", "index": index, "delta": delta}, True
        yield {"type": "content_block_stop", "index": index}, False
        index += 1
    stop = {"stop_reason": "tool_use" if reply.calls else "end_turn", "stop_sequence": None}
    yield {"type": "message_delta", "delta": stop, "usage": {"output_tokens": produced}}, False
    yield {"type": "message_stop"}, False


def _anthropic_message(reply: Reply, model: str, seq: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for i, (name, args) in enumerate(reply.calls):
        content.append({"type": "tool_use", "id": f"toolu_{seq}_{i}", "name": name, "input": args})
    return {
        "id": f"msg_{seq}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": _written(reply)},
    }


def _handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: Any) -> Recorded:
            headers = {k.lower(): v for k, v in self.headers.items()}
            record = Recorded(self.command, self.path.split("?")[0], headers, body)
            with server._arrivals:
                server.requests.append(record)
                server._arrivals.notify_all()
            return record

        def _authorized(self) -> bool:
            if server.api_key is None:
                return True
            offered = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix(
                "Bearer "
            )
            if offered == server.api_key:
                return True
            self._send(401, {"error": {"type": "authentication_error", "message": "invalid api key"}})
            return False

        def do_GET(self) -> None:
            self._record(None)
            if not self._authorized():
                return
            if server.hang_models:
                self._hang()
                return
            if server.models_gate is not None:
                server.arrived.set()
                server.models_gate.wait(_HANG_LIMIT)
            if self.path.split("?")[0] == "/props" and server.profile.props:
                if server.hang_props:
                    self._hang()
                    return
                if server.props_status != 200:
                    self._send(server.props_status, {"error": "no"})
                    return
                if server.props_raw is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(server.props_raw)))
                    self.end_headers()
                    self.wfile.write(server.props_raw)
                    return
                props: dict[str, Any] = {"model_alias": server.models[0] if server.models else ""}
                if server.slots is not None:
                    props["total_slots"] = server.slots
                self._send(200, props)
                return
            if self.path.split("?")[0] != "/v1/models" or server.models_status != 200:
                self._send(server.models_status if server.models_status != 200 else 404, {"error": "no"})
                return
            anthropic = "anthropic-version" in self.headers
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                if anthropic
                else {"id": m, "object": "model", "created": 0, "owned_by": server.profile.owned_by}
                for m in server.models
            ]
            payload: dict[str, Any] = {"data": data}
            if anthropic:
                payload.update(has_more=False, first_id=data[0]["id"] if data else None, last_id=None)
            else:
                payload["object"] = "list"
            self._send(200, payload)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            record = self._record(body)
            server._came(record)
            try:
                self._answer(record, body)
            finally:
                server._out(record)

        def _answer(self, record: Recorded, body: Any) -> None:
            """Whatever the server makes of the POST request ``record`` (its ``body`` parsed)."""
            if not self._authorized():
                return
            if not isinstance(body, dict):
                # A body cut short (a client stopped mid-request: a companion process ended while
                # it sent one, seen at a demo's end on a loaded machine) or not a JSON object: a
                # real server answers 400 and generates nothing.
                self._send(400, {"error": {"message": "the request body is not a JSON object"}})
                return
            path = self.path.split("?")[0]
            if path not in ("/v1/chat/completions", "/v1/messages"):
                self._send(404, {"error": {"message": f"no route {path}"}})
                return
            outcome = Outcome(tools_visible=True, json=True)
            if path == "/v1/chat/completions":
                outcome = server.profile.screen(body)
                if outcome.status != 200:
                    record.refused = True
                    self._send(outcome.status, outcome.error)
                    return
            reply = server._next(body)
            if reply is None:
                self._send(500, {"error": {"message": "the fake server has no scripted reply left"}})
                return
            if reply.hang:
                self._hang()
                return
            if reply.status != 200:
                self._send(reply.status, {"error": {"type": "scripted", "message": reply.error}})
                return
            server._wait_together()
            with server._answering(record):
                seq = len(server.model_requests())
                model = str(body.get("model", ""))
                if path == "/v1/messages":
                    if body.get("stream"):
                        self._stream(_anthropic_stream_events(reply, model, seq), reply, record)
                    else:
                        self._generate(reply)
                        server._out(record)
                        self._send(200, _anthropic_message(reply, model, seq))
                else:
                    reply = server.profile.realise(outcome, reply)
                    limit = body.get("max_completion_tokens", body.get("max_tokens"))
                    limit = limit if isinstance(limit, int) and limit > 0 else None
                    if body.get("stream"):
                        asked = bool((body.get("stream_options") or {}).get("include_usage"))
                        usage = asked and server.profile.stream_usage
                        events = _openai_stream_events(reply, model, seq, server.profile, usage, limit)
                        self._stream(events, reply, record)
                    else:
                        self._generate(reply)
                        server._out(record)
                        record.answered = time.monotonic()
                        self._send(200, _openai_completion(reply, model, seq, server.profile, limit))

        def _stream(
            self, events: Iterator[tuple[dict[str, Any] | None, bool]], reply: Reply, record: Recorded
        ) -> None:
            """Server-sent events, paced like a model, in chunks that do not follow the events;
            ``record``'s answer is out (:meth:`FakeLLMServer._out`) before its finish chunk is
            written."""
            arrived = time.monotonic()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0
            pending = b""
            try:
                for event, is_token in events:
                    if event is not None and _finishes(event):
                        server._out(record)
                    data = _sse(event)
                    if not is_token:
                        pending += data
                    else:
                        if server.profile.interrupts and server._someone_waits():
                            # a client that closed its stream first (a refused line) was not cut
                            record.interrupted = not self._client_left(0.0)
                            self._write_chunk(pending + _sse(None))
                            pending = b""
                            server._out(record)
                            break
                        if reply.cut_after is not None and sent >= reply.cut_after:
                            record.answered = time.monotonic()
                            self._write_chunk(pending)
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        due = arrived + server.ttft + (sent / server.token_rate if server.token_rate else 0.0)
                        wait = due - time.monotonic()
                        if wait > 0:
                            # What was held back goes first, half of this event with it: a real
                            # server's writes do not end where its events do.
                            half = len(data) // 2
                            self._write_chunk(pending + data[:half])
                            pending = data[half:]
                            if server.stopping.wait(wait):
                                record.answered = time.monotonic()
                                return
                        else:
                            pending += data
                        sent += 1
                    if event is None or len(pending) > 512:
                        self._write_chunk(pending)
                        pending = b""
                    if event is None:
                        server.done_written.set()
                    elif server.after_finish is not None and _finishes(event):
                        self._write_chunk(pending)
                        pending = b""
                        server.finish_written.set()
                        deadline = time.monotonic() + _HANG_LIMIT
                        while not server.after_finish.wait(0.05):
                            if server.stopping.is_set() or time.monotonic() > deadline:
                                break
                # Set before the last bytes: the client has the whole answer once they are out,
                # and may read this record at once (set after, it was read as None in a full run).
                record.answered = time.monotonic()
                self._write_chunk(pending)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                record.answered = record.answered or time.monotonic()
                self.close_connection = True

        def _generate(self, reply: Reply) -> None:
            """A whole answer takes as long as streaming it would: ``ttft`` and every token."""
            count = _written(reply)
            took = server.ttft + (max(count - 1, 0) / server.token_rate if server.token_rate else 0.0)
            if took > 0:
                server.stopping.wait(took)

        def _write_chunk(self, data: bytes) -> None:
            if data:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        def _client_left(self, wait: float) -> bool:
            """Whether the client closed its connection (looked for up to ``wait`` seconds)."""
            conn: socket.socket = self.connection
            readable, _, _ = select.select([conn], [], [], wait)
            if not readable:
                return False
            try:
                return not conn.recv(1, socket.MSG_PEEK)
            except OSError:
                return True

        def _hang(self) -> None:
            server.arrived.set()
            deadline = time.monotonic() + _HANG_LIMIT
            while time.monotonic() < deadline and not server.stopping.is_set():
                if self._client_left(0.05):
                    server.disconnected.set()
                    break
            self.close_connection = True

    return Handler


@contextmanager
def running_server(**options: Any) -> Iterator[FakeLLMServer]:
    """Start a :class:`FakeLLMServer` on 127.0.0.1 (a free port) in a thread; stop it after."""
    server = FakeLLMServer(**options)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def free_port() -> int:
    """A loopback port with nothing listening on it (for 'connection refused')."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
