"""The seam between a WebRTC session and the bridge: the same frame path a WebSocket client has.

A session does not publish or fan out anything itself. The bridge opens a :class:`FirehoseLink`
for each WebRTC client (a client id, its bounded outbound queue, its topics) and the session
moves frames between the link and the data channel. Only the voice feature talks to the
network on its own account: it publishes the results of the speak queries it answered.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from ..protocol import Envelope

__all__ = ["ClientInfo", "FirehoseLink", "LinkClosed", "LinkOpener"]


class LinkClosed(Exception):
    """The bridge dropped this client (too slow, shutting down); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """What the bridge learns about a WebRTC client when it connects."""

    session_id: str
    topics: frozenset[str] | None
    """Requested topics (``None``: the bridge's default, like a WebSocket without ``?topics=``)."""
    voice: bool
    """Whether the session answers ``speak`` queries with audio on its track."""


class FirehoseLink(Protocol):
    """One client's place in the bridge."""

    async def next_frame(self) -> str:
        """The next frame for this client (raw payload JSON or an error frame), in order.
        Raises :class:`LinkClosed` when the bridge has dropped the client."""
        ...

    async def client_frame(self, data: str | bytes) -> None:
        """A frame the client sent, exactly as a WebSocket message would arrive: the bridge
        publishes it (through its receive hook) or queues an error frame for the client."""
        ...

    async def publish(self, topic: str, envelope: Envelope) -> None:
        """Publish on the client's behalf (the session's speak results), fanned out to the
        bridge's other clients like any client publication."""
        ...


LinkOpener = Callable[[ClientInfo], AbstractAsyncContextManager[FirehoseLink]]
"""The bridge registers the client on enter and unregisters it on exit."""
