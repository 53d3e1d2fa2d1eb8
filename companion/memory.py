"""The in-memory transport: :class:`MemoryHub`, gossip without sockets, with fault hooks.

The engine and the action runtime see only :class:`~companion.ports.Publisher` and a stream of
:class:`~companion.ports.Inbound` values (re-exported here). The libp2p node implements them over
gossipsub; :class:`MemoryHub` implements them in memory so the engine runs in unit tests without
sockets, with hooks to drop, delay or duplicate deliveries for fault injection. Like gossipsub
it follows the echo rule of :mod:`companion.ports`: every endpoint receives what it published.
A hub whose fault hook sleeps is opened (``async with MemoryHub(fault=...) as hub:``): each
delivery then waits in a task of the hub's own, and leaving the block drops those still waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from companion.log import log_event
from companion.ports import Inbound, Publisher
from companion.protocol import (
    STATES,
    Envelope,
    PayloadError,
    State,
    encode,
    encode_states,
    parse_payload,
)
from companion.tasks import OwnsTasks

__all__ = ["Fault", "Inbound", "MemoryEndpoint", "MemoryHub", "Publisher", "encode_for_topic"]

logger = logging.getLogger("companion.memory")


def encode_for_topic(topic: str, envelope: Envelope | list[State]) -> bytes:
    if isinstance(envelope, list):
        if topic != STATES:
            raise ValueError(f"a list of State is published on {STATES!r}, not {topic!r}")
        return encode_states(envelope)
    return encode(envelope)


Fault = Callable[[str, str, bytes], Awaitable[list[bytes]]]
"""``(topic, receiver, data) -> deliveries``: return ``[]`` to drop, ``[data, data]`` to duplicate;
it may sleep to delay. Used by tests to inject faults per receiver."""


@dataclass
class MemoryEndpoint:
    """One participant on a :class:`MemoryHub`: publishes to everyone (itself included)."""

    name: str
    hub: MemoryHub
    send_channel: trio.MemorySendChannel[Inbound]
    receive_channel: trio.MemoryReceiveChannel[Inbound]
    connected: bool = True

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        if not self.connected:
            return
        await self.hub.deliver(self.name, topic, encode_for_topic(topic, envelope))

    def disconnect(self) -> None:
        """Simulate a crashed peer: it neither sends nor receives from now on."""
        self.connected = False


@dataclass
class MemoryHub(OwnsTasks):
    """In-memory gossip: every published payload reaches every connected endpoint as bytes,
    is parsed at the receiving edge exactly as the libp2p node does, and arrives in order
    unless a fault hook says otherwise.

    Without a fault hook a delivery is a channel put and the hub needs no opening. With one,
    open it (``async with hub:``) so that a hook that sleeps delays only its own receiver; a hub
    not open runs the hook inside the publisher's call, one receiver after another."""

    buffer: int = 1024
    fault: Fault | None = None
    endpoints: dict[str, MemoryEndpoint] = field(default_factory=dict)

    def endpoint(self, name: str) -> MemoryEndpoint:
        if name in self.endpoints:
            raise ValueError(f"endpoint {name!r} already exists")
        send, receive = trio.open_memory_channel[Inbound](self.buffer)
        ep = MemoryEndpoint(name, self, send, receive)
        self.endpoints[name] = ep
        return ep

    async def deliver(self, sender: str, topic: str, data: bytes) -> None:
        for receiver in list(self.endpoints.values()):
            if not receiver.connected:
                continue
            if self.fault is None:
                self._put(receiver, sender, topic, data)
            elif self._nursery is not None:  # open: each delivery waits in a task of the hub's
                self.tasks.start_soon(self._faulty, receiver, sender, topic, data)
            else:
                await self._faulty(receiver, sender, topic, data)

    async def _faulty(self, receiver: MemoryEndpoint, sender: str, topic: str, data: bytes) -> None:
        assert self.fault is not None
        for copy in await self.fault(topic, receiver.name, data):
            if receiver.connected:
                self._put(receiver, sender, topic, copy)

    def _put(self, receiver: MemoryEndpoint, sender: str, topic: str, data: bytes) -> None:
        parsed = parse_payload(topic, data)
        if isinstance(parsed, PayloadError):
            log_event(
                logger,
                "payload_dropped",
                logging.WARNING,
                reason=parsed.reason,
                detail=parsed.detail,
                topic=topic,
                peer=sender,
            )
            return
        try:
            receiver.send_channel.send_nowait(Inbound(topic, parsed, sender, data))
        except trio.WouldBlock:
            log_event(logger, "inbound_overflow", logging.WARNING, receiver=receiver.name, topic=topic)
