"""The client's WebSocket opening handshake, checked before anything is upgraded (RFC 6455 §4.2.1).

trio-websocket (wsproto) answers any ``Sec-WebSocket-Key`` it is given, ``!!`` included. A
malformed handshake is not a client we can serve: it is refused with 400 and a reason before
the bridge spends a session on it. A well-formed request for another protocol version gets
426 with ``Sec-WebSocket-Version: 13`` (RFC 6455 §4.4), so a client can retry with ours.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Final

from companion.bridge.access import AccessDenied

__all__ = ["WEBSOCKET_VERSION", "check_handshake", "header_tokens"]

WEBSOCKET_VERSION: Final = "13"
KEY_BYTES: Final = 16


def header_tokens(value: str | None) -> set[str]:
    """The comma-separated tokens of a header, lower-cased (``Connection: keep-alive, Upgrade``)."""
    if not value:
        return set()
    return {part.strip().lower() for part in value.split(",") if part.strip()}


def _key_ok(key: str) -> bool:
    try:
        decoded = base64.b64decode(key.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(decoded) == KEY_BYTES


def check_handshake(method: str, http_version: str, headers: Mapping[str, str]) -> AccessDenied | None:
    """``None`` if this is a well-formed RFC 6455 opening handshake (``headers``: lower-cased names)."""
    if method != "GET":
        return AccessDenied(400, f"a WebSocket handshake is a GET request, not {method[:20]}")
    if http_version != "1.1":
        return AccessDenied(400, f"a WebSocket handshake needs HTTP/1.1, not HTTP/{http_version[:10]}")
    if "websocket" not in header_tokens(headers.get("upgrade")):
        return AccessDenied(400, "Upgrade: websocket is missing")
    if "upgrade" not in header_tokens(headers.get("connection")):
        return AccessDenied(400, "Connection: Upgrade is missing")
    key = headers.get("sec-websocket-key")
    if key is None:
        return AccessDenied(400, "Sec-WebSocket-Key is missing")
    if not _key_ok(key):
        return AccessDenied(400, "Sec-WebSocket-Key must be the base64 encoding of 16 random bytes")
    version = headers.get("sec-websocket-version")
    if version is None:
        return AccessDenied(400, "Sec-WebSocket-Version is missing")
    version = version.strip()
    if version != WEBSOCKET_VERSION:
        if not version.isdigit():
            return AccessDenied(400, f"Sec-WebSocket-Version {version[:20]!r} is not a number")
        return AccessDenied(
            426,
            f"WebSocket version {version[:10]} is not supported; use {WEBSOCKET_VERSION}",
            (("Sec-WebSocket-Version", WEBSOCKET_VERSION),),
        )
    return None
