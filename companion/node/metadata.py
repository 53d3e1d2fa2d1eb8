"""The ``/aikyo/metadata/1.0.0`` stream protocol: how companions learn who is behind a peer.

The listener writes its metadata JSON in one write and closes; the dialer reads to the end.
aikyo's nodes answer a peer they already know with an empty stream, so a node must have asked
for the peer's metadata before it answers the peer's own request; :class:`RequestGate` holds
an answer back until our own request to that peer has been accepted (bounded by a deadline).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import trio
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.protocol_muxer.exceptions import MultiselectClientError, ProtocolNotSupportedError

from companion.log import log_event
from companion.node.logfilters import reports_stream_failures
from companion.protocol import Metadata, PayloadError, parse_metadata

__all__ = [
    "MAX_METADATA_BYTES",
    "METADATA_PROTOCOL",
    "FetchOutcome",
    "RequestGate",
    "encode_metadata",
    "fetch_metadata",
    "serve_metadata",
]

logger = logging.getLogger("companion.node.metadata")

METADATA_PROTOCOL: Final = TProtocol("/aikyo/metadata/1.0.0")
reports_stream_failures(METADATA_PROTOCOL)  # a peer without it is no error: see where it is opened
MAX_METADATA_BYTES: Final = 64 * 1024
HELD_METADATA_WAIT: Final = 60.0
"""How long a metadata request waits for a companion that is not present yet: longer than an
engine takes to get ready (a provider model's check has a 10 s deadline, after which ``companion
run`` exits), so every waiting asker is answered once it is."""

FetchStatus = Literal["ok", "empty", "unsupported", "invalid", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """What a metadata request brought: ``metadata`` only when ``status == "ok"``."""

    status: FetchStatus
    metadata: Metadata | None = None
    detail: str = ""


def encode_metadata(metadata: Metadata) -> bytes:
    """Compact JSON in schema order, as ``JSON.stringify`` writes it."""
    return json.dumps(metadata.model_dump(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_metadata(data: bytes) -> FetchOutcome:
    if not data:
        return FetchOutcome("empty")
    parsed = parse_metadata(data, max_bytes=MAX_METADATA_BYTES)
    if isinstance(parsed, PayloadError):
        return FetchOutcome("invalid", detail=str(parsed)[:200])
    return FetchOutcome("ok", parsed)


class RequestGate:
    """Per peer: set once our metadata request to it was accepted, failed or given up."""

    def __init__(self) -> None:
        self._events: dict[ID, trio.Event] = {}

    def _event(self, peer: ID) -> trio.Event:
        event = self._events.get(peer)
        if event is None:
            event = self._events[peer] = trio.Event()
        return event

    def open(self, peer: ID) -> None:
        self._event(peer).set()

    async def wait(self, peer: ID, timeout: float) -> bool:
        """Wait until our request to ``peer`` is under way; ``False`` if the deadline passed."""
        with trio.move_on_after(timeout):
            await self._event(peer).wait()
            return True
        return False

    def forget(self, peer: ID) -> None:
        self._events.pop(peer, None)


async def fetch_metadata(host: Any, peer: ID, gate: RequestGate, *, timeout: float) -> FetchOutcome:
    """Ask ``peer`` for its metadata; opens ``gate`` for the peer as soon as the request is accepted."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout):
        try:
            stream = await host.new_stream(peer, [METADATA_PROTOCOL])
        except Exception as exc:  # py-libp2p wraps negotiation failures in StreamFailure
            gate.open(peer)
            cause = exc.__cause__
            if isinstance(cause, ProtocolNotSupportedError) or (
                isinstance(cause, MultiselectClientError) and "not supported" in str(cause)
            ):
                return FetchOutcome("unsupported", detail=str(cause)[:200])
            return FetchOutcome("error", detail=f"{type(exc).__name__}: {exc}"[:200])
        gate.open(peer)
        try:
            while size <= MAX_METADATA_BYTES:
                try:
                    chunk = await stream.read(MAX_METADATA_BYTES + 1 - size)
                except StreamEOF:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except Exception as exc:
            return FetchOutcome("error", detail=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            await _close_quietly(stream)
        if size > MAX_METADATA_BYTES:
            return FetchOutcome("invalid", detail=f"metadata over {MAX_METADATA_BYTES} bytes")
        return decode_metadata(b"".join(chunks))
    gate.open(peer)
    return FetchOutcome("timeout", detail=f"no answer within {timeout} s")


async def serve_metadata(
    stream: Any,
    metadata: Metadata,
    gate: RequestGate,
    *,
    wait: float,
    present: Callable[[float], Awaitable[bool]] | None = None,
) -> None:
    """Answer one metadata request: wait (bounded) for our own request to the peer, then write.

    ``present``: waits (at most the seconds it is given) until the companion is present to
    others, ``False`` if it is not by then (``CompanionNode(present=False)``). The answer waits
    up to :data:`HELD_METADATA_WAIT` for it; past that the stream closes unanswered. A node of
    ours gave up earlier (its own ``metadata_timeout``) and learns the companion from its
    announcement; an aikyo node learns companions only from this answer and waits without a
    deadline, so it is answered as soon as the companion is ready."""
    peer: ID = stream.muxed_conn.peer_id
    try:
        if present is not None and not await present(HELD_METADATA_WAIT):
            log_event(logger, "metadata_held", logging.DEBUG, peer=str(peer))
            return
        if not await gate.wait(peer, wait):
            log_event(logger, "metadata_answer_unordered", logging.DEBUG, peer=str(peer))
        with trio.move_on_after(wait):
            await stream.write(encode_metadata(metadata))
    except Exception as exc:
        log_event(logger, "metadata_answer_failed", logging.DEBUG, peer=str(peer), error=repr(exc))
    finally:
        await _close_quietly(stream)


async def _close_quietly(stream: Any) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except Exception:
            try:
                await stream.reset()
            except Exception:
                return
