"""What the commands print on standard output, one fact a line, for people and scripts alike.

``companion run`` prints ``<id> peer <peer id>`` then one indented address a line, and
``<id> sees <id>,<id>...`` whenever a node's directory changes; with ``--ws`` it prints
``bridge ws://HOST:PORT/`` then the page and WebRTC URLs. ``companion bridge`` prints
``bridge peer <peer id>`` and ``companion relay`` prints ``relay peer <peer id>``, each with
indented addresses. The demo reads these lines from its children; tests read them too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from companion.log import log_event

if TYPE_CHECKING:
    from companion.node import CompanionNode

__all__ = [
    "BRIDGE_LINE",
    "PEER",
    "RELAY_LINE",
    "announce_directory",
    "dialable",
    "parse_peer_line",
    "parse_sees",
    "peer_line",
    "print_addresses",
    "sees_line",
]

logger = logging.getLogger("companion.app.lines")

BRIDGE_LINE: Final = "bridge "
"""``bridge ws://HOST:PORT/`` once clients can connect (``companion run --ws``)."""
RELAY_LINE: Final = "relay peer "
"""``relay peer <peer id>`` (``companion relay``)."""
PEER: Final = " peer "
_SEES: Final = " sees "


def peer_line(name: str, peer_id: str) -> str:
    """``<name> peer <peer id>``: a node is listening (its addresses follow, indented)."""
    return f"{name}{PEER}{peer_id}"


def parse_peer_line(line: str) -> tuple[str, str] | None:
    """The ``(companion id, peer id)`` of a companion's :func:`peer_line`, else ``None``."""
    if not line.startswith("companion_") or PEER not in line:
        return None
    cid, _, peer = line.partition(PEER)
    return cid, peer.strip()


def sees_line(companion_id: str, ids: Iterable[str]) -> str:
    """``<id> sees <id>,<id>``: the companions a node's directory holds (itself included)."""
    return f"{companion_id}{_SEES}{','.join(sorted(ids))}"


def parse_sees(line: str) -> tuple[str, frozenset[str]] | None:
    """The ``(companion id, directory)`` of a :func:`sees_line`, else ``None``."""
    cid, sep, rest = line.strip().partition(_SEES)
    if not sep or not cid.startswith("companion_") or " " in cid:
        return None
    return cid, frozenset(filter(None, rest.split(",")))


def dialable(addr: str) -> list[str]:
    """A wildcard listen address spelled out with this machine's IPv4 addresses (for ``--peer``)."""
    from companion.node.addresses import expand_wildcard

    return expand_wildcard(addr, loopback=False)


def print_addresses(addrs: Iterable[str]) -> None:
    """One indented, dialable address a line (after a :func:`peer_line`)."""
    for addr in addrs:
        for shown in dialable(addr):
            print(f"  {shown}", flush=True)


def announce_directory(node: CompanionNode) -> None:
    """Print a :func:`sees_line` now and whenever the node's set of companions changes."""
    shown: set[str] | None = None

    def report(_event: object = None) -> None:
        nonlocal shown
        now = set(node.directory)
        if now != shown:
            shown = now
            try:
                print(sees_line(node.name, now), flush=True)
            except OSError as exc:  # nobody reads stdout any more: the node keeps running
                log_event(logger, "stdout_closed", logging.WARNING, node=node.name, error=repr(exc))

    node.add_membership_listener(report)
    report()
