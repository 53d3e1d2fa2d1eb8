"""The Firehose protocol without I/O: which client gets which frame, and what a client frame means.

The trio shell (:mod:`companion.bridge.server`) owns sockets and tasks; this part owns the
decisions, so they are tested with plain function calls. Every transport that carries the
Firehose frames (WebSocket, a WebRTC data channel) goes through the same core.

Clients see each other through the bridge's node: by the echo rule of :mod:`companion.ports`
the node receives what the bridge published, and :meth:`FirehoseCore.network_payload` hands it
to every subscribed client but the one that sent it (:meth:`FirehoseCore.sending` notes the
bytes it awaits back). What the bridge publishes for no client (the voice's speak results)
comes back to all of them the same way.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from companion.bridge.answers import AnswerLedger
from companion.bridge.clients import DEFAULT_TOPICS, ClientQueue, ClientRegistry, QueueLimits
from companion.bridge.frames import FrameError, PublishRequest, decode_frame, interpret_request
from companion.bridge.ratelimit import DEFAULT_CLIENT_RATE, DEFAULT_TOTAL_RATE, RateLimit, TokenBucket, admit
from companion.memory import Inbound, encode_for_topic
from companion.protocol import Envelope, Query, QueryResult, State

__all__ = ["MAX_AWAITED_ECHOES", "Fanout", "FirehoseCore"]

MAX_AWAITED_ECHOES: Final = 1024
"""Client frames published and not yet back from the node. An echo that never comes (the node
dropped the frame) is forgotten with the oldest: that frame, if it ever does come, then reaches
its sender too, which costs a duplicate on one client and nothing else."""


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
    client_rate: RateLimit = DEFAULT_CLIENT_RATE
    total_rate: RateLimit = DEFAULT_TOTAL_RATE
    answers: AnswerLedger = field(default_factory=AnswerLedger)
    _registry: ClientRegistry = field(init=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _total: TokenBucket = field(init=False)
    _sessions: dict[str, str] = field(default_factory=dict)
    """Client id -> the session it named (its answer identity, shared by its connections)."""
    _awaited: OrderedDict[int, tuple[bytes, str]] = field(default_factory=OrderedDict)
    """Echo token -> (digest of the topic and bytes, client that sent them), oldest first."""
    _by_digest: dict[bytes, deque[int]] = field(default_factory=dict)
    """Digest -> the tokens awaiting it, oldest first (the same frame may be sent twice)."""
    _tokens: Iterator[int] = field(default_factory=lambda: itertools.count(1))

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
        """A payload the node received: forward its raw JSON to every client subscribed to its
        topic, except the client whose frame this is the echo of (:meth:`sending`)."""
        data = inbound.raw or encode_for_topic(inbound.topic, inbound.payload)
        text = data.decode("utf-8", "surrogatepass")  # the edge already checked UTF-8
        sender = self._echo_of(_digest(inbound.topic, data))
        return self._track(inbound.payload, self._broadcast(inbound.topic, text, exclude=sender))

    def sending(self, client_id: str, topic: str, envelope: Envelope | list[State]) -> int:
        """``client_id``'s frame is about to be published: its echo will reach every client but
        this one. Returns the token to give :meth:`not_sent` if publishing fails."""
        token = next(self._tokens)
        digest = _digest(topic, encode_for_topic(topic, envelope))
        self._awaited[token] = (digest, client_id)
        self._by_digest.setdefault(digest, deque()).append(token)
        while len(self._awaited) > MAX_AWAITED_ECHOES:
            oldest, (old_digest, _) = self._awaited.popitem(last=False)
            self._drop_token(old_digest, oldest)
        return token

    def not_sent(self, token: int) -> None:
        """The frame of ``token`` was not published: no echo of it will come."""
        awaited = self._awaited.pop(token, None)
        if awaited is not None:
            self._drop_token(awaited[0], token)

    def _echo_of(self, digest: bytes) -> str | None:
        """The client whose published frame these bytes are (the oldest waiting), or ``None``."""
        tokens = self._by_digest.get(digest)
        if not tokens:
            return None
        token = tokens.popleft()
        if not tokens:
            del self._by_digest[digest]
        return self._awaited.pop(token)[1]

    def _drop_token(self, digest: bytes, token: int) -> None:
        tokens = self._by_digest.get(digest)
        if tokens is None:
            return
        tokens.remove(token)
        if not tokens:
            del self._by_digest[digest]

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


def _digest(topic: str, data: bytes) -> bytes:
    """The echo's key: bytes published on one topic are not the same payload on another."""
    digest = hashlib.blake2b(topic.encode(), digest_size=16)
    digest.update(b"\0")
    digest.update(data)
    return digest.digest()
