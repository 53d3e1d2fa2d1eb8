"""Presence without a full mesh, on real ``companion run`` processes on 127.0.0.1 (no mDNS), each
given only a hub's address: directories full though each node holds a few connections, a killed
companion gone from every directory within seconds (its neighbours report it lost; nobody waits
for its announcements' time to live), a stopped one at once, a conversation of twelve with one
reply per message, and a forged announcement refused and counted while the real companion goes
on."""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX

from companion.app.lines import parse_sees
from companion.node import CompanionNode, NodeConfig
from companion.node.announcements import DISCONNECT_GRACE, PRESENCE_TOPIC
from companion.protocol import MESSAGES, Message, Metadata, Presence, PresenceParams, encode_presence
from support.cards import speaking_card, write_card
from support.live import Bystander, spawn_run, stdout_line
from support.network import Event, Network, Proc, ask, network

pytestmark = pytest.mark.integration

START_TIMEOUT = 90.0
"""Seconds for a dozen processes started at once on a shared 2-core machine to listen."""
SPREAD_DEADLINE = 15.0
"""Seconds from the last start until every directory is full: each node announces itself when
a peer connects and when a companion new to it appears, at most once a second; the rest is
delivery on a loaded machine."""
SETTLE_DEADLINE = 45.0
"""Seconds for the trimming to bring every node within its bound: the 10 s grace of the excess
connections, then passes a second apart, under load."""
PIPE_LAG = 5.0
"""Seconds a JSON event on stderr may arrive after the stdout line it goes with (two pipes, two
reader threads, a loaded machine)."""
LEAVE_BOUND = 5.0
"""Seconds a departure may take beyond its rule (the expiry task, delivery, a loaded machine)."""


def spawn(net: Network, key: str, *peers: str, seed: int, extra: tuple[str, ...] = ()) -> Proc:
    """``companion run`` for one card (scripted model), not waiting for it to start."""
    card = write_card(net.tmp, key, speaking_card(key, key.capitalize(), "speak"))
    return spawn_run(net, key, [card], *peers, seed=seed, extra=extra)


def start_network(net: Network, size: int, bound: int) -> tuple[dict[str, Proc], dict[str, str], str]:
    """A hub and ``size - 1`` companions given its address, all started at once; returns the
    processes, their peer ids, and the hub's address."""
    extra = ("--max-connections", str(bound))
    hub = spawn(net, "hub", seed=0, extra=extra)
    hub_addr = hub.event("started", START_TIMEOUT)["addrs"][0]
    procs = {"hub": hub}
    for i in range(1, size):
        procs[f"n{i:02d}"] = spawn(net, f"n{i:02d}", hub_addr, seed=i, extra=extra)
    ids = {key: proc.event("started", START_TIMEOUT)["peer_id"] for key, proc in procs.items()}
    return procs, ids, hub_addr


def cid(key: str) -> str:
    return f"companion_{key}"


def listing(key: str, companions: frozenset[str]) -> Callable[[str], bool]:
    """Whether a line is ``key``'s ``sees`` line listing exactly ``companions``."""
    return lambda line: parse_sees(line) == (cid(key), companions)


def wait_for_directory(procs: dict[str, Proc], expected: Iterable[str], deadline: float) -> None:
    """Every process prints a ``sees`` line listing exactly ``expected`` before ``deadline``."""
    want = frozenset(expected)
    for key, proc in procs.items():
        left = deadline - time.monotonic()
        try:
            stdout_line(proc, listing(key, want), max(left, 0.01))
        except AssertionError:
            stats = proc.stats()
            missing = sorted(want - set(stats["companions"]))
            raise AssertionError(f"{key} misses {missing}: {departures(proc)} {stats}") from None


def departures(proc: Proc) -> list[tuple[float, str, str]]:
    """Every ``companion_left`` so far: (time, companion id, reason), for failure messages."""
    with proc._cond:
        return [
            (e["ts"], e["companion_id"], e["reason"])
            for e in proc.events
            if e.get("event") == "companion_left"
        ]


