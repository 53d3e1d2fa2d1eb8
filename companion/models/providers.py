"""Real language models through pydantic-ai: OpenAI-compatible endpoints and Anthropic.

Each :class:`ProviderModel` method opens one short session (an HTTP client on the trio-asyncio
loop, see :mod:`companion.models.aio`) and sends as few requests as the call allows:

- ``decide_states``: 1 request (2 if the first answer fails validation and is sent back once);
- ``fill_params``: 1 request (2 likewise);
- ``speak``: 1 request when the model calls only action tools; one more after a round that only
  looked something up, failed, or left an instructed action unused; at most
  ``max_speak_requests`` (3 by default). Each action runs at most once per turn.

The provider SDKs never retry on their own (``max_retries=0``), so these counts are exact; the
engine decides what a failed turn means. Every request has a deadline (``request_timeout``), and
cancelling the trio caller aborts the HTTP request in flight.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import httpx2
import trio
from pydantic_ai import direct
from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryFeedbackPart,
    RetryInfo,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from ..log import log_event
from .aio import asyncio_loop, run_asyncio
from .base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
    ToolSpec,
)
from .endpoints import (
    DEFAULT_REQUEST_TIMEOUT,
    KEY_ENV,
    LOCAL_PLACEHOLDER_KEY,
    ProviderConfig,
    ProviderKind,
    is_loopback_url,
    resolve_config,
)
from .errors import ModelSetupError
from .prompts import params_prompt, speak_prompt, states_prompt
from .sdks import Sdk, SdkClient, load_sdk
from .structured import (
    PARAMS_TOOL,
    STATES_TOOL,
    Problems,
    check_params,
    check_states,
    params_schema_problems,
    parse_json_object,
    states_schema,
    wire_tool_names,
)

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "LOCAL_PLACEHOLDER_KEY",
    "ModelSetupError",
    "ProviderConfig",
    "ProviderKind",
    "ProviderModel",
    "is_loopback_url",
    "resolve_config",
]

_log = logging.getLogger(__name__)

_CLOSE_TIMEOUT: Final = 5.0
_T = TypeVar("_T")


_COMMON_ERRORS: Final = (ModelAPIError, UnexpectedModelBehavior, httpx2.HTTPError)


class _Session:
    """One call's connection: sends requests with a deadline, turns failures into ModelError."""

    def __init__(self, owner: ProviderModel, model: Model, purpose: str) -> None:
        self._owner = owner
        self._model = model
        self._purpose = purpose
        self.requests = 0

    async def request(
        self, messages: Sequence[ModelMessage], params: ModelRequestParameters
    ) -> ModelResponse:
        config = self._owner.config
        self.requests += 1
        started = trio.current_time()
        try:
            with trio.fail_after(config.request_timeout):
                response = await run_asyncio(
                    direct.model_request, self._model, list(messages), model_request_parameters=params
                )
        except trio.TooSlowError as exc:
            raise self._failed(f"no answer within {config.request_timeout:g} s", started) from exc
        except self._owner._errors as exc:
            raise self._failed(_explain(exc, config, self._owner._sdk), started) from exc
        log_event(
            _log,
            "model_request",
            model=self._owner.name,
            purpose=self._purpose,
            request=self.requests,
            ms=round((trio.current_time() - started) * 1000),
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            tool_calls=[p.tool_name for p in response.parts if isinstance(p, ToolCallPart)],
        )
        return response

    def _failed(self, reason: str, started: float) -> ModelError:
        log_event(
            _log,
            "model_request_failed",
            logging.WARNING,
            model=self._owner.name,
            purpose=self._purpose,
            request=self.requests,
            ms=round((trio.current_time() - started) * 1000),
            reason=reason,
        )
        return ModelError(f"{self._owner.name} ({self._purpose}): {reason}")


