"""Which local addresses WebRTC may offer as ICE host candidates.

aioice gathers candidates on every interface except loopback, and aiortc gives no way to choose.
A bridge bound to 127.0.0.1 must not open UDP ports on public interfaces, and tests must stay
on loopback, so the gathering function is wrapped once: inside :func:`host_addresses` the
addresses given are used (and only those); elsewhere aioice behaves as it always does.
The choice is a context variable, so two sessions with different rules do not interfere.
"""

from __future__ import annotations

import contextvars
import ipaddress
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import aioice.ice

__all__ = ["LOOPBACK", "candidate_addresses_for", "host_addresses"]

LOOPBACK: Final[tuple[str, ...]] = ("127.0.0.1",)

_ADDRESSES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "companion_ice_addresses", default=None
)
_ORIGINAL: Final = aioice.ice.get_host_addresses


def _gather(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    chosen = _ADDRESSES.get()
    if chosen is None:
        return list(_ORIGINAL(use_ipv4, use_ipv6))
    return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]


def _install() -> None:
    if getattr(aioice.ice.get_host_addresses, "__wrapped_by_companion__", False):
        return
    wrapper: Any = _gather
    wrapper.__wrapped_by_companion__ = True
    aioice.ice.get_host_addresses = wrapper


@contextmanager
def host_addresses(addresses: Sequence[str] | None) -> Iterator[None]:
    """Within the block (and the asyncio tasks it starts), ICE host candidates come from
    ``addresses`` only; ``None`` keeps aioice's default (all non-loopback interfaces)."""
    _install()
    token = _ADDRESSES.set(None if addresses is None else tuple(addresses))
    try:
        yield
    finally:
        _ADDRESSES.reset(token)


def candidate_addresses_for(bind_host: str) -> tuple[str, ...] | None:
    """The ICE addresses that match where the bridge listens: a specific address (loopback
    included) means that address only; a wildcard or a name means every interface."""
    if bind_host == "localhost":
        return LOOPBACK
    try:
        address = ipaddress.ip_address(bind_host.strip("[]"))
    except ValueError:
        return None
    if address.is_unspecified:
        return None
    return (str(address),)
