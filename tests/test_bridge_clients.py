"""Per-client queues: bounded, never blocking, and the slow-client rule."""

from __future__ import annotations

import pytest

from companion.bridge.clients import DEFAULT_TOPICS, ClientQueue, ClientRegistry, QueueLimits, parse_topics


def test_queue_keeps_order_and_counts_bytes() -> None:
    queue = ClientQueue(QueueLimits(max_frames=3, max_bytes=100))
    assert queue.push("a") and queue.push("bé")
    assert len(queue) == 2 and queue.pending_bytes == 1 + 3
    assert queue.pop() == "a"
    assert queue.pop() == "bé"
    assert queue.pop() is None
    assert queue.pending_bytes == 0


def test_queue_overflows_on_frame_count_and_stays_overflowed() -> None:
    queue = ClientQueue(QueueLimits(max_frames=2, max_bytes=10_000))
    assert queue.push("1") and queue.push("2")
    assert not queue.push("3")
    assert queue.overflowed is not None and "2 frames waiting" in queue.overflowed
    assert len(queue) == 0  # nothing more goes to a client that is being dropped
    assert not queue.push("4")


def test_queue_overflows_on_bytes() -> None:
    queue = ClientQueue(QueueLimits(max_frames=100, max_bytes=10))
    assert queue.push("x" * 6)
    assert not queue.push("y" * 6)
    assert queue.overflowed is not None and "12 bytes waiting (limit 10)" in queue.overflowed


def test_draining_in_time_never_overflows() -> None:
    queue = ClientQueue(QueueLimits(max_frames=2, max_bytes=100))
    for i in range(1000):
        assert queue.push(str(i))
        assert queue.pop() == str(i)
    assert queue.overflowed is None


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        QueueLimits(max_frames=0)


def test_registry_routes_by_topic_and_reports_slow_clients() -> None:
    registry = ClientRegistry(QueueLimits(max_frames=1, max_bytes=1000))
    registry.add("a")
    registry.add("b", {"messages", "states"})
    assert registry.broadcast("states", "[]") == (["b"], [])
    assert registry.broadcast("queries", "{}") == (["a"], [])
    # a has 1 queued (the query), b has 1 (the states): both are full now
    queued, slow = registry.broadcast("messages", "{}")
    assert queued == [] and sorted(slow) == ["a", "b"]
    registry.queue("a").pop()
    # once overflowed, a client is not offered anything again
    assert registry.broadcast("messages", "{}") == ([], [])


def test_registry_excludes_the_origin_and_rejects_duplicates() -> None:
    registry = ClientRegistry()
    registry.add("a")
    registry.add("b")
    assert registry.broadcast("messages", "{}", exclude="a") == (["b"], [])
    with pytest.raises(ValueError):
        registry.add("a")
    registry.remove("a")
    assert "a" not in registry and len(registry) == 1


def test_parse_topics() -> None:
    assert parse_topics(None) == DEFAULT_TOPICS
    assert parse_topics("") == DEFAULT_TOPICS
    assert parse_topics("messages, states") == frozenset({"messages", "states"})
    error = parse_topics("messages,gossip")
    assert isinstance(error, str) and "gossip" in error
