"""A fake language-model server on 127.0.0.1 for provider tests: real HTTP, scripted replies.

It speaks just enough of two wire formats: OpenAI-compatible chat completions
(``POST /v1/chat/completions``, ``GET /v1/models``) and Anthropic messages
(``POST /v1/messages``, ``GET /v1/models``). Each model request pops the next scripted
:class:`Reply` (or calls a function of the request body that returns one); an unscripted
request gets HTTP 500 so a test that sends more requests than it expects fails loudly.
Every request is recorded. It runs in a thread and is stopped by the test.
"""

from __future__ import annotations

import json
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
    "FakeLLMServer",
    "Recorded",
    "Reply",
    "free_port",
    "hang",
    "http_error",
    "running_server",
    "text",
    "tool_call",
    "tool_calls",
]

_HANG_LIMIT = 20.0
"""A hung request is released after this many seconds even if nobody stops it."""


@dataclass(frozen=True)
class Reply:
    """One scripted answer: tool calls and/or text, an HTTP error, or a hang."""

    calls: tuple[tuple[str, Any], ...] = ()
    text: str | None = None
    status: int = 200
    error: str = ""
    hang: bool = False


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


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


ReplyScript = Reply | Callable[[Any], Reply]


@dataclass
class FakeLLMServer:
    """Scripted replies in, recorded requests out. Use :func:`running_server` to run one."""

    models: tuple[str, ...] = ("fake-1",)
    api_key: str | None = None
    """When set, requests without this key (Bearer or x-api-key) get HTTP 401."""
    models_status: int = 200
    """Set to e.g. 404 to make ``GET /v1/models`` fail."""
    hang_models: bool = False
    """Hold ``GET /v1/models`` without answering (like a hung server)."""
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    """Set when a hung request has arrived."""
    disconnected: threading.Event = field(default_factory=threading.Event)
    """Set when the client of a hung request closed its connection."""
    stopping: threading.Event = field(default_factory=threading.Event)
    _script: deque[ReplyScript] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *replies: ReplyScript) -> None:
        with self._lock:
            self._script.extend(replies)

    def model_requests(self) -> list[Recorded]:
        """The recorded generation requests (not model listings), oldest first."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]

    def unused_replies(self) -> int:
        with self._lock:
            return len(self._script)

    def _next(self, body: Any) -> Reply | None:
        with self._lock:
            script = self._script.popleft() if self._script else None
        if script is None:
            return None
        return script if isinstance(script, Reply) else script(body)


def _openai_completion(reply: Reply, model: str, seq: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": f"call_{seq}_{i}",
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
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


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
        "usage": {"input_tokens": 11, "output_tokens": 7},
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

        def _record(self, body: Any) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            with server._lock:
                server.requests.append(Recorded(self.command, self.path.split("?")[0], headers, body))

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
            if self.path.split("?")[0] != "/v1/models" or server.models_status != 200:
                self._send(server.models_status if server.models_status != 200 else 404, {"error": "no"})
                return
            anthropic = "anthropic-version" in self.headers
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                if anthropic
                else {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
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
            body = json.loads(self.rfile.read(length) or b"null")
            self._record(body)
            if not self._authorized():
                return
            path = self.path.split("?")[0]
            if path not in ("/v1/chat/completions", "/v1/messages"):
                self._send(404, {"error": {"message": f"no route {path}"}})
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
            seq = len(server.model_requests())
            model = str(body.get("model", ""))
            if path == "/v1/messages":
                self._send(200, _anthropic_message(reply, model, seq))
            else:
                self._send(200, _openai_completion(reply, model, seq))

        def _hang(self) -> None:
            server.arrived.set()
            conn: socket.socket = self.connection
            deadline = time.monotonic() + _HANG_LIMIT
            while time.monotonic() < deadline and not server.stopping.is_set():
                readable, _, _ = select.select([conn], [], [], 0.05)
                if readable:
                    try:
                        peeked = conn.recv(1, socket.MSG_PEEK)
                    except OSError:
                        peeked = b""
                    if not peeked:
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