TRIM_SLACK = 3.0
"""Seconds a connection may outlive its grace period before it is trimmed: passes a second
apart, then the announcement and the notice (milliseconds on a quiet machine, at most
topology.NOTICE_TIMEOUT) before the close."""


def excess(proc: Proc, peers: set[str], bound: int) -> list[str]:
    """Of ``peers`` (connected, unprotected), those beyond ``bound`` once the ones still in
    their grace period (by the node's own ``peer_connected`` times) are set aside."""
    grace = NodeConfig().trim_grace
    now = time.time()
    with proc._cond:
        since = {e["peer"]: e["ts"] for e in proc.events if e.get("event") == "peer_connected"}
    settled = [p for p in peers if now - since.get(p, 0.0) > grace + TRIM_SLACK]
    return settled[bound:] if len(settled) > bound else []


def churn(procs: dict[str, Proc], links: dict[str, set[str]]) -> dict[str, object]:
    """Per node, for failure messages: connections, those still in their grace period, and the
    trims and ring dials so far."""
    out: dict[str, object] = {}
    for key, proc in procs.items():
        stats = proc.stats()
        young = len(links[key]) - len(excess(proc, links[key], 0))
        out[key] = (len(links[key]), young, stats.get("trimmed"), stats.get("ring_dials"))
    return out


def last_connected(proc: Proc) -> float:
    """When (wall clock) the node's latest ``peer_connected`` so far happened."""
    with proc._cond:
        return max((e["ts"] for e in proc.events if e.get("event") == "peer_connected"), default=0.0)


def connections(proc: Proc) -> set[str]:
    return set(proc.stats()["connections"])


@pytest.mark.solo
def test_twelve_companions_with_four_connections_each_see_everyone_and_talk(tmp_path: Path) -> None:
    """12 companions, ``--max-connections 4``: a sparse network (not the 66 connections of a full
    mesh), every directory full, every node within its bound (plus the hub it was given), and a
    message addressed to all twelve answered by exactly one of them, as is every reply after."""
    bound = 4
    with network(tmp_path) as net:
        procs, ids, hub_addr = start_network(net, 12, bound)
        everyone = [cid(k) for k in procs]
        wait_for_directory(procs, everyone, time.monotonic() + SPREAD_DEADLINE)

        settle_by = time.monotonic() + SETTLE_DEADLINE
        # the bound is for connections past their grace: first let the ones opened while the
        # directories filled reach it (otherwise every connection is young and nothing is judged)
        opened = max(last_connected(proc) for proc in procs.values())
        time.sleep(max(0.0, opened + NodeConfig().trim_grace + TRIM_SLACK - time.time()))
        while True:  # connections past their grace period, beyond the bound: none for long
            links = {key: connections(proc) for key, proc in procs.items()}
            protected = {key: {ids["hub"]} & links[key] for key in procs}  # a bootstrap peer
            over = {k: excess(procs[k], links[k] - protected[k], bound) for k in procs}
            over = {k: peers for k, peers in over.items() if peers}
            if not over or time.monotonic() > settle_by:
                break
            time.sleep(1.0)
        assert not over, f"connections beyond {bound} (+ the hub) past the trim grace: {over}"
        pairs = {frozenset({ids[a], peer}) for a in procs for peer in links[a]}
        assert len(pairs) <= 12 * (bound + 1) // 2, (
            f"{len(pairs)} connections (a full mesh has 66): {churn(procs, links)}"
        )
        apart = [(a, b) for a in procs for b in procs if a < b and ids[b] not in links[a]]
        assert apart, "every pair directly connected"
        # ... and yet every directory still lists everyone (presence through others)
        for key, proc in procs.items():
            assert sorted(proc.stats()["companions"]) == sorted(everyone), (key, departures(proc))
        # every trim is counted as a trim where it happened, not as a connection lost
        stats = {key: proc.stats() for key, proc in procs.items()}
        assert any(s["trimmed"] for s in stats.values()), "nothing trimmed: the bound never acted"
        for key, s in stats.items():
            assert s["disconnects"].get("trimmed", 0) >= s["trimmed"], (key, s["disconnects"], s["trimmed"])

        trio.run(_one_reply_per_message, hub_addr, everyone)


