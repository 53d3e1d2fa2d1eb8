"""Who may use the bridge: the Host rule, the browser origin rule and the shared token, as pure checks.

A browser tab on any website can send requests to ``127.0.0.1``. Two attacks follow, and one
rule stops each:

- **Cross-site requests.** A page on ``https://evil.example`` opens a WebSocket to
  ``ws://127.0.0.1:8080``. Browsers always send ``Origin``, so a request with an ``Origin`` must
  come from the bridge's own page, a loopback page (local development servers) or an origin
  the operator allowed. Other clients (aikyo's Node examples, Python) send no ``Origin``.
- **DNS rebinding.** The page's own name ``evil.example`` is made to resolve to ``127.0.0.1``;
  its requests then carry ``Origin: http://evil.example:8080`` *and* ``Host: evil.example:8080``,
  so "Origin matches Host" proves nothing. What the attacker cannot choose is a Host that names
  this bridge: so the host part of ``Host`` must be an address the bridge is bound to (for a
  loopback bind: ``localhost``, ``127.0.0.1`` or ``::1``; for a wildcard bind: any IP literal,
  this machine's name, or ``localhost``) or a name the operator allowed. The port is not
  compared: port mappings and proxies change it, and it plays no part in rebinding.

The token comes last: without it a request is 401, so nothing leaks to a host or an origin
that is refused anyway. A bridge bound to anything but loopback must have a token
(:func:`needs_token`): other machines reach it, and the origin rule does not stop a program.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "AccessDenied",
    "AccessPolicy",
    "check_access",
    "check_host",
    "check_origin",
    "check_token",
    "host_name",
    "is_loopback",
    "needs_token",
    "token_from",
]

LOOPBACK_NAMES: Final[frozenset[str]] = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS: Final[frozenset[str]] = frozenset({"", "0.0.0.0", "::"})
ANY: Final = "*"

STATUS_MISDIRECTED: Final = 421
"""A Host that does not name this bridge (RFC 9110 §15.5.20, Misdirected Request)."""


@dataclass(frozen=True, slots=True)
class AccessDenied:
    """A refused request: the HTTP status, the reason sent back, and extra response headers."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


def _normal(name: str) -> str:
    """A host name compared as DNS does: lower case, no trailing dot, IPv6 without brackets."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """``host`` (a bind address or a name) reaches only this machine."""
    name = _normal(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def needs_token(bind_host: str) -> bool:
    """A bridge bound to ``bind_host`` must require a token: anything but loopback does."""
    return not is_loopback(bind_host)


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The bridge's rules.

    ``bind_host`` is the address the bridge listens on; ``allowed_hosts`` are extra names a
    ``Host`` may carry (``--allow-host``; ``*``: any); ``machine_names`` are this machine's own
    names, accepted for a wildcard bind; ``allowed_origins`` are extra browser origins
    (``--allow-origin``; ``*``: any); ``token`` is the shared secret, if any.
    """

    token: str | None = None
    allowed_origins: Collection[str] = ()
    bind_host: str = "127.0.0.1"
    allowed_hosts: Collection[str] = ()
    machine_names: Collection[str] = ()

    def host_accepted(self, name: str) -> bool:
        """Whether a ``Host`` whose host part is ``name`` (normalized) names this bridge."""
        allowed = {_normal(h) for h in self.allowed_hosts}
        if ANY in allowed or name in allowed:
            return True
        bound = _normal(self.bind_host)
        if bound in WILDCARD_HOSTS:
            machine = {_normal(m) for m in self.machine_names}
            return _is_ip(name) or name == "localhost" or name in machine
        if name == bound:
            return True
        return is_loopback(bound) and name in LOOPBACK_NAMES


def host_name(value: str) -> str | None:
    """The host part of a ``Host`` header (``example.com:8080`` -> ``example.com``,
    ``[::1]:80`` -> ``::1``), normalized; ``None`` if it is not a valid ``host[:port]``."""
    value = value.strip()
    if not value or any(c in value for c in " /\\@?#,"):
        return None
    if value.startswith("["):
        inner, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return _normal(inner) if _is_ip(inner) else None
    name, sep, port = value.partition(":")
    if sep and not port.isdigit():
        return None
    return _normal(name) or None


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


def check_host(policy: AccessPolicy, headers: Mapping[str, str]) -> AccessDenied | None:
    """The Host rule (DNS rebinding): ``None`` if ``Host`` names this bridge."""
    value = headers.get("host")
    if value is None:
        return AccessDenied(400, "the request has no Host header")
    name = host_name(value)
    if name is None:
        return AccessDenied(400, f"malformed Host header {value[:100]!r}")
    if policy.host_accepted(name):
        return None
    return AccessDenied(
        STATUS_MISDIRECTED,
        f"host {name[:100]!r} does not name this bridge; if it should, start the bridge with "
        f"--allow-host {name[:100]}",
    )


def check_origin(policy: AccessPolicy, headers: Mapping[str, str]) -> AccessDenied | None:
    """The origin rule (cross-site pages): ``None`` without ``Origin``, or for an allowed one.
    Call it after :func:`check_host`: the bridge's own page is recognized by ``Host``."""
    origin = headers.get("origin")
    if origin is None:
        return None
    allowed = set(policy.allowed_origins)
    if ANY in allowed or origin in allowed or origin.rstrip("/") in allowed:
        return None
    parts = urlsplit(origin)
    if parts.scheme in ("http", "https") and parts.netloc:
        host = headers.get("host")
        if host is not None and parts.netloc.lower() == host.strip().lower():
            return None  # the bridge's own page (its Host passed the Host rule)
        if _normal(parts.hostname or "") in LOOPBACK_NAMES:
            return None  # a page served on this machine (a development server)
    return AccessDenied(
        403, f"origin {origin[:100]!r} is not allowed; start the bridge with --allow-origin {origin[:100]}"
    )


def check_token(policy: AccessPolicy, target: str, headers: Mapping[str, str]) -> AccessDenied | None:
    """The token rule: ``None`` if the bridge has no token or the request presents it."""
    if policy.token is None:
        return None
    presented = token_from(target, headers)
    if presented is None:
        return AccessDenied(
            401,
            "this bridge requires a token: add ?token=... to the URL (the bridge prints its URLs "
            "with the token) or send Authorization: Bearer ...",
        )
    if not hmac.compare_digest(presented.encode("utf-8"), policy.token.encode("utf-8")):
        return AccessDenied(401, "wrong token")
    return None


def check_access(
    policy: AccessPolicy, target: str, headers: Mapping[str, str], *, token: bool = True
) -> AccessDenied | None:
    """``None`` if the request may proceed: Host, then Origin, then (with ``token``) the token.
    ``headers`` are lower-cased names."""
    return (
        check_host(policy, headers)
        or check_origin(policy, headers)
        or (check_token(policy, target, headers) if token else None)
    )
