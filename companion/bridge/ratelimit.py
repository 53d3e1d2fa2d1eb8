"""How fast clients may publish: token buckets, pure (the caller passes the clock).

py-libp2p's ``publish()`` never waits, and its per-peer queues (32 RPCs) drop silently when
they overflow: a client that publishes as fast as its socket allows loses most of its frames
somewhere in the network, and nobody is told. So the bridge decides which frames go out:
each client has a bucket, the bridge as a whole has one, and a frame either takes a token
from both and is published, or is answered with a ``rate_limited`` error frame saying when to
try again. Nothing is lost without a word.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["DEFAULT_CLIENT_RATE", "DEFAULT_TOTAL_RATE", "RateLimit", "TokenBucket", "admit"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``rate`` frames per second on average, ``burst`` at once after a quiet spell."""

    rate: float
    burst: int

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)) or self.burst < 1:
            raise ValueError(
                f"a rate limit needs a positive rate and burst (got {self.rate}/s, {self.burst})"
            )

    def describe(self) -> str:
        return f"{self.rate:g} frames/s (bursts of {self.burst})"


DEFAULT_CLIENT_RATE = RateLimit(rate=10.0, burst=30)
"""Per client. A person types a line every few seconds; a client answering speak and approval
queries sends one frame per query; a device publishing sensor actions a few a second. Ten a
second with bursts of thirty is well above any of them and well below what one py-libp2p
publisher delivers without loss (measured: 100/s lossless between two processes, unpaced
~1,900/s lost 98 %)."""

DEFAULT_TOTAL_RATE = RateLimit(rate=50.0, burst=100)
"""For the whole bridge, whatever the number of clients (64 at most, each with its own
bucket): what a 10-node mesh carried without loss on a 2-core machine was 10-20 msg/s per
publisher, and the bridge is one publisher; 50/s is a ceiling for floods, not a budget."""


@dataclass
class TokenBucket:
    """A token bucket refilled at ``limit.rate`` up to ``limit.burst`` tokens (starts full)."""

    limit: RateLimit
    _tokens: float = field(init=False)
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._tokens = float(self.limit.burst)

    def _refill(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._tokens = min(float(self.limit.burst), self._tokens + (now - self._at) * self.limit.rate)
        if self._at is None or now > self._at:
            self._at = now

    def wait_time(self, now: float) -> float:
        """Seconds until a token is there (``0.0``: one is there now)."""
        self._refill(now)
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.limit.rate

    def consume(self, now: float) -> None:
        """Take one token (call only when :meth:`wait_time` is ``0.0``)."""
        self._refill(now)
        self._tokens = max(0.0, self._tokens - 1.0)


def admit(buckets: Sequence[TokenBucket], now: float) -> float:
    """One frame through every bucket: ``0.0`` if each had a token (one is taken from each),
    else the seconds until all will have one (nothing is taken)."""
    wait = max((bucket.wait_time(now) for bucket in buckets), default=0.0)
    if wait > 0.0:
        return wait
    for bucket in buckets:
        bucket.consume(now)
    return 0.0
