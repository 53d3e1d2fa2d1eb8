"""The addresses a host advertises: wildcards spelled out, and a circuit address per relay.

py-libp2p 0.8.1 advertises what it listens on as it is, so a node listening on ``0.0.0.0`` tells
its peers (identify, signed peer records, the DHT) to dial ``/ip4/0.0.0.0/...``. And it cannot
advertise a relay: ``BasicHost.get_addrs`` strips "an existing /p2p/ component" from each address
with ``decapsulate``, which cuts ``<relay>/p2p/RELAY/p2p-circuit`` back to the relay's own
address, so an ``addrs_factory`` that adds a circuit address makes the host advertise the relay's
address under its own peer id. :class:`AdvertisedAddrs` replaces the host's ``get_addrs`` (on
that one host object) with one that expands wildcards and appends well-formed circuit addresses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import multiaddr

__all__ = ["AdvertisedAddrs", "expand_wildcard", "interface_ipv4s"]

INTERFACES_TTL: Final = 30.0
"""Seconds the interface list is reused (get_addrs runs for every RPC's signed peer record)."""

ADDRS_TTL: Final = 10.0
"""Seconds :meth:`AdvertisedAddrs.addrs` reuses its answer. With 1 s, an idle node (an RPC every
second or so) rebuilt it for nearly every RPC (~0.2 ms each, about a tenth of an idle node's CPU
at 30 companions); longer than 10 s would delay advertising an address identify confirmed as
observed (the one a peer behind NAT is reached at)."""

_cache: tuple[float, list[str]] = (-INTERFACES_TTL, [])


def interface_ipv4s() -> list[str]:
    """This machine's IPv4 addresses, loopback last (through zeroconf's ``ifaddr``)."""
    global _cache
    now = time.monotonic()
    if now - _cache[0] < INTERFACES_TTL:
        return _cache[1]
    try:
        import ifaddr  # zeroconf's dependency, so present wherever py-libp2p is

        found = [
            str(ip.ip) for adapter in ifaddr.get_adapters() for ip in adapter.ips if isinstance(ip.ip, str)
        ]
    except Exception:
        found = []
    ordered = sorted(dict.fromkeys(found), key=lambda ip: ip.startswith("127."))
    _cache = (now, ordered)
    return ordered


def expand_wildcard(addr: str, *, loopback: bool = True) -> list[str]:
    """``/ip4/0.0.0.0/...`` as one address per interface; any other address as it is."""
    if "/ip4/0.0.0.0/" not in addr:
        return [addr]
    ips = [ip for ip in interface_ipv4s() if loopback or not ip.startswith("127.")]
    return [addr.replace("/ip4/0.0.0.0/", f"/ip4/{ip}/") for ip in ips] or [addr]


@dataclass
class AdvertisedAddrs:
    """What one host advertises; :meth:`install` makes it the host's ``get_addrs``."""

    circuits: dict[str, multiaddr.Multiaddr] = field(default_factory=dict)
    """Relay peer id -> ``<relay>/p2p/RELAY/p2p-circuit``, while a reservation there holds."""
    _original: Callable[[], list[multiaddr.Multiaddr]] | None = None
    _suffix: str = ""
    _cached: tuple[float, tuple[str, ...], list[multiaddr.Multiaddr]] | None = None

    def install(self, host: Any) -> None:
        self._original = host.get_addrs
        self._suffix = f"/p2p/{host.get_id().to_base58()}"
        host.get_addrs = self.addrs

    def addrs(self) -> list[multiaddr.Multiaddr]:
        """The advertised addresses, the same list for ``ADDRS_TTL`` seconds while the circuits
        stay the same: py-libp2p asks for them on every RPC it sends (to compare with its signed
        peer record), and building them (``Multiaddr`` parsing, py-libp2p's own ``get_addrs``)
        was ~7 % of a node's CPU in a 10-node mesh at 20 msg/s (py-spy). A new listen address
        shows within the TTL; nothing is cached while there is none yet."""
        now = time.monotonic()
        circuits = tuple(str(c) for c in self.circuits.values())
        cached = self._cached
        if cached is not None and now - cached[0] < ADDRS_TTL and cached[1] == circuits:
            return list(cached[2])
        found = self._build()
        self._cached = (now, circuits, found) if found else None
        return list(found)

    def _build(self) -> list[multiaddr.Multiaddr]:
        assert self._original is not None
        out: list[str] = []
        for addr in self._original():
            out.extend(expand_wildcard(str(addr)))
        non_loopback = [a for a in out if "/ip4/127." not in a]
        if non_loopback:
            out = non_loopback
        out.extend(f"{circuit}{self._suffix}" for circuit in self.circuits.values())
        return [multiaddr.Multiaddr(a) for a in dict.fromkeys(out)]
