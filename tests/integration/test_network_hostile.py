"""Hostile input at running node processes (``companion run`` with the scripted model), from a
raw py-libp2p peer that publishes any bytes and writes any bytes on any stream.

Every test ends the way a user would check it: each attacked node still answers a message
addressed to it (its scripted model replies), and its counters say what it refused.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from companion.node.announcements import DISCONNECT_GRACE
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    Action,
    encode,
)
from support.hostile_payloads import CORPUS, collect, message, payloads, rpcs
from support.network import (
    Event,
    Network,
    Proc,
    ask,
    b64,
    inbound,
    network,
    publish,
    publish_until_heard,
    warm_up,
)

pytestmark = pytest.mark.integration


# --- helpers ---------------------------------------------------------------------------------------


def joined(proc: Proc, *keys: str) -> None:
    for key in keys:
        proc.event("companion_joined", 30, companion_id=f"companion_{key}")


def attacker(net: Network, addr: str, **options: Any) -> Proc:
    raw, _ = net.raw("x", **options)
    raw.send({"op": "connect", "addr": addr})
    raw.event("connected", 15)
    return raw


@contextmanager
def starved(proc: Proc, stopped: float = 0.4, running: float = 0.2) -> Iterator[None]:
    """Starve ``proc`` of CPU: SIGSTOP for ``stopped`` s, SIGCONT for ``running`` s, over and over."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            proc.signal(signal.SIGSTOP)
            done.wait(stopped)
            proc.signal(signal.SIGCONT)
            done.wait(running)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        proc.signal(signal.SIGCONT)


# --- tests -----------------------------------------------------------------------------------------


