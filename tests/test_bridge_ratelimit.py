"""Token buckets: how fast clients may publish (pure, with a clock passed in)."""

from __future__ import annotations

import pytest

from companion.bridge.ratelimit import RateLimit, TokenBucket, admit


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(RateLimit(rate=10, burst=3))
    assert [admit([bucket], 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = admit([bucket], 0.0)
    assert wait == pytest.approx(0.1)
    assert admit([bucket], 0.05) == pytest.approx(0.05)  # half a token so far
    assert admit([bucket], 0.1) == 0.0
    assert admit([bucket], 0.1) > 0.0


def test_refill_stops_at_the_burst() -> None:
    bucket = TokenBucket(RateLimit(rate=100, burst=5))
    for _ in range(5):
        admit([bucket], 0.0)
    allowed = sum(1 for _ in range(20) if admit([bucket], 60.0) == 0.0)
    assert allowed == 5


def test_over_a_long_flood_the_rate_holds() -> None:
    bucket = TokenBucket(RateLimit(rate=10, burst=30))
    allowed = 0
    for i in range(10_000):  # 10,000 frames over 10 s
        if admit([bucket], i / 1000) == 0.0:
            allowed += 1
    assert 30 + 99 <= allowed <= 30 + 101


def test_a_frame_takes_from_every_bucket_or_from_none() -> None:
    client = TokenBucket(RateLimit(rate=1, burst=5))
    total = TokenBucket(RateLimit(rate=1, burst=2))
    assert admit([client, total], 0.0) == 0.0
    assert admit([client, total], 0.0) == 0.0
    assert admit([client, total], 0.0) == pytest.approx(1.0)  # the total is empty
    other = TokenBucket(RateLimit(rate=1, burst=5))
    assert admit([other, total], 0.5) == pytest.approx(0.5)
    assert other.wait_time(0.5) == 0.0  # it was not charged for the refused frame
    assert client.wait_time(0.5) == 0.0


def test_time_going_backwards_gives_nothing() -> None:
    bucket = TokenBucket(RateLimit(rate=10, burst=1))
    assert admit([bucket], 5.0) == 0.0
    assert admit([bucket], 4.0) > 0.0


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (float("nan"), 1), (1, 0)])
def test_bad_limits_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        RateLimit(rate, burst)
