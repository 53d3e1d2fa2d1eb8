"""One call's connection to a provider (:class:`Session`): each request under its deadline,
whole or streamed to a live line, a history with tool calls flattened for servers that refuse
tool messages, a refused form told apart from a failure, and its tokens counted and logged
(``model_request``, ``model_request_failed``).

Split from :mod:`.providers`, whose :class:`~.providers.ProviderModel` opens one session per
call and decides what to send; the session only sends it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Final, Protocol

import trio
from pydantic_ai import direct
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from companion.log import log_event
from companion.models.aio import run_asyncio
from companion.models.base import ModelError
from companion.models.endpoints import ProviderConfig
from companion.models.exchanges import flatten, has_tool_messages
from companion.models.failures import REFUSAL_STATUSES, FormRefused, explain, server_words, status_of
from companion.models.sdks import Sdk
from companion.models.servers import EndpointMemory
from companion.models.streaming import Partial, stream_response
from companion.models.usage import reported_tokens

__all__ = ["SPEAK_TOKENS", "STRUCTURED_TOKENS", "Owner", "Session"]

_log = logging.getLogger("companion.models.providers")  # the logger its events always had

SPEAK_TOKENS: Final = 120
"""Tokens a spoken line may take: one to three sentences, about the 400 characters a line is cut
to (a small model otherwise rambles on for a thousand tokens and a minute; with 200, SmolLM2-135M
used all 200 on most turns, half of which was cut, at 0.1-0.2 s a token on a loaded CPU)."""
STRUCTURED_TOKENS: Final = 600
"""Tokens a structured answer may take (the states of a dozen companions fit)."""


class Owner(Protocol):
    """What a session needs of the model that opened it (:class:`~.providers.ProviderModel`)."""

    config: ProviderConfig
    memory: EndpointMemory
    sdk: Sdk
    errors: tuple[type[Exception], ...]
    tokens: Counter[str]
    requests_without_usage: int

    @property
    def name(self) -> str: ...

    @property
    def request_timeout(self) -> float: ...

    def error(self, purpose: str, detail: str, reason: str) -> ModelError: ...


class Session:
    """One call's connection: sends requests with a deadline, turns failures into ModelError."""

    def __init__(self, owner: Owner, model: Model, purpose: str) -> None:
        self._owner = owner
        self._model = model
        self._purpose = purpose
        self.requests = 0

    async def request(
        self,
        messages: Sequence[ModelMessage],
        params: ModelRequestParameters,
        settings: ModelSettings | None = None,
        *,
        form: str = "",
        may_refuse: bool = False,
        partial: Partial | None = None,
    ) -> ModelResponse:
        """One HTTP request (streamed when ``partial`` is given: it sees the answer so far). With
        ``may_refuse``, an HTTP error that may mean "not this form" raises :class:`FormRefused` (the
        caller tries another form) instead of :class:`ModelError`.

        A history with tool calls goes out as plain text to endpoints that refuse tool messages
        (llama-cpp-python refuses an assistant message whose ``content`` is null); an endpoint
        found refusing them is remembered and the request is sent again, flattened, at once.
        """
        memory, config = self._owner.memory, self._owner.config
        limit = ModelSettings(max_tokens=SPEAK_TOKENS if self._purpose == "speak" else STRUCTURED_TOKENS)
        settings = ModelSettings(**{**limit, **(settings or {})})
        tooled = has_tool_messages(messages)
        flat = tooled and memory.state(config).flat_history
        try:
            return await self._send(
                flatten(messages) if flat else messages, params, settings, form, may_refuse, partial
            )
        except FormRefused:
            if not tooled or flat:
                raise
        except ModelError as exc:
            if not tooled or flat or exc.status not in REFUSAL_STATUSES:
                raise
        memory.flatten_history(config)
        return await self._send(flatten(messages), params, settings, form, may_refuse, partial)

    async def _send(
        self,
        messages: Sequence[ModelMessage],
        params: ModelRequestParameters,
        settings: ModelSettings,
        form: str,
        may_refuse: bool,
        partial: Partial | None = None,
    ) -> ModelResponse:
        config = self._owner.config
        memory = self._owner.memory.state(config)
        if form in memory.unstreamed:
            partial = None
        self.requests += 1
        started = trio.current_time()
        try:
            with trio.fail_after(self._owner.request_timeout):
                if partial is None:
                    response = await run_asyncio(
                        direct.model_request,
                        self._model,
                        list(messages),
                        model_settings=settings,
                        model_request_parameters=params,
                    )
                else:
                    response = await run_asyncio(
                        stream_response, self._model, messages, settings, params, partial
                    )
        except trio.TooSlowError as exc:
            reason = f"no answer within {self._owner.request_timeout:g} s"
            raise self._failed(reason, reason, started, form) from exc
        except self._owner.errors as exc:
            status = status_of(exc)
            if partial is not None and status in REFUSAL_STATUSES and "stream" in server_words(exc).lower():
                # The form works, streaming it does not (llama-cpp-python's chatml-function-calling
                # with tool_choice "auto"): this form goes unstreamed from now on.
                self._log_failure(f"HTTP {status}: {server_words(exc)}", started, form, logging.INFO)
                memory.unstreamed.add(form)
                return await self._send(messages, params, settings, form, may_refuse)
            if may_refuse and status in REFUSAL_STATUSES:
                words = server_words(exc)
                self._log_failure(f"HTTP {status}: {words}", started, form, logging.INFO)
                raise FormRefused(status or 0, words) from exc
            detail, reason = explain(exc, config, self._owner.sdk)
            error = self._failed(detail, reason, started, form)
            error.status = status
            raise error from exc
        tokens = reported_tokens(response.usage)
        if tokens is None:
            self._owner.requests_without_usage += 1
        else:
            self._owner.tokens.update(input=tokens.input, output=tokens.output)
        log_event(
            _log,
            "model_request",
            model=self._owner.name,
            purpose=self._purpose,
            form=form,
            request=self.requests,
            streamed=partial is not None,
            ms=round((trio.current_time() - started) * 1000),
            input_tokens=None if tokens is None else tokens.input,
            output_tokens=None if tokens is None else tokens.output,
            tool_calls=[p.tool_name for p in response.parts if isinstance(p, ToolCallPart)],
        )
        return response

    def _log_failure(self, reason: str, started: float, form: str, level: int) -> None:
        log_event(
            _log,
            "model_request_failed",
            level,
            model=self._owner.name,
            purpose=self._purpose,
            form=form,
            request=self.requests,
            ms=round((trio.current_time() - started) * 1000),
            reason=reason,
        )

    def _failed(self, detail: str, reason: str, started: float, form: str) -> ModelError:
        self._log_failure(detail, started, form, logging.WARNING)
        return self._owner.error(self._purpose, detail, reason)
