"""py-libp2p 0.8.1's records that mean nothing at the default levels, named one by one.

:mod:`companion.log` routes py-libp2p's records through the companion's handler, bounded and
throttled; this module tells it which of them are routine (left out unless the ``libp2p`` logger
is at DEBUG), because only the node knows the library's messages. It registers its predicate with
:func:`companion.log.add_routine` when imported, which the node's protocol modules do: every
process that runs a node has it.
"""

from __future__ import annotations

import logging
import re
from typing import Final

from companion.log import add_routine

_END_OF_STREAM = frozenset({"StreamEOF", "MuxedStreamEOF"})
"""py-libp2p's exceptions for a stream the other side closed for writing: its request is done."""
_ROUTINE_AT_END = frozenset({"Failed to read DHT message from stream: %s"})
"""py-libp2p 0.8.1 warnings that mean nothing when their argument is an end of stream: the DHT
server treats only a zero-byte read as a clean end, so every peer that half-closes its request
stream after the answer (py-libp2p's and js-libp2p's clients do) made a warning on the server."""
_PEER_GONE: Final = (
    re.compile(
        r"Failed to open stream to (\w+): "
        r"(No valid connections available for peer|failed to open a stream to peer) \1"
    ),
    re.compile(r"Failed to parse protobuf message: "),
)
"""py-libp2p 0.8.1 DHT warnings (formatted in place, no arguments) that a peer which just left
causes: a lookup that still asks it (no connection left, or the one left closing; py-libp2p
drops it from the routing table), and a request it was being answered on reset (``StreamReset``
has no text: a malformed message's ``DecodeError`` has, and still shows). Stopping the demo's
companions printed one or two in 5 of 6 runs."""


_DIAL_FAILED: Final = ("libp2p.transport.tcp.tcp", "Failed to open TCP stream: %s")
"""py-libp2p 0.8.1's TCP transport logs every refused or unreachable dial at ERROR level, then
raises the same text (``OpenConnectionError``) to the code that dialled, which reports it at the
level it means (a bootstrap peer that is down: ``bootstrap_dial_failed``; a peer that just
left, dialled by the ring or the DHT: DEBUG). Stopping 10 companions together printed two."""

_LISTEN_FAILED: Final = ("libp2p.transport.tcp.tcp", "Failed to start TCP listener for ")
"""py-libp2p 0.8.1 logs a listener that cannot bind at ERROR level and goes on; the node then
refuses to run (:func:`companion.node.listening.require_listening`) with an error that names the
address and what to do, printed once by the command (``companion run`` printed both)."""

_SELF_REPORTED: set[str] = set()
"""Protocols whose failed negotiation the code that opens them reports itself, at the level it
means (:func:`reports_stream_failures`)."""


def reports_stream_failures(*protocols: str) -> None:
    """Say that the caller reports a stream it could not open on one of ``protocols`` itself:
    py-libp2p 0.8.1 logs every failed ``new_stream`` at ERROR level with its whole diagnosis,
    and a peer that does not speak an optional protocol (a bridge asked for its metadata) is
    no error. Those records are left out (kept at py-libp2p's DEBUG level)."""
    _SELF_REPORTED.update(protocols)


def _self_reported_stream_failure(record: logging.LogRecord) -> bool:
    msg = record.msg
    if not isinstance(msg, str) or not msg.startswith("Failed to open stream to peer"):
        return False
    head = msg.split("\n", 3)[:3]
    return any(f"'{protocol}'" in line for line in head for protocol in _SELF_REPORTED)


def _listen_failed(record: logging.LogRecord) -> bool:
    name, prefix = _LISTEN_FAILED
    return record.name == name and isinstance(record.msg, str) and record.msg.startswith(prefix)


def _peer_gone(record: logging.LogRecord) -> bool:
    """Whether ``record`` is one of :data:`_PEER_GONE`."""
    if not record.name.startswith("libp2p.kad_dht") or record.args or not isinstance(record.msg, str):
        return False
    return any(pattern.fullmatch(record.msg) for pattern in _PEER_GONE)


def _routine_end_of_stream(record: logging.LogRecord) -> bool:
    """Whether ``record`` is one of :data:`_ROUTINE_AT_END` about a stream the peer ended."""
    if record.msg not in _ROUTINE_AT_END or not isinstance(record.args, tuple) or not record.args:
        return False
    return type(record.args[0]).__name__ in _END_OF_STREAM


def routine(record: logging.LogRecord) -> bool:
    """Whether ``record`` is one of py-libp2p's routine records named above."""
    return (
        _routine_end_of_stream(record)
        or _self_reported_stream_failure(record)
        or _peer_gone(record)
        or (record.name, record.msg) == _DIAL_FAILED
        or _listen_failed(record)
    )


add_routine(routine)