async def _one_reply_per_message(hub_addr: str, everyone: list[str]) -> None:
    node = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), peers=(hub_addr,), name="test"))
    watcher = Bystander(lambda: list(node.directory))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, watcher)
        assert await node.wait_for(lambda: set(everyone) <= set(node.directory), SPREAD_DEADLINE)
        opening = Message.create("user_test", everyone, "Hello, all twelve of you! Who has news?")
        reacted = False
        for _attempt in range(10):  # the same id again until the mesh carried it somewhere
            await node.publish(MESSAGES, opening)
            if await watcher.wait_until(lambda t: any(e.kind != "message" for e in t.events), 3):
                reacted = True
                break
        assert reacted, "no companion reacted to the opening line"
        enough = await watcher.wait_until(lambda t: t.over or t.reply_count >= 3, 120)
        transcript = watcher.transcript
        lines = [(e.kind, e.speaker, e.in_reply_to) for e in transcript.events]
        assert enough, lines
        assert transcript.double_speech == {}, lines
        assert len(transcript.replies[opening.params.id]) == 1, lines
        nursery.cancel_scope.cancel()


def test_a_killed_companion_leaves_every_directory_within_the_ttl_a_stopped_one_at_once(
    tmp_path: Path,
) -> None:
    """Six companions with ``--max-connections 2`` (each keeps its two ring neighbours and the
    hub): a SIGKILLed one leaves its neighbours' directories within the disconnect grace, and
    everyone else's a report later (the neighbours announce it ``lost``; it cannot refute); a
    SIGTERMed one everyone's at once."""
    with network(tmp_path) as net:
        procs, ids, _hub_addr = start_network(net, 6, 2)
        everyone = [cid(k) for k in procs]
        wait_for_directory(procs, everyone, time.monotonic() + SPREAD_DEADLINE)

        # a victim and an observer that are not connected to each other
        settle_by = time.monotonic() + SETTLE_DEADLINE
        choice = None
        while choice is None:
            links = {key: connections(proc) for key, proc in procs.items() if key != "hub"}
            choice = next(
                (
                    (v, o)
                    for v in links
                    for o in links
                    if v != o and ids[o] not in links[v] and ids[v] not in links[o]
                ),
                None,
            )
            if choice is None:
                assert time.monotonic() < settle_by, f"no two companions apart: {links}"
                time.sleep(1.0)
        victim, observer = choice
        neighbours = {k for k in procs if ids[k] in links[victim]}
        before = {k: p.count("companion_left") for k, p in procs.items()}  # nobody left yet
        marks = {k: len(p.lines) for k, p in procs.items()}  # a start-up line may list fewer

        procs[victim].signal(signal.SIGKILL)
        killed_at = time.monotonic()
        gone = frozenset(everyone) - {cid(victim)}
        for key in neighbours:  # they lost a connection without notice
            left = DISCONNECT_GRACE + LEAVE_BOUND - (time.monotonic() - killed_at)
            stdout_line(procs[key], listing(key, gone), max(left, 0.01), since=marks[key])
        reported = DISCONNECT_GRACE + NodeConfig().presence_min_gap + LEAVE_BOUND
        for key, proc in procs.items():  # the observer too, which had no connection to lose
            if key != victim:
                left = reported - (time.monotonic() - killed_at)
                stdout_line(proc, listing(key, gone), max(left, 0.01), since=marks[key])
        seen = procs[observer].event("companion_left", PIPE_LAG, companion_id=cid(victim))
        assert seen["reason"] == "expired"  # its announcement, suspected on the report, ran out
        for key, proc in procs.items():  # nobody else flickered out meanwhile
            if key != victim:
                proc.event("companion_left", PIPE_LAG, companion_id=cid(victim))
                assert proc.count("companion_left") == before[key] + 1, key

        near = connections(procs[observer])
        candidates = [k for k in procs if k not in (victim, observer, "hub")]
        stopping = next((k for k in candidates if ids[k] not in near), candidates[0])
        marks = {k: len(p.lines) for k, p in procs.items()}
        stopped_at = time.monotonic()
        assert procs[stopping].stop() == 0
        rest = gone - {cid(stopping)}
        for key, proc in procs.items():
            if key not in (victim, stopping):
                left = LEAVE_BOUND - (time.monotonic() - stopped_at)
                stdout_line(proc, listing(key, rest), max(left, 0.01), since=marks[key])
        why = procs[observer].event("companion_left", PIPE_LAG, companion_id=cid(stopping))["reason"]
        assert why == ("leaving" if ids[stopping] not in near else "disconnected")