def _explain(exc: BaseException, config: ProviderConfig, sdk: Sdk) -> str:
    """A provider failure in words a person can act on."""
    cause = exc.__cause__ if isinstance(exc, ModelAPIError) and exc.__cause__ is not None else exc
    status = getattr(exc, "status_code", None) or getattr(cause, "status_code", None)
    key_env = KEY_ENV[config.kind]
    if status in (401, 403):
        return f"{config.endpoint} refused the API key (HTTP {status}): check {key_env}"
    if status == 404:
        return (
            f"{config.endpoint} has no model {config.model_name!r} or no such path (HTTP 404): "
            "check the model name and the base URL (OpenAI-compatible servers serve under /v1)"
        )
    if isinstance(cause, (*sdk.connection_errors, httpx2.TransportError)):
        return f"cannot reach {config.endpoint} ({type(cause).__name__}: {cause}); is the server running?"
    if status is not None:
        return f"{config.endpoint} answered HTTP {status}: {_short(str(exc))}"
    return f"{type(exc).__name__}: {_short(str(exc))}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProviderModel:
    """A :class:`~companion.models.base.CompanionModel` backed by a real provider via pydantic-ai."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._sdk = load_sdk(config.kind)
        self._errors: tuple[type[Exception], ...] = (*_COMMON_ERRORS, *self._sdk.errors)
        self._ssl: ssl.SSLContext | None = None

    @property
    def name(self) -> str:
        return f"{self.config.kind}:{self.config.model_name}"

    def __repr__(self) -> str:
        return f"ProviderModel({self.name!r}, endpoint={self.config.endpoint!r})"

    # --- connections -------------------------------------------------------------------------

    def _client(self) -> SdkClient:
        """A fresh SDK client: no SDK retries, no proxy for loopback endpoints."""
        c = self.config
        local = c.base_url is not None and is_loopback_url(c.base_url)
        if self._ssl is None:  # loading the CA store costs ~70 ms: once per model, not per call
            self._ssl = httpx2.create_ssl_context(trust_env=not local)
        http = httpx2.AsyncClient(
            verify=self._ssl, trust_env=not local, timeout=c.request_timeout + _CLOSE_TIMEOUT
        )
        return self._sdk.make_client(c, http, c.request_timeout + _CLOSE_TIMEOUT)

    @asynccontextmanager
    async def _open_client(self) -> AsyncIterator[SdkClient]:
        async with asyncio_loop():
            client = self._client()
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                    await run_asyncio(client.close)

    @asynccontextmanager
    async def _session(self, purpose: str) -> AsyncIterator[_Session]:
        async with self._open_client() as client:
            yield _Session(self, self._sdk.make_model(client, self.config.model_name), purpose)

    # --- start-up check ----------------------------------------------------------------------

    async def check(self, *, timeout: float = 10.0) -> None:
        """Fail now, with a clear :class:`ModelSetupError`, if the model cannot be used.

        Lists the endpoint's models (no tokens spent): proves the endpoint answers, the key is
        accepted and, for OpenAI-compatible servers, that the model is served.
        """
        c = self.config
        try:
            async with self._open_client() as client:
                with trio.fail_after(timeout):
                    ids = await run_asyncio(self._sdk.list_model_ids, client)
        except trio.TooSlowError as exc:
            raise ModelSetupError(f"{self.name}: {c.endpoint} did not answer within {timeout:g} s") from exc
        except self._errors as exc:
            raise ModelSetupError(f"{self.name}: {_explain(exc, c, self._sdk)}") from exc
        served = _serves(ids, c.model_name)
        log_event(_log, "model_checked", model=self.name, endpoint=c.endpoint, listed=len(ids), served=served)
        if served:
            return
        if c.kind == "anthropic":
            # Aliases (claude-...-latest) work without being listed; let the first call decide.
            log_event(_log, "model_not_listed", logging.WARNING, model=self.name, endpoint=c.endpoint)
            return
        shown = ", ".join(ids[:20]) + (" …" if len(ids) > 20 else "")
        raise ModelSetupError(
            f"{self.name}: {c.endpoint} does not serve {c.model_name!r}; it serves: {shown or 'nothing'}. "
            f"Use one of those (--model openai:NAME), or make the server load it (Ollama: ollama pull "
            f"{c.model_name})."
        )

    # --- the three calls ---------------------------------------------------------------------

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        """All addressed companions' states in one structured call."""
        if not request.companions:
            return []
        instructions, prompt = states_prompt(request, STATES_TOOL)
        tool = ToolDefinition(
            name=STATES_TOOL,
            parameters_json_schema=states_schema([c.id for c in request.companions]),
            description="Record the next-turn state of every companion listed.",
            kind="output",
        )
        return await self._structured(
            "states", instructions, prompt, tool, lambda raw: check_states(raw, request)
        )

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        """The card's ``events.params`` values, validated against its JSON Schema."""
        problems = params_schema_problems(request.schema)
        if problems is not None:
            raise ModelError(f"{self.name} (params): {problems}")
        instructions, prompt = params_prompt(request, PARAMS_TOOL)
        tool = ToolDefinition(
            name=PARAMS_TOOL,
            parameters_json_schema=dict(request.schema),
            description="Record your assessment of the situation.",
            kind="output",
            strict=False,
        )
        return await self._structured(
            "params", instructions, prompt, tool, lambda raw: check_params(raw, request.schema)
        )

    async def _structured(
        self,
        purpose: str,
        instructions: str,
        prompt: str,
        tool: ToolDefinition,
        check: Callable[[Mapping[str, Any]], _T | Problems],
    ) -> _T:
        """One output-tool request; a refused answer goes back once with its problems."""
        params = ModelRequestParameters(output_mode="tool", output_tools=[tool], allow_text_output=False)
        messages: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(prompt)], instructions=instructions)
        ]
        problems = Problems(())
        async with self._session(purpose) as session:
            for attempt in (1, 2):
                response = await session.request(messages, params)
                call, raw = _output_of(response, tool.name)
                if raw is not None:
                    result = check(raw)
                elif call is not None:
                    result = Problems((f"the {tool.name} arguments were not a JSON object",))
                else:
                    result = Problems((f"answer by calling the {tool.name} tool",))
                if not isinstance(result, Problems):
                    return result
                problems = result
                log_event(
                    _log,
                    "model_output_refused",
                    logging.WARNING,
                    model=self.name,
                    purpose=purpose,
                    attempt=attempt,
                    problems=list(problems.items),
                )
                messages += [response, _feedback(response, call, problems, instructions)]
        raise ModelError(f"{self.name} ({purpose}): invalid answer after a retry: {problems}")

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        """Run the speaker's turn; every tool call goes through ``call_tool``."""
        tools = wire_tool_names(request.tools)
        if not any(spec.kind == "action" for spec in tools.values()):
            log_event(_log, "speak_skipped", logging.WARNING, model=self.name, reason="no action tools")
            return
        instructions, prompt = speak_prompt(request, tools)
        params = ModelRequestParameters(
            function_tools=[
                ToolDefinition(
                    name=name,
                    parameters_json_schema=dict(spec.input_schema),
                    description=spec.description,
                    strict=False,
                )
                for name, spec in tools.items()
            ],
            allow_text_output=False,
        )
        turn = _SpeakTurn(tools, request)
        messages: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(prompt)], instructions=instructions)
        ]
        async with self._session("speak") as session:
            while session.requests < self.config.max_speak_requests:
                response = await session.request(messages, params)
                returns = await self._run_calls(response, turn, call_tool)
                if not turn.follow_up():
                    return
                messages += [response, ModelRequest(parts=returns, instructions=instructions)]
        log_event(
            _log,
            "speak_budget_spent",
            logging.WARNING,
            model=self.name,
            requests=self.config.max_speak_requests,
            acted=sorted(turn.done),
            unused_instructed=sorted(turn.pending),
        )

    async def _run_calls(
        self, response: ModelResponse, turn: _SpeakTurn, call_tool: ToolCaller
    ) -> list[ModelRequestPart]:
        """Execute the response's tool calls in order; answer each one for the next request."""
        turn.new_round()
        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        if not calls:
            text = " ".join(p.content for p in response.parts if isinstance(p, TextPart)).strip()
            log_event(_log, "speak_without_tool", logging.WARNING, model=self.name, text=_short(text, 200))
            turn.needs_fix = not turn.done
            names = ", ".join(n for n, s in turn.tools.items() if s.kind == "action")
            nudge = f"Nobody heard that: use an action tool ({names}) to talk or act."
            return [RetryFeedbackPart(nudge, retry=RetryInfo("model_retry"))]
        returns: list[ModelRequestPart] = []
        for call in calls:
            spec = turn.tools.get(call.tool_name)
            args = _call_args(call)
            if spec is None or args is None:
                turn.needs_fix = True
                known = ", ".join(turn.tools)
                why = (
                    f"there is no tool {call.tool_name!r}; use one of: {known}"
                    if spec is None
                    else ("the arguments are not a JSON object")
                )
                returns.append(_retry(call, why))
                continue
            if spec.id in turn.done:
                log_event(_log, "speak_repeat_refused", model=self.name, tool=spec.id)
                returns.append(
                    _answer(call, {"status": "refused", "message": "already done this turn"}, False)
                )
                continue
            result = dict(await call_tool(spec.id, args))
            ok = result.get("status", "ok") == "ok"
            turn.record(spec, ok)
            returns.append(_answer(call, result, ok))
        return returns


