"""Where a provider model lives and how to authenticate: checked configuration, no I/O.

Kept apart from :mod:`companion.models.providers` so it imports nothing heavy: the key and URL
rules can be read, used and tested without the provider packages.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias
from urllib.parse import urlsplit

from companion.models.errors import ModelSetupError

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "KEY_ENV",
    "LOCAL_PLACEHOLDER_KEY",
    "ProviderConfig",
    "ProviderKind",
    "is_loopback_url",
    "resolve_config",
]

ProviderKind: TypeAlias = Literal["openai", "anthropic"]

DEFAULT_REQUEST_TIMEOUT: Final = 60.0
"""Seconds one HTTP request to a provider may take (a slow local model needs a generous one)."""

LOCAL_PLACEHOLDER_KEY: Final = "no-key-needed-for-a-local-endpoint"
"""Sent as the API key to a loopback ``--base-url`` when no key is set: the SDKs insist on one."""

KEY_ENV: Final[dict[ProviderKind, str]] = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """Everything needed to reach one provider model. Build it with :func:`resolve_config`."""

    kind: ProviderKind
    model_name: str
    api_key: str = field(repr=False)
    base_url: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_speak_requests: int = 3

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        if self.base_url:
            return self.base_url
        return "the OpenAI API" if self.kind == "openai" else "the Anthropic API"


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    host = urlsplit(url).hostname
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_config(
    kind: ProviderKind,
    model_name: str,
    *,
    base_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> ProviderConfig:
    """A checked :class:`ProviderConfig`, the key taken from the environment.

    Raises :class:`ModelSetupError` when the key is missing (a loopback ``base_url`` needs none:
    it gets :data:`LOCAL_PLACEHOLDER_KEY`) or the base URL is not an http(s) URL.
    """
    env = os.environ if environ is None else environ
    if not model_name.strip():
        raise ModelSetupError(f"no model name: use {kind}:NAME")
    if kind == "openai" and base_url is None:
        base_url = env.get("OPENAI_BASE_URL") or None
    if base_url is not None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelSetupError(
                f"--base-url {base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:11434/v1)"
            )
    if request_timeout <= 0:
        raise ModelSetupError(f"the request timeout must be positive, not {request_timeout}")
    key_env = KEY_ENV[kind]
    key = env.get(key_env, "").strip()
    if not key:
        if base_url is not None and is_loopback_url(base_url):
            key = LOCAL_PLACEHOLDER_KEY
        else:
            where = f"the endpoint {base_url} is not on this machine" if base_url else f"{kind}:{model_name}"
            raise ModelSetupError(
                f"{key_env} is not set: {where} needs an API key. Set {key_env} in the environment "
                "(a local server on 127.0.0.1 or localhost needs none; for another server without "
                f"authentication set {key_env} to any text)."
            )
    return ProviderConfig(
        kind=kind, model_name=model_name, api_key=key, base_url=base_url, request_timeout=request_timeout
    )
