"""Per-client outbound queues and the slow-client rule, as plain data structures.

Gossip must never wait for a browser tab: the bridge appends each payload to every client's
bounded queue without blocking, and a client whose queue is full has fallen too far behind.
It is marked for disconnection with a reason instead of slowing anyone else down.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from companion.protocol import ACTIONS, MESSAGES, QUERIES, TOPICS

__all__ = [
    "DEFAULT_TOPICS",
    "ClientQueue",
    "ClientRegistry",
    "QueueLimits",
    "parse_topics",
]

DEFAULT_TOPICS: Final[frozenset[str]] = frozenset({MESSAGES, QUERIES, ACTIONS})
"""What aikyo's Firehose forwards to clients; ``states`` only on request."""


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How far behind a client may fall before it is disconnected."""

    max_frames: int = 512
    max_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_frames < 1 or self.max_bytes < 1:
            raise ValueError("queue limits must be positive")


@dataclass
class ClientQueue:
    """Frames waiting to be written to one client. ``push`` never blocks; it refuses instead."""

    limits: QueueLimits = field(default_factory=QueueLimits)
    _frames: deque[tuple[str, int]] = field(default_factory=deque)
    _bytes: int = 0
    overflowed: str | None = None
    """Set (to the reason) once the client fell too far behind; it gets nothing more."""

    def push(self, frame: str, size: int | None = None) -> bool:
        """Queue ``frame`` (``size``: its UTF-8 length, if known); ``False`` (and
        :attr:`overflowed` set) if the client is too slow."""
        if self.overflowed is not None:
            return False
        if size is None:
            size = utf8_size(frame)
        if len(self._frames) + 1 > self.limits.max_frames:
            self.overflowed = (
                f"client too slow: {len(self._frames)} frames waiting (limit {self.limits.max_frames})"
            )
        elif self._bytes + size > self.limits.max_bytes:
            self.overflowed = (
                f"client too slow: {self._bytes + size} bytes waiting (limit {self.limits.max_bytes})"
            )
        if self.overflowed is not None:
            self._frames.clear()
            self._bytes = 0
            return False
        self._frames.append((frame, size))
        self._bytes += size
        return True

    def pop(self) -> str | None:
        if not self._frames:
            return None
        frame, size = self._frames.popleft()
        self._bytes -= size
        return frame

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def pending_bytes(self) -> int:
        return self._bytes


@dataclass
class _Client:
    topics: frozenset[str]
    queue: ClientQueue


@dataclass
class ClientRegistry:
    """Who is connected, what each wants, and what each has not been sent yet."""

    limits: QueueLimits = field(default_factory=QueueLimits)
    _clients: dict[str, _Client] = field(default_factory=dict)

    def add(self, client_id: str, topics: Iterable[str] = DEFAULT_TOPICS) -> ClientQueue:
        if client_id in self._clients:
            raise ValueError(f"client {client_id!r} is already connected")
        queue = ClientQueue(self.limits)
        self._clients[client_id] = _Client(frozenset(topics), queue)
        return queue

    def remove(self, client_id: str) -> None:
        self._clients.pop(client_id, None)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._clients

    def __len__(self) -> int:
        return len(self._clients)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._clients))

    def queue(self, client_id: str) -> ClientQueue:
        return self._clients[client_id].queue

    def broadcast(self, topic: str, frame: str, *, exclude: str | None = None) -> tuple[list[str], list[str]]:
        """Queue ``frame`` for every client subscribed to ``topic`` (but ``exclude``).

        Returns ``(queued, too_slow)``: the clients that got it, and those that just overflowed
        and must be disconnected (each queue's ``overflowed`` says why).
        """
        queued: list[str] = []
        too_slow: list[str] = []
        size = utf8_size(frame)
        for client_id, client in self._clients.items():
            if client_id == exclude or topic not in client.topics:
                continue
            if client.queue.overflowed is not None:
                continue
            if client.queue.push(frame, size):
                queued.append(client_id)
            else:
                too_slow.append(client_id)
        return queued, too_slow


def parse_topics(value: str | None, default: Iterable[str] = DEFAULT_TOPICS) -> frozenset[str] | str:
    """``"messages,states"`` (a client's ``?topics=``) to a topic set, or an error message."""
    if value is None or not value.strip():
        return frozenset(default)
    topics = {t.strip() for t in value.split(",") if t.strip()}
    unknown = sorted(topics - set(TOPICS))
    if unknown:
        return f"unknown topic(s) {', '.join(unknown)}; choose from {', '.join(TOPICS)}"
    return frozenset(topics)
