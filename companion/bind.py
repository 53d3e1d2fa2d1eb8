"""Why a listening socket could not be bound, in words that say what to do: one wording for the
bridge's ``--ws`` and the nodes' ``--listen``."""

from __future__ import annotations

import errno

__all__ = ["bind_reason"]


def bind_reason(code: int | None, strerror: str | None, free: str | None) -> str:
    """Why binding failed, in words that say what to do; ``free`` is the same address with port
    0, suggested when the port is taken."""
    if code == errno.EADDRINUSE:
        why = "the address is already in use (another program listens there); choose another port"
        return f"{why}, e.g. {free} for a free one" if free else why
    if code == errno.EADDRNOTAVAIL:
        return "this machine has no such address; use 127.0.0.1, 0.0.0.0 or one of its own addresses"
    if code == errno.EACCES:
        return "permission denied (ports below 1024 need privileges); choose a port above 1024"
    return strerror or "it could not be bound"
