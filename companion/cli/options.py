"""Flags more than one command shares, and how their values are read."""

from __future__ import annotations

import os
import secrets
from typing import Final

__all__ = ["TOKEN_ENV", "parse_ws_address", "resolve_token"]

TOKEN_ENV: Final = "COMPANION_BRIDGE_TOKEN"


def parse_ws_address(value: str) -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080``, ``localhost:0`` or just ``8080`` (on 127.0.0.1)."""
    text = value.strip()
    if text.startswith("ws://"):
        text = text[len("ws://") :].rstrip("/")
    if text.isdigit():
        return "127.0.0.1", _port(text, value)
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"--ws {value!r}: write an IPv6 address as [::1]:8080")
        return host, _port(port, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--ws {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host, _port(port, value)


def _port(text: str, value: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"--ws {value!r}: the port must be a number from 0 to 65535")
    return int(text)


def resolve_token(arg: str | None) -> str | None:
    """``--token X`` -> X; ``--token`` -> $COMPANION_BRIDGE_TOKEN or a fresh random token; absent
    -> $COMPANION_BRIDGE_TOKEN or no token."""
    env = os.environ.get(TOKEN_ENV) or None
    if arg is None:
        return env
    if arg:
        return arg
    return env or secrets.token_urlsafe(18)
