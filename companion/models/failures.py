"""A provider's failure in words: which HTTP refusals mean "try another request form", and what
to tell a person about the others.

Servers refuse request *forms* they do not take (tools, ``tool_choice``, ``response_format``) with
one of a few statuses; :class:`FormRefused` carries such a refusal to the caller, which may try
another form (see :mod:`companion.models.servers`). Everything else fails the call, explained by
:func:`explain` in terms a person can act on (the key, the model name, the base URL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

import httpx2
from pydantic_ai.exceptions import ModelAPIError

from companion.models.endpoints import KEY_ENV, ProviderConfig
from companion.models.sdks import Sdk
from companion.text import clip

__all__ = ["REFUSAL_STATUSES", "FormRefused", "explain", "server_words", "status_of"]

REFUSAL_STATUSES: Final = frozenset({400, 415, 422, 500, 501})
"""HTTP statuses with which servers refuse a request *form* (tools, tool_choice, response_format).
401/403/404/429 and timeouts are never a form's fault: they fail the call at once."""


class FormRefused(Exception):
    """The server refused this request form (an HTTP error); another form may be accepted."""

    def __init__(self, status: int, words: str) -> None:
        super().__init__(f"HTTP {status}: {words}")
        self.status = status
        self.words = words


def status_of(exc: BaseException) -> int | None:
    cause = exc.__cause__ if isinstance(exc, ModelAPIError) and exc.__cause__ is not None else exc
    status = getattr(exc, "status_code", None) or getattr(cause, "status_code", None)
    return status if isinstance(status, int) else None


def server_words(exc: BaseException) -> str:
    """What the server said in its error body (``error.message``, ``message`` or ``detail``)."""
    body = getattr(exc, "body", None)
    if body is None and isinstance(exc.__cause__, BaseException):
        body = getattr(exc.__cause__, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            body = inner
        elif isinstance(inner, str):
            return clip(inner, 200)
        for key in ("message", "detail"):
            value = body.get(key)
            if value:
                return clip(value if isinstance(value, str) else json.dumps(value), 200)
    if isinstance(body, str) and body:
        return clip(body, 200)
    return clip(str(exc), 200)


def explain(exc: BaseException, config: ProviderConfig, sdk: Sdk) -> tuple[str, str]:
    """A provider failure in words a person can act on: ``(detail for the log, short reason)``."""
    cause = exc.__cause__ if isinstance(exc, ModelAPIError) and exc.__cause__ is not None else exc
    status = status_of(exc)
    key_env = KEY_ENV[config.kind]
    if status in (401, 403):
        return (
            f"{config.endpoint} refused the API key (HTTP {status}): check {key_env}",
            f"the server refused the API key (HTTP {status}); check {key_env}",
        )
    if status == 404:
        return (
            f"{config.endpoint} has no model {config.model_name!r} or no such path (HTTP 404): "
            "check the model name and the base URL (OpenAI-compatible servers serve under /v1)",
            f"no model {config.model_name!r} at {config.endpoint} (HTTP 404)",
        )
    if isinstance(cause, (*sdk.connection_errors, httpx2.TransportError)):
        return (
            f"cannot reach {config.endpoint} ({type(cause).__name__}: {cause}); is the server running?",
            f"cannot reach {config.endpoint}; is the server running?",
        )
    if status is not None:
        words = server_words(exc)
        return (
            f"{config.endpoint} answered HTTP {status}: {words}",
            f"the server answered HTTP {status}: {words}",
        )
    return f"{type(exc).__name__}: {clip(str(exc), 300)}", f"{type(exc).__name__}: {clip(str(exc), 100)}"