class _SpeakTurn:
    """Bookkeeping of one speak call: which actions ran, and whether to ask the model again.

    Each action tool runs at most once per turn (a second ``speak`` would be double speech).
    The model is asked again only when it must: a call failed or was malformed, an instructed
    action is still missing, or it looked something up and has not acted yet.
    """

    def __init__(self, tools: Mapping[str, ToolSpec], request: SpeakRequest) -> None:
        self.tools = tools
        actions = {s.id for s in tools.values() if s.kind == "action"}
        self.pending: set[str] = {i.tool for i in request.instructions if i.tool in actions}
        """Instructed actions not done yet."""
        self.done: set[str] = set()
        """Actions that succeeded this turn."""
        self.needs_fix = False
        self.looked_up = False

    def new_round(self) -> None:
        self.needs_fix = False
        self.looked_up = False

    def record(self, spec: ToolSpec, ok: bool) -> None:
        if not ok:
            self.needs_fix = True
        elif spec.kind == "knowledge":
            self.looked_up = True
        else:
            self.done.add(spec.id)
            self.pending.discard(spec.id)

    def follow_up(self) -> bool:
        return self.needs_fix or bool(self.pending) or (self.looked_up and not self.done)


def _call_args(call: ToolCallPart) -> dict[str, Any] | None:
    """A tool call's arguments, or ``None`` when they are not a JSON object."""
    try:
        return call.args_as_dict(raise_if_invalid=True)
    except (ValueError, AssertionError):
        return None


