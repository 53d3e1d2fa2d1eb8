"""The Firehose protocol without I/O: which client gets which frame, and what a client frame means.

The trio shell (:mod:`companion.bridge.server`) owns sockets and tasks; this part owns the
decisions, so they are tested with plain function calls. Every transport that carries the
Firehose frames (WebSocket today, a WebRTC data channel later) goes through the same core.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..protocol import Envelope, Query, QueryResult, State, encode
from ..transport import Inbound, encode_for_topic
from .answers import AnswerLedger
from .clients import DEFAULT_TOPICS, ClientQueue, ClientRegistry, QueueLimits
from .frames import FrameError, PublishRequest, decode_frame, interpret_request
from .ratelimit import DEFAULT_CLIENT_RATE, DEFAULT_TOTAL_RATE, RateLimit, TokenBucket, admit

__all__ = ["Fanout", "FirehoseCore"]


@dataclass(frozen=True, slots=True)
class Fanout:
    """What one payload did: the clients that got it queued, and those now too slow (with why)."""

    queued: tuple[str, ...] = ()
    too_slow: tuple[tuple[str, str], ...] = ()


@dataclass
class FirehoseCore:
    """Client bookkeeping and frame handling for one bridge."""

    limits: QueueLimits = field(default_factory=QueueLimits)
    default_topics: frozenset[str] = DEFAULT_TOPICS
    self_peer: str | None = None
    """The bridge's own network identity: the network's echo of what we published is ignored
    (local clients already got it from :meth:`local_publish`)."""
    client_rate: RateLimit = DEFAULT_CLIENT_RATE
    total_rate: RateLimit = DEFAULT_TOTAL_RATE
    answers: AnswerLedger = field(default_factory=AnswerLedger)
    _registry: ClientRegistry = field(init=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _total: TokenBucket = field(init=False)
    _sessions: dict[str, str] = field(default_factory=dict)
    """Client id -> the session it named (its answer identity, shared by its connections)."""

    def __post_init__(self) -> None:
        self._registry = ClientRegistry(self.limits)
        self._total = TokenBucket(self.total_rate)

    # --- clients -------------------------------------------------------------------------

    def connect(self, topics: Iterable[str] | None = None) -> tuple[str, ClientQueue]:
        """Register a new client; returns its id and its outbound queue."""
        client_id = f"client-{next(self._ids)}"
        queue = self._registry.add(client_id, self.default_topics if topics is None else topics)
        self._buckets[client_id] = TokenBucket(self.client_rate)
        return client_id, queue

    def disconnect(self, client_id: str) -> None:
        self._registry.remove(client_id)
        self._buckets.pop(client_id, None)
        self._sessions.pop(client_id, None)

    def name_session(self, client_id: str, key: str) -> None:
        """The client sent ``{"session": key}``: queries delivered to any connection naming the
        same key may be answered from this one, and the other way round."""
        identity = f"session:{key}"
        self._sessions[client_id] = identity
        self.answers.alias(client_id, identity)

    def _identity(self, client_id: str) -> str:
        return self._sessions.get(client_id, client_id)

    @property
    def clients(self) -> list[str]:
        return list(self._registry)

    # --- outbound ------------------------------------------------------------------------

    def network_payload(self, inbound: Inbound) -> Fanout:
        """A payload from the network: forward its raw JSON to every client subscribed to its topic."""
        if self.self_peer is not None and inbound.sender_peer == self.self_peer:
            return Fanout()
        if inbound.raw:
            text = inbound.raw.decode("utf-8", "surrogatepass")  # the edge already checked UTF-8
        else:
            text = _encode_payload(inbound.topic, inbound.payload).decode("utf-8", "surrogatepass")
        return self._track(inbound.payload, self._broadcast(inbound.topic, text, exclude=None))

    def local_publish(self, topic: str, envelope: Envelope | list[State], *, origin: str | None) -> Fanout:
        """Something this process published (for a client, or a companion running here): the
        network does not echo it back to us, so local clients other than ``origin`` get it here."""
        text = encode_for_topic(topic, envelope).decode("utf-8", "surrogatepass")
        return self._track(envelope, self._broadcast(topic, text, exclude=origin))

    def _track(self, payload: object, fanout: Fanout) -> Fanout:
        """Queries handed to clients may be answered by them; a result seen settles its query."""
        if isinstance(payload, Query):
            self.answers.delivered(payload.id, (self._identity(c) for c in fanout.queued))
        elif isinstance(payload, QueryResult):
            self.answers.settled(payload.id)
        return fanout

    # --- client frames: rate and answers ------------------------------------------------

    def admit(self, client_id: str, now: float) -> float:
        """May ``client_id`` publish a frame at ``now``? ``0.0``: yes (a token is taken from its
        bucket and the bridge's); else the seconds until it may."""
        bucket = self._buckets.get(client_id)
        if bucket is None:
            return 0.0
        return admit((bucket, self._total), now)

    def claim_answer(self, client_id: str, result: QueryResult) -> FrameError | None:
        """A client's query result: ``None`` if it may be published (then call
        :meth:`answer_done`), else the error frame that refuses it."""
        claim = self.answers.claim(result.id, self._identity(client_id))
        if claim == "ok":
            return None
        if claim == "already_answered":
            message = f"query {result.id[:100]!r} was already answered"
            return FrameError("already_answered", message, ref=result.id)
        return FrameError(
            "unknown_query",
            f"no query with id {result.id[:100]!r} was delivered to this client; "
            "answer only queries you received",
            ref=result.id,
        )

    def answer_done(self, query_id: str, *, published: bool) -> None:
        """The claimed result was published (or could not be: the query is open again)."""
        if published:
            self.answers.confirm(query_id)
        else:
            self.answers.release(query_id)

    def error_to(self, client_id: str, error: FrameError) -> Fanout:
        """Queue an error frame for one client (in order with its other frames)."""
        if client_id not in self._registry:
            return Fanout()
        queue = self._registry.queue(client_id)
        if queue.push(error.to_json()):
            return Fanout(queued=(client_id,))
        return Fanout(too_slow=((client_id, queue.overflowed or "client too slow"),))

    def _broadcast(self, topic: str, text: str, *, exclude: str | None) -> Fanout:
        queued, slow = self._registry.broadcast(topic, text, exclude=exclude)
        return Fanout(
            tuple(queued),
            tuple((c, self._registry.queue(c).overflowed or "client too slow") for c in slow),
        )

    # --- inbound -------------------------------------------------------------------------

    @staticmethod
    def decode(data: str | bytes) -> Any | FrameError:
        """Step 1 for a client frame: bytes or text to a JSON value (a receive hook sees this)."""
        return decode_frame(data)

    @staticmethod
    def interpret(obj: Any) -> PublishRequest | FrameError:
        """Step 2: a ``{"topic", "body"}`` value to a typed envelope to publish, or an error."""
        return interpret_request(obj)


def _encode_payload(topic: str, payload: Envelope | list[State]) -> bytes:
    if isinstance(payload, list):
        return encode_for_topic(topic, payload)
    return encode(payload)
