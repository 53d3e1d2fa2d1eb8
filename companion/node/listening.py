"""Whether a host listens where it was told to, and if not, an error that names the address.

py-libp2p 0.8.1 logs a listener that cannot bind (``Failed to start TCP listener ...``) and goes
on without it: ``Swarm.listen`` only fails when no address at all worked, and ``host.run`` does
not even look at that. A node on a port that is in use would then run unreachable, printing a
peer id with no address. :func:`require_listening` turns that into :class:`ListenError` naming
each address, with the reason found by binding the address once more ourselves.

py-libp2p 0.8.1 also sets ``SO_REUSEPORT`` on every TCP listener (``_set_reuse_flags``, for
DCUtR hole punching, which dials from the listen port; companion does not use it). With it,
two nodes of the same user bind the same port and the kernel hands each dial to either one:
a second ``companion run --listen`` on a port in use started silently instead of exiting 2.
:func:`exclusive_listeners` puts ``SO_REUSEADDR`` alone in its place (a restarted node still
binds its port again at once, past the old connections' ``TIME_WAIT``).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any

import libp2p.transport.tcp.tcp as _tcp
from multiaddr import Multiaddr

from ..bind import bind_reason

__all__ = ["ListenError", "exclusive_listeners", "require_listening"]


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


def _probe(addr: str) -> tuple[int | None, str | None]:
    """Bind ``addr`` (``/ip4|ip6/HOST/tcp/PORT``) as trio's listener does, to learn the reason."""
    parts = addr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp" or not parts[3].isdigit():
        return None, None
    family = socket.AF_INET if parts[0] == "ip4" else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            with contextlib.suppress(OSError):
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((parts[1], int(parts[3])))
    except OSError as exc:
        return exc.errno, exc.strerror
    return None, None


def _reuse_address_only(sock: Any) -> None:
    """py-libp2p's ``_set_reuse_flags`` without ``SO_REUSEPORT``: a port is one node's."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def exclusive_listeners() -> None:
    """Make py-libp2p's TCP listeners bind their port alone (see the module's docstring);
    raises ``RuntimeError`` if py-libp2p no longer has the function this replaces (an upgrade
    to check, rather than ports silently shared again)."""
    if not callable(getattr(_tcp, "_set_reuse_flags", None)):
        raise RuntimeError("py-libp2p's TCP transport has no _set_reuse_flags: check SO_REUSEPORT anew")
    _tcp._set_reuse_flags = _reuse_address_only
