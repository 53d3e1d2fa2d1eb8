"""Whether a host listens where it was told to, and if not, an error that names the address.

py-libp2p 0.8.1 logs a listener that cannot bind (``Failed to start TCP listener ...``) and goes
on without it: ``Swarm.listen`` only fails when no address at all worked, and ``host.run`` does
not even look at that. A node on a port that is in use would then run unreachable, printing a
peer id with no address. :func:`require_listening` turns that into :class:`ListenError` naming
each address, with the reason found by binding the address once more ourselves.

py-libp2p 0.8.1 also opens every TCP listener with ``SO_REUSEPORT`` (DCUtR's hole punch dials
from the listen port, which needs it on both sockets), so a second node of the same user binds
a port another one listens on, and the kernel hands each dial to either one: a second ``companion
run --listen`` on a port in use started silently instead of exiting 2. :func:`refuse_taken`
binds each fixed port once without ``SO_REUSEPORT`` before the host starts, which fails while
anything listens there; hole punching keeps the option. Two nodes started within the same
instant can both pass that check, so :func:`require_alone` looks once more when the host
listens: another listening socket on the same address and port (the kernel's table,
``/proc/net/tcp``) means the port is shared, and the node stops (both racers may; neither
shares a port silently).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from typing import Any

from multiaddr import Multiaddr

from companion.bind import bind_reason

__all__ = ["ListenError", "refuse_taken", "require_alone", "require_listening"]


class ListenError(OSError):
    """A listen address could not be bound; the message names it and says what to do."""

    def __str__(self) -> str:
        return str(self.strerror)


def require_listening(host: Any, requested: Iterable[str], flag: str = "--listen") -> None:
    """Raise :class:`ListenError` unless ``host`` (py-libp2p's, running) listens on each of
    the ``requested`` multiaddrs."""
    listening = set(getattr(host.get_network(), "listeners", {}))
    problems = [_problem(addr, flag) for addr in requested if str(Multiaddr(addr)) not in listening]
    if problems:
        raise ListenError(problems[0][0], "; ".join(text for _, text in problems))


def _problem(addr: str, flag: str) -> tuple[int | None, str]:
    code, strerror = _probe(addr)
    parts = addr.split("/")
    free = None
    if "tcp" in parts and parts.index("tcp") + 1 < len(parts):
        at = parts.index("tcp") + 1
        free = "/".join([*parts[:at], "0", *parts[at + 1 :]])
    return code, f"cannot listen on {addr} ({flag}): {bind_reason(code, strerror, free)}"


def _tcp(addr: str) -> tuple[int, str, int] | None:
    """``/ip4|ip6/HOST/tcp/PORT...`` as (address family, host, port); ``None`` for other forms."""
    parts = addr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp" or not parts[3].isdigit():
        return None
    return (socket.AF_INET if parts[0] == "ip4" else socket.AF_INET6), parts[1], int(parts[3])


def _probe(addr: str) -> tuple[int | None, str | None]:
    """Bind ``addr`` (``/ip4|ip6/HOST/tcp/PORT``) as trio's listener does, to learn the reason."""
    parsed = _tcp(addr)
    if parsed is None:
        return None, None
    family, host, port = parsed
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            with contextlib.suppress(OSError):
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return exc.errno, exc.strerror
    return None, None


def refuse_taken(requested: Iterable[str], flag: str = "--listen") -> None:
    """Raise :class:`ListenError` if one of the ``requested`` multiaddrs with a fixed port cannot
    be bound without ``SO_REUSEPORT`` (another node or program listens there); port 0 and
    addresses this cannot probe are left to py-libp2p (and :func:`require_listening`)."""
    for addr in requested:
        code, text = _problem(addr, flag)
        if code is not None:
            raise ListenError(code, text)


_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))
_LISTEN = "0A"


def require_alone(host: Any, requested: Iterable[str], flag: str = "--listen") -> None:
    """Raise :class:`ListenError` if another socket listens on one of the ``requested`` fixed
    ports beside ``host``'s own listeners (see the module's docstring). Skipped where the
    kernel's table or the host's sockets cannot be read."""
    ours: set[int] = set()
    try:
        for listener in host.get_network().listeners.values():
            for served in listener.listeners:
                ours.add(os.fstat(served.socket.fileno()).st_ino)
    except (AttributeError, OSError):
        return
    shared_on = _shared(requested, ours)
    if shared_on is not None:
        raise ListenError(*_problem(shared_on, flag))


def _shared(requested: Iterable[str], ours: set[int]) -> str | None:
    """The first of ``requested`` on which a listening socket other than ``ours`` (inodes)
    listens too, the address's wildcard included."""
    for addr in requested:
        parsed = _tcp(addr)
        if parsed is None or parsed[2] == 0:
            continue
        family, host, port = parsed
        try:
            mine = _kernel_hex(family, socket.inet_pton(family, host))
        except OSError:
            continue
        wildcard = "0" * len(mine)
        for other_family, address, other_port, inode in _listening():
            if other_family != family or other_port != port or inode in ours:
                continue
            if wildcard in (mine, address) or address == mine:
                return addr
    return None


def _kernel_hex(family: int, packed: bytes) -> str:
    """An address as the kernel's table spells it: each 32-bit word in host (little-endian) order."""
    if family == socket.AF_INET:
        return packed[::-1].hex().upper()
    return "".join(packed[i : i + 4][::-1].hex().upper() for i in range(0, 16, 4))


def _listening() -> list[tuple[int, str, int, int]]:
    """Every listening TCP socket of this network namespace: family, address, port, inode."""
    found: list[tuple[int, str, int, int]] = []
    for path, family in _TABLES:
        try:
            with open(path, encoding="ascii") as table:
                lines = table.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            with contextlib.suppress(ValueError):
                found.append((family, address, int(port, 16), int(fields[9])))
    return found
