"""Who may use the bridge: the shared token and the browser origin rule, as pure checks.

A browser tab on any website can open a WebSocket to ``127.0.0.1``; without an origin rule a
page you happen to visit could speak to your companions or approve their actions. Browsers
always send ``Origin``; other clients (aikyo's Node examples, Python) usually do not. So a
request with no ``Origin`` passes, and one with an ``Origin`` must be the bridge's own page,
a loopback page (local development servers), or explicitly allowed.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlsplit

__all__ = ["AccessDenied", "AccessPolicy", "check_access", "token_from"]

LOOPBACK_HOSTS: Final[frozenset[str]] = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


@dataclass(frozen=True, slots=True)
class AccessDenied:
    """A refused request: the HTTP status and the reason sent back."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The bridge's rules: an optional shared token and extra allowed origins (``*`` = any)."""

    token: str | None = None
    allowed_origins: Collection[str] = ()


def token_from(target: str, headers: Mapping[str, str]) -> str | None:
    """The token a client presented: ``?token=`` (browsers cannot set WebSocket headers) or
    ``Authorization: Bearer``."""
    values = parse_qs(urlsplit(target).query).get("token")
    if values:
        return values[0]
    auth = headers.get("authorization", "")
    scheme, _, credentials = auth.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


def _origin_allowed(origin: str, host: str | None, allowed: Collection[str]) -> bool:
    if "*" in allowed or origin in allowed:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if host is not None and parts.netloc.lower() == host.lower():
        return True  # the bridge's own page
    return (parts.hostname or "").lower() in LOOPBACK_HOSTS


def check_access(policy: AccessPolicy, target: str, headers: Mapping[str, str]) -> AccessDenied | None:
    """``None`` if the request may proceed. ``headers`` are lower-cased names."""
    origin = headers.get("origin")
    if origin is not None and not _origin_allowed(origin, headers.get("host"), policy.allowed_origins):
        return AccessDenied(
            403, f"origin {origin!r} is not allowed; start the bridge with --allow-origin {origin}"
        )
    if policy.token is not None:
        presented = token_from(target, headers)
        if presented is None:
            return AccessDenied(401, "this bridge requires a token: add ?token=... to the URL")
        if not hmac.compare_digest(presented.encode("utf-8"), policy.token.encode("utf-8")):
            return AccessDenied(401, "wrong token")
    return None
