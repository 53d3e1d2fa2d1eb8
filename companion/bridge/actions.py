"""``POST /actions/TOOL``: a client that holds the bridge's token runs a companion's tool.

The body is the tool's input (a JSON object); ``?companion=ID`` picks the companion when the
bridge carries several (default: the only one, else an error naming them). The call goes
through the companion's own :class:`~companion.actions.ActionRuntime`, the path a model's call
takes: validation, approval (asked of the clients), deadlines, the outgoing hook, publishing.
The answer is JSON-RPC-shaped: ``{"jsonrpc": "2.0", "id": CALL_ID, "result": RESULT}`` with
HTTP 200, or ``{"jsonrpc": "2.0", "id": CALL_ID | null, "error": {code, message, data:
RESULT}}`` with a status that says what went wrong (400 invalid input or body, 404 unknown
tool or companion, 403 refused, 504 timeout, 429 too fast, 500 the tool failed); ``RESULT`` is
:meth:`ToolResult.for_caller <companion.actions.ToolResult.for_caller>`.

Calls are rate-limited like client frames (a token bucket at the bridge's per-client rate,
shared by every HTTP caller: they all hold the one token), and at most :data:`MAX_RUNNING` run
at once: a tool call may wait minutes for an approval.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from companion.actions import ActionRuntime, ToolResult
from companion.bridge.httpserver import HttpRequest, HttpResponse, Route, json_response
from companion.bridge.ratelimit import RateLimit, TokenBucket, admit
from companion.log import log_event

__all__ = ["ACTIONS_PREFIX", "MAX_RUNNING", "ActionEndpoint"]

logger = logging.getLogger("companion.bridge.actions")

ACTIONS_PREFIX: Final = "/actions/"
MAX_RUNNING: Final = 16
_STATUS: Final[Mapping[str, int]] = {
    "ok": 200,
    "invalid_input": 400,
    "not_found": 404,
    "refused": 403,
    "timeout": 504,
    "cancelled": 503,
}
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600


class ActionEndpoint:
    """The route's handler. ``runtimes``: companion id -> its runtime (a live mapping: the
    companions of the process register as they start)."""

    def __init__(
        self,
        runtimes: Mapping[str, ActionRuntime],
        *,
        rate: RateLimit,
        call_timeout: float,
    ) -> None:
        self._runtimes = runtimes
        self._bucket = TokenBucket(rate)
        self._limiter = trio.CapacityLimiter(MAX_RUNNING)
        self.call_timeout = call_timeout

    def route(self) -> Route:
        """The route, with a deadline past the call's own (a call may wait for an approval)."""
        return Route(
            self.handle, needs_token=True, methods=frozenset({"POST"}), timeout=self.call_timeout + 5
        )

    async def handle(self, request: HttpRequest) -> HttpResponse:
        parts = urlsplit(request.target)
        tool_id = unquote(parts.path[len(ACTIONS_PREFIX) :]) if parts.path.startswith(ACTIONS_PREFIX) else ""
        if not tool_id or "/" in tool_id:
            return _error(404, INVALID_REQUEST, "name a tool: POST /actions/TOOL")
        wait = admit([self._bucket], trio.current_time())
        if wait > 0.0:
            response = _error(429, INVALID_REQUEST, f"too many tool calls; try again in {wait:.2f} s")
            return HttpResponse(
                response.status,
                response.body,
                response.content_type,
                (("Retry-After", str(max(1, round(wait)))),),
            )
        runtime = self._runtime(parse_qs(parts.query).get("companion", [None])[0])
        if isinstance(runtime, HttpResponse):
            return runtime
        try:
            raw = json.loads(request.body.decode("utf-8") or "{}")
        except (UnicodeDecodeError, ValueError) as exc:
            return _error(400, PARSE_ERROR, f"the body is not JSON: {exc}"[:300])
        if not isinstance(raw, dict):
            return _error(
                400,
                INVALID_REQUEST,
                f"the body must be a JSON object (the tool's input), not {type(raw).__name__}",
            )
        if self._limiter.available_tokens == 0:
            return _error(503, INVALID_REQUEST, f"{MAX_RUNNING} tool calls are running; try again later")
        async with self._limiter:
            with trio.move_on_after(self.call_timeout) as scope:
                result = await runtime.call(tool_id, raw)
        if scope.cancelled_caught:
            return _error(504, INVALID_REQUEST, f"the call did not end within {self.call_timeout:g} s")
        log_event(
            logger, "bridge_action_call", tool=tool_id, status=result.status, companion=runtime.companion_id
        )
        return answer(result)

    def _runtime(self, companion: str | None) -> ActionRuntime | HttpResponse:
        ids = sorted(self._runtimes)
        if companion is None:
            if len(ids) == 1:
                return self._runtimes[ids[0]]
            named = ", ".join(ids) or "none runs in this process"
            return _error(400, INVALID_REQUEST, f"say which companion with ?companion=ID (one of: {named})")
        runtime = self._runtimes.get(companion)
        if runtime is None:
            named = ", ".join(ids) or "none"
            return _error(404, INVALID_REQUEST, f"no companion {companion[:100]!r} here; available: {named}")
        return runtime


def answer(result: ToolResult) -> HttpResponse:
    """The HTTP answer for a finished call."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": result.call_id}
    typed = result.for_caller()
    if result.ok:
        body["result"] = typed
    else:
        body["error"] = {"code": typed["code"], "message": result.message, "data": typed}
    return json_response(_STATUS.get(result.status, 500), json.dumps(body, ensure_ascii=False, default=str))


def _error(status: int, code: int, message: str) -> HttpResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return json_response(status, json.dumps(body, ensure_ascii=False))