def test_hostile_payloads_are_counted_dropped_and_not_forwarded(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        b, _ = net.companion("b", a_started["addrs"][0])
        raw = attacker(net, a_started["addrs"][0])
        joined(a, "b", "x")
        joined(b, "a")

        warm_up(raw, b, "companion_x", ["companion_a", "companion_b"], tries=30, wait=0.5)  # before the flood

        generated = collect(payloads(), 200)
        for topic, data, _ in CORPUS:
            publish(raw, topic, data)
        for topic, data in generated:
            publish(raw, topic, data)
        publish(raw, MESSAGES, message("companion_x", "after the flood", "after"), ack=True)
        raw.wait_for(
            lambda e: e.get("event") == "published" and e["count"] >= len(CORPUS) + len(generated), 60
        )
        b.event("inbound", 20, id="after")
        assert a.running and b.running

        a_stats = a.stats()
        b_stats = b.stats()
        expected: dict[str, int] = {}
        for _, _, reason in CORPUS:
            expected[reason] = expected.get(reason, 0) + 1
        for reason, count in expected.items():
            assert a_stats["drops"].get(reason, 0) >= count, (reason, a_stats["drops"])
        assert a_stats["dropped"] >= len(CORPUS) + len(generated) // 2
        # b heard nothing of it: a forwarded none of the refused payloads
        # (replays and stale presence announcements are gossip artifacts: copies, or an older
        # announcement overtaken on another path)
        assert {k: v for k, v in b_stats["drops"].items() if k not in ("replay", "stale")} == {}
        assert b.count("inbound", id="spoof-1") == b.count("inbound", id="spoof-2") == 0
        assert a.count("inbound", id="spoof-1") == 0
        # each (peer, reason) is logged once a minute, however many arrive
        assert a.count("payload_dropped", reason="spoofed_sender") == 1
        assert a.count("payload_dropped", reason="not_json") == 1
        ask(raw, "a", "after-payloads")
        ask(raw, "b", "after-payloads")


def test_undecodable_and_interleaved_rpcs_reset_one_stream_not_the_node(tmp_path: Path) -> None:
    """py-libp2p's RPC reader let ``DecodeError`` end the node (``run_failed``)."""
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        raw = attacker(net, a_started["addrs"][0])
        joined(a, "x")
        ask(raw, "a", "before")

        raw.send({"op": "interleave", "size": 20_000})  # two RPCs mixed as unserialized writers mix them
        raw.event("sent", 15, op="interleave")
        raw.send({"op": "rpc", "b64": b64(b"\xff\xff\xff\xff\x0f garbage"), "frame": True})
        raw.event("sent", 15, op="rpc")
        raw.send({"op": "rpc", "b64": b64(b"\xff" * 12), "frame": False})  # not even a length prefix
        assert raw.wait_for(lambda e: e.get("event") == "sent" and raw.count("sent", op="rpc") >= 2, 15)

        assert a.running
        assert a.stats()["drops"].get("malformed_rpc", 0) >= 3
        assert a.count("run_failed") == 0
        ask(raw, "a", "after")  # pubsub with the attacker itself came back after each reset


def test_fuzzed_rpcs_through_the_pubsub_stream(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        raw = attacker(net, a_started["addrs"][0])
        joined(a, "x")
        cases = collect(rpcs(), 60)
        for data in cases:
            raw.send({"op": "rpc", "b64": b64(data), "frame": True})
        raw.wait_for(lambda e: e.get("event") == "sent" and raw.count("sent", op="rpc") >= len(cases), 120)
        assert a.running and a.count("run_failed") == 0
        ask(raw, "a", "after-fuzz")


def test_garbage_on_metadata_identify_and_ping_streams(tmp_path: Path) -> None:
    garbage = b"\xff\xfe{{\x00\xc0" * 40
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        # a peer whose metadata and identify answers are garbage, and that writes garbage on every
        # protocol a node speaks
        raw = attacker(net, a_started["addrs"][0], metadata=garbage, identify=garbage)
        a.event("peer_metadata_unavailable", 20, status="invalid")
        for protocol in (
            "/aikyo/metadata/1.0.0",
            "/ipfs/id/1.0.0",
            "/ipfs/id/push/1.0.0",
            "/ipfs/ping/1.0.0",
            "/meshsub/1.1.0",
        ):
            raw.send({"op": "stream", "protocol": protocol, "b64": b64(garbage)})
        raw.wait_for(lambda e: e.get("event") == "sent" and raw.count("sent", op="stream") >= 5, 60)
        assert a.running and a.count("run_failed") == 0
        ask(raw, "a", "after-garbage")  # not a companion: it may still speak as an unbound id


def test_replay_after_restart_is_not_forwarded(tmp_path: Path) -> None:
    data = tmp_path / "a-data"
    with network(tmp_path) as net:
        a, first = net.companion("a", data_dir=data)
        a_addr = first["addrs"][0]
        b, _ = net.companion("b", a_addr)  # b redials a after the restart
        raw = attacker(net, a_addr)
        joined(a, "b", "x")
        joined(b, "a")
        warm_up(raw, b, "companion_x", ["companion_a", "companion_b"], tries=30, wait=0.5)
        recorded = message("companion_x", "remember me", "recorded", ("companion_b",))
        # gossip is best effort: published again (a new seqno, kept for the replay) only if b
        # did not hear it, so b holds exactly one copy

        def send(_: int) -> Callable[[Event], bool]:
            publish(raw, MESSAGES, recorded, keep="m")
            return inbound("recorded")

        publish_until_heard(send, b, tries=4, wait=5, what="the recorded message")
        assert a.stop() == 0

        port = a_addr.split("/")[4]
        a2, second = net.companion("a", data_dir=data, listen=f"/ip4/127.0.0.1/tcp/{port}")
        assert second["peer_id"] == first["peer_id"]
        joined(a2, "b")
        raw.send({"op": "connect", "addr": a_addr})
        raw.wait_for(lambda e: e.get("event") == "connected" and raw.count("connected") >= 2, 15)
        joined(a2, "x")
        replays_at_b = b.stats()["drops"].get("replay", 0)

        raw.send({"op": "resend", "name": "m"})  # the recorded message, signature and seqno intact
        raw.event("sent", 15, op="resend")
        deadline = time.monotonic() + 10
        while a2.stats()["drops"].get("replay", 0) < 1:
            assert time.monotonic() < deadline, "a did not refuse the replay"
            time.sleep(0.2)
        assert a2.count("inbound", id="recorded") == 0
        ask(raw, "a", "after-restart")  # a forwards to b again: anything new reaches b
        assert b.stats()["drops"].get("replay", 0) == replays_at_b  # a forwarded no copy of it
        assert b.count("inbound", id="recorded") == 1


@pytest.mark.solo
def test_flood_of_large_messages_at_150_per_second_with_a_starved_receiver(tmp_path: Path) -> None:
    """Well-formed 20 KB messages at 150/s; meanwhile c joins and gets the CPU a third of the
    time. a then writes to c from two tasks at once (its replay of the recent messages to a new
    subscriber, and its send queue), and c's Yamux window keeps running out: unserialized, the
    two writers' RPCs interleave and c cannot decode them."""
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        a_addr = a_started["addrs"][0]
        b, _ = net.companion("b", a_addr)
        raw = attacker(net, a_addr)
        joined(a, "b", "x")
        # 7 s of flood: c joins about 2 s in and is starved while the rest goes by (10 s, 1,500
        # messages, cost 25 CPU seconds of a suite that must fit in 6 minutes)
        raw.send({"op": "flood", "topic": MESSAGES, "rate": 150, "count": 1050, "size": 20_000, "to": []})
        b.wait_for(  # 2 s in: a's message cache is full of them
            lambda e: (
                e.get("event") == "inbound"
                and str(e.get("id")).startswith("flood-")
                and int(e["id"][6:]) >= 300
            ),
            30,
            "the flood, 300 messages in",
        )
        c, _ = net.companion("c", a_addr)
        with starved(c):
            raw.event("flooded", 60)
        joined(c, "a")
        assert a.running and b.running and c.running
        for proc in (a, b, c):
            assert proc.count("run_failed") == 0
            stats = proc.stats()
            assert stats["drops"].get("malformed_rpc", 0) == 0, (proc.name, stats["drops"])
        for key in "abc":
            ask(raw, key, "after-flood")


def driver_stats(proc: Proc) -> Event:
    mark = proc.count("stats")
    proc.send({"op": "stats"})
    return proc.after("stats", mark, 10)


def health_until(proc: Proc, predicate: Callable[[Event], bool], timeout: float, what: str) -> Event:
    """``proc``'s health counters, asked for every 0.2 s until ``predicate`` holds for them."""
    deadline = time.monotonic() + timeout
    while True:
        health: Event = driver_stats(proc)["health"]
        if predicate(health):
            return health
        assert time.monotonic() < deadline, f"{proc.name}: {what} not within {timeout} s: {health}"
        time.sleep(0.2)


@pytest.mark.early  # mostly waits on the health checks' clock: beside lint and types
def test_a_slow_answer_is_tolerated_and_a_frozen_peer_is_dropped(tmp_path: Path) -> None:
    """Health checks probe silent connections (Yamux ping, every 1 s here, 3 s to answer) and
    tolerate one unanswered probe: a peer frozen until one probe went unanswered, then running
    again, stays; one frozen for good is dropped.

    The freeze ends on the unanswered probe itself, not after a fixed 5 s: the probe that follows
    at once gets its whole 3 s to be answered on a busy machine too (it had 2 s before), and a
    starved ``a`` that probes late still sees one go unanswered first."""
    health = {"health_check_interval": 1, "health_timeout": 3, "health_failures_allowed": 1}
    with network(tmp_path) as net:
        a, a_started = net.driver("a", config=health)
        b, _ = net.driver("b", a_started["addrs"][0], config=health)
        a.event("joined", 20, companion_id="companion_b")
        # a probe answered: the next starts only once one was (after a second of silence)
        probed = health_until(a, lambda h: h["probes"] >= 2, 20, "a probe answered")
        assert probed["probe_failures"] == 0, probed

        b.signal(signal.SIGSTOP)
        failed = health_until(a, lambda h: h["probe_failures"] >= 1, 20, "an unanswered probe")
        b.signal(signal.SIGCONT)
        # the probe after the unanswered one is answered (a second failure would close the
        # connection): a later probe starts only once it was, after a second of silence
        health_until(a, lambda h: h["probes"] >= failed["probes"] + 2, 20, "the probes going on")
        stats = driver_stats(a)
        assert stats["health"]["probe_failures"] == 1, stats["health"]
        assert stats["disconnects"] == {} and a.count("left") == 0
        assert stats["connected_peers"] == 1

        b.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        bound = 1 + 2 * 3 + 2
        while driver_stats(a)["disconnects"] != {"unresponsive": 1}:
            assert time.monotonic() - frozen_at < bound, f"a frozen peer not noticed within {bound} s"
            time.sleep(0.2)
        # then its presence announcement is suspected: it leaves unless heard within the grace
        a.event("left", DISCONNECT_GRACE + 2, companion_id="companion_b")
        b.signal(signal.SIGCONT)
        assert driver_stats(a)["disconnects"] == {"unresponsive": 1}


def _carries(sender: Proc, receiver: Proc, origin: str, tag: str, timeout: float) -> None:
    """Actions from ``sender`` (as ``origin``) reach ``receiver`` within ``timeout`` (published
    again every half second: the mesh may still be forming)."""

    def send(attempt: int) -> Callable[[Event], bool]:
        text = encode(Action.create(origin, "ping", {"tag": tag, "n": attempt})).decode()
        sender.send({"op": "publish", "topic": ACTIONS, "text": text})
        return lambda e: e.get("event") == "inbound" and e.get("text") == text

    publish_until_heard(send, receiver, tries=int(timeout / 0.5) + 1, wait=0.5, what=f"actions from {origin}")


@pytest.mark.early  # mostly waits on the health checks' clock: beside lint and types
def test_a_peer_that_wakes_after_being_dropped_joins_again(tmp_path: Path) -> None:
    """A laptop that slept past the health checks: its peer dropped it and its companion left
    the directory. Once it runs again (every deadline of its own passed at once) it notices the
    closed connection, dials its bootstrap peer again and is present on both sides, and
    messages flow both ways."""
    health = {"health_check_interval": 1, "health_timeout": 2, "health_failures_allowed": 1}
    with network(tmp_path) as net:
        a, a_started = net.driver("a", config=health)
        b, _ = net.driver("b", a_started["addrs"][0], config=health)
        a.event("joined", 20, companion_id="companion_b")
        b.event("joined", 20, companion_id="companion_a")

        b.signal(signal.SIGSTOP)
        a.event("left", 1 + 2 * 2 + DISCONNECT_GRACE + 5, companion_id="companion_b")
        time.sleep(2)  # asleep a while longer than it takes to be dropped
        b.signal(signal.SIGCONT)

        a.after("joined", 1, 30, companion_id="companion_b")
        _carries(b, a, "companion_b", "awake", 20)
        _carries(a, b, "companion_a", "welcome back", 20)
        assert driver_stats(a)["connected_peers"] == 1
        assert driver_stats(b)["connected_peers"] == 1


def test_a_burst_of_actions_arrives_whole(tmp_path: Path) -> None:
    """200 actions published back to back (a tool reporting progress): py-libp2p's 32-slot send
    queue kept 32 and dropped the rest without a trace; the node now waits for room."""
    with network(tmp_path) as net:
        a, a_started = net.driver("a")
        b, _ = net.driver("b", a_started["addrs"][0])
        a.event("joined", 20, companion_id="companion_b")

        def action(n: int) -> str:
            return encode(Action.create("companion_a", "progress", {"n": n})).decode()

        _carries(a, b, "companion_a", "mesh", 15)  # the mesh carries actions
        burst = {action(n) for n in range(200)}
        for text in burst:
            a.send({"op": "publish", "topic": ACTIONS, "text": text})
        b.wait_for(
            lambda e: (
                sum(1 for x in b.events if x.get("event") == "inbound" and x.get("text") in burst) >= 200
            ),
            30,
            "all 200 actions",
        )
        assert driver_stats(a)["drops"] == {}