def test_a_forged_announcement_for_a_pinned_id_is_refused_counted_and_not_relayed(tmp_path: Path) -> None:
    """A bare libp2p peer signs announcements claiming ``companion_a`` (another name, then
    ``leaving``) and sends them to b; b pinned the id to a's key: refused ``id_pinned``,
    counted, not relayed to c (which has by then the announcement of a new companion the peer
    sent after them), and a stays in every directory as itself."""
    with network(tmp_path) as net:
        a = spawn(net, "a", seed=1)
        a_addr = a.event("started", START_TIMEOUT)["addrs"][0]
        b = spawn(net, "b", a_addr, seed=2)
        b_addr = b.event("started", START_TIMEOUT)["addrs"][0]
        c = spawn(net, "c", b_addr, seed=3)
        c.event("started", START_TIMEOUT)
        procs = {"a": a, "b": b, "c": c}
        wait_for_directory(procs, [cid(k) for k in procs], time.monotonic() + SPREAD_DEADLINE)
        raw, _ = net.raw(None)
        raw.send({"op": "connect", "addr": b_addr})
        raw.event("connected", 10)
        for attempt in range(10):  # until the raw peer knows b subscribes to the topic
            seq = int(time.time() * 1000)
            for leaving in (False, True):
                forged = Presence(
                    params=PresenceParams(
                        metadata=Metadata(id=cid("a"), name="Evil", personality="p", story="s", sample="x"),
                        seq=seq + leaving,
                        ttl=300,
                        leaving=leaving,
                        addrs=[],
                        lost={},
                    )
                )
                data = base64.b64encode(encode_presence(forged)).decode()
                raw.send({"op": "publish", "topic": PRESENCE_TOPIC, "b64": data, "ack": True})

            def both_published(e: Event, n: int = attempt) -> bool:
                return bool(e.get("event") == "published" and e["count"] >= 2 * (n + 1))

            raw.wait_for(both_published, 10)
            if b.stats()["drops"].get("id_pinned", 0) >= 2:
                break
            time.sleep(1.0)
        assert b.stats()["drops"].get("id_pinned", 0) >= 2, b.stats()["drops"]
        # an announcement b takes, sent after the forged ones on the same stream: once c has
        # it, whatever b relayed of the forged ones before it has reached c too
        marker = _announcement("m", int(time.time() * 1000))
        raw.send({"op": "publish", "topic": PRESENCE_TOPIC, "b64": base64.b64encode(marker).decode()})
        c.event("companion_joined", SPREAD_DEADLINE, companion_id=cid("m"))
        assert "id_pinned" not in c.stats()["drops"], c.stats()["drops"]
        for proc in procs.values():
            assert cid("a") in proc.stats()["companions"]
            assert proc.count("companion_updated", companion_id=cid("a")) == 0
            assert proc.count("companion_left", companion_id=cid("a")) == 0
        detail = json.dumps(b.wait_for(lambda e: e.get("reason") == "id_pinned", 1))
        assert PRESENCE_TOPIC in detail and "pinned to peer" in detail


def _announcement(key: str, seq: int, *, leaving: bool = False) -> bytes:
    metadata = Metadata(id=cid(key), name=key, personality="p", story="s", sample="x")
    params = PresenceParams(metadata=metadata, seq=seq, ttl=300, leaving=leaving, addrs=[], lost={})
    return encode_presence(Presence(params=params))