def _answer(call: ToolCallPart, result: Mapping[str, Any], ok: bool) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name,
        content=json.dumps(result, ensure_ascii=False, default=str),
        tool_call_id=call.tool_call_id,
        outcome="success" if ok else "failed",
    )


def _retry(call: ToolCallPart, message: str) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name, content=message, tool_call_id=call.tool_call_id, outcome="retried"
    )


def _output_of(response: ModelResponse, tool_name: str) -> tuple[ToolCallPart | None, dict[str, Any] | None]:
    """The output tool call and its arguments; or, from a model that wrote JSON as text, that."""
    for part in response.parts:
        if isinstance(part, ToolCallPart) and part.tool_name == tool_name:
            return part, _call_args(part)
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    return None, parse_json_object(text) if text else None


def _feedback(
    response: ModelResponse, call: ToolCallPart | None, problems: Problems, instructions: str
) -> ModelRequest:
    """The retry request: every tool call answered (providers insist), the problems spelled out."""
    detail = "Fix these problems and call the tool again:\n" + "\n".join(f"- {p}" for p in problems.items)
    parts: list[ModelRequestPart] = []
    for part in response.parts:
        if isinstance(part, ToolCallPart):
            parts.append(
                _retry(part, detail if part is call else f"Ignored: {part.tool_name} is not available.")
            )
    if call is None:
        parts.append(RetryFeedbackPart(detail, retry=RetryInfo("validation_error")))
    return ModelRequest(parts=parts, instructions=instructions)


def _serves(ids: Sequence[str], name: str) -> bool:
    """Whether ``name`` is listed; Ollama lists ``NAME:latest`` for a plain ``NAME``."""
    return name in ids or f"{name}:latest" in ids