def _badly_signed(data: bytes, *, borrowed: bool) -> str:
    """A pubsub RPC (base64) carrying ``data`` on the presence topic whose signature does not
    verify: garbage, or (``borrowed``) a genuine signature by another key than ``from``'s."""
    signer, claimed = create_new_key_pair(), create_new_key_pair()
    author = claimed if borrowed else signer
    msg = rpc_pb2.Message(
        from_id=ID.from_pubkey(author.public_key).to_bytes(),
        data=data,
        seqno=time.time_ns().to_bytes(8, "big"),
        topicIDs=[PRESENCE_TOPIC],
        key=author.public_key.serialize(),
    )
    unsigned = PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
    msg.signature = signer.private_key.sign(unsigned) if borrowed else bytes(64)
    return base64.b64encode(rpc_pb2.RPC(publish=[msg]).SerializeToString()).decode()


def test_hostile_announcements_are_dropped_counted_and_the_node_goes_on(tmp_path: Path) -> None:
    """A raw peer proving ``companion_x`` sends a (a real ``companion run``) announcements that
    replay or go back in sequence, claim another id than its own (a's among them), carry a signature that
    does not verify (garbage, or another key's), and a flood of 300 malformed ones at 150/s.
    Each is dropped and counted by reason; a stays up, answers x, keeps b as itself, and b's
    directory never holds what a refused."""
    with network(tmp_path) as net:
        a = spawn(net, "a", seed=1)
        a_addr = a.event("started", START_TIMEOUT)["addrs"][0]
        b = spawn(net, "b", a_addr, seed=2)
        b.event("started", START_TIMEOUT)
        wait_for_directory({"a": a, "b": b}, [cid("a"), cid("b")], time.monotonic() + SPREAD_DEADLINE)
        raw, _ = net.raw("x")
        raw.send({"op": "connect", "addr": a_addr})
        raw.event("connected", 10)

        def send(data: bytes) -> None:
            raw.send({"op": "publish", "topic": PRESENCE_TOPIC, "b64": base64.b64encode(data).decode()})

        seq = int(time.time() * 1000)
        for _attempt in range(20):  # until a took x's (the first may precede a's subscription)
            seq += 1
            send(_announcement("x", seq))
            time.sleep(0.5)
            if a.stats()["presence_entries"] >= 2:  # b's and x's
                break
        assert a.stats()["presence_entries"] >= 2, a.stats()

        send(_announcement("x", seq))  # the same sequence number in a new gossip message
        send(_announcement("x", seq - 1))
        # x proved companion_x on its connection: another id is refused, a's own included (an
        # unbound peer claiming a pinned id is refused id_pinned: the test above)
        send(_announcement("a", seq + 1))
        send(_announcement("y", seq + 2))
        send(_announcement("a", seq + 3, leaving=True))
        for borrowed in (False, True):
            raw.send({"op": "rpc", "b64": _badly_signed(_announcement("z", seq), borrowed=borrowed)})
        raw.send({"op": "flood", "topic": PRESENCE_TOPIC, "rate": 150, "count": 300, "size": 400})
        raw.event("flooded", 30)

        want = {"replay": 1, "stale": 1, "id_mismatch": 3, "bad_signature": 2}
        deadline = time.monotonic() + 15
        while True:
            drops = a.stats()["drops"]
            malformed = drops.get("wrong_method", 0) + drops.get("invalid", 0)
            if all(drops.get(r, 0) >= n for r, n in want.items()) and malformed >= 300:
                break
            assert time.monotonic() < deadline, f"wanted {want} and 300 malformed: {drops}"
            time.sleep(0.5)
        assert a.running
        ask(raw, "a", "after-hostile-presence")
        stats = a.stats()
        assert sorted(stats["companions"]) == [cid("a"), cid("b"), cid("x")]
        assert a.count("companion_updated", companion_id=cid("x")) == 0
        for proc in (a, b):
            assert cid("y") not in proc.stats()["companions"] and cid("z") not in proc.stats()["companions"]
        assert b.count("companion_left", companion_id=cid("a")) == 0
        assert b.count("companion_updated", companion_id=cid("a")) == 0
