"""Companions at home behind NAT hold one conversation through a public relay, in network
namespaces: the real routers, NAT and firewalls a user meets, not loopback.

Topology (support.netns): an "internet" switch on 203.0.113.0/24 (TEST-NET-3, inside the test's
namespaces only) with ``companion relay`` at 203.0.113.10, and three homes, each a router with
masquerade NAT and a firewall that drops unsolicited inbound packets, one host behind it:

- home a, 192.168.1.10 behind 203.0.113.20, port-preserving NAT ("cone"),
- home b, 192.168.2.10 behind 203.0.113.21, port-preserving NAT,
- home c, 192.168.3.10 behind 203.0.113.22, a random port per connection ("symmetric").

Each host runs ``companion run --relay <relay>`` (the relay is the only address anyone is
given). They must find each other through the relay's DHT, reach each other through the relay
(no home can be dialled directly), hold one conversation opened by a client in home a and
addressed to all three, and DCUtR must turn a-b direct (both NATs keep the port, so TCP
simultaneous open passes them) while a-c and b-c stay relayed (c's NAT maps a new port, so the
predicted address is wrong).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from companion.app.lines import parse_sees
from support.cards import speaking_card, write_card
from support.live import stdout_line
from support.netns import HERE_FILE, Topology, in_namespace, unavailable
from support.network import Event, Network, Proc

pytestmark = pytest.mark.integration

WHY_NOT = unavailable()
COMPANIONS = ("a", "b", "c")
IDS = frozenset(f"companion_{k}" for k in COMPANIONS)


@pytest.fixture
def homes(tmp_path: Path) -> Iterator[tuple[Topology, Network]]:
    """The namespaces and every process started in them; all gone afterwards, also on failure."""
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    topo = Topology()
    net = Network(tmp_path)
    try:
        topo.build_internet()
        topo.add_public("relay", 10)
        topo.add_home("a", "192.168.1", "cone")
        topo.add_home("b", "192.168.2", "cone")
        topo.add_home("c", "192.168.3", "symmetric")
        yield topo, net
    finally:
        net.stop_all()
        left = topo.close()
        assert left == [], f"namespaces left behind: {left}"


def start_relay(topo: Topology, net: Network) -> str:
    ns, ip = topo.public["relay"]
    argv = [sys.executable, "-m", "companion.cli.relay", "--listen", "/ip4/0.0.0.0/tcp/4001"]
    argv += ["--data-dir", str(net.tmp / "data-relay"), "--log-format", "json"]
    proc = Proc("relay", in_namespace(ns, *argv))
    net.procs.append(proc)
    line = stdout_line(proc, lambda s: s.strip().startswith(f"/ip4/{ip}/tcp/4001/p2p/"), 30)
    return line.strip()


def start_companion(topo: Topology, net: Network, key: str, relay: str, seed: int) -> Proc:
    card = write_card(net.tmp, key, speaking_card(key, key.upper(), "speak"))
    argv = [sys.executable, "-m", "companion.cli.run", str(card), "--no-mdns"]
    argv += ["--listen", "/ip4/0.0.0.0/tcp/4001", "--relay", relay, "--seed", str(seed)]
    argv += ["--data-dir", str(net.tmp / f"data-{key}"), "--log-format", "json", "-v"]
    proc = Proc(key, in_namespace(topo.homes[key].host, *argv))
    net.procs.append(proc)
    return proc


def peer_ids(procs: dict[str, Proc]) -> dict[str, str]:
    return {k: p.event("started", 30)["peer_id"] for k, p in procs.items()}


def wait_stats(proc: Proc, predicate: Callable[[Event], bool], timeout: float) -> Event:
    """Ask for ``stats`` (SIGUSR1) until one satisfies ``predicate``; the last one after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        stats = proc.stats()
        if predicate(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(1.0)


def test_companions_behind_nat_converse_and_dcutr_makes_cone_pairs_direct(
    homes: tuple[Topology, Network],
) -> None:
    topo, net = homes
    relay = start_relay(topo, net)
    procs = {k: start_companion(topo, net, k, relay, seed=i) for i, k in enumerate(COMPANIONS)}
    ids = peer_ids(procs)

    # every companion finds the other two through the relay's DHT and reaches them through it
    for key, proc in procs.items():
        stdout_line(proc, lambda s: (parse_sees(s) or ("", frozenset()))[1] == IDS, 60)
        assert proc.event("reachability_changed", 30)["reachability"] == "private", key
        proc.event("relay_reserved", 30)

    # a client in home a (on a's LAN only) opens one conversation with all three
    client = Proc(
        "client",
        in_namespace(
            topo.homes["a"].host,
            sys.executable,
            str(HERE_FILE),
            "client",
            "--peer",
            f"/ip4/{topo.homes['a'].host_ip}/tcp/4001/p2p/{ids['a']}",
            "--to",
            ",".join(sorted(IDS)),
        ),
        events_on="stdout",
    )
    net.procs.append(client)
    client.event("directory", 60, complete=True)
    speakers: set[str] = set()
    for _ in range(3):
        reply = client.wait_for(
            lambda e: (
                e.get("event") == "message"
                and e.get("sender") in IDS - speakers
                and e.get("sender", "").startswith("companion_")
            ),
            120,
            f"a reply from one of {sorted(IDS - speakers)}",
        )
        speakers.add(reply["sender"])
        if {"companion_b", "companion_c"} <= speakers:
            break
    # replies came from the homes behind the other NATs, to a client that only knows a
    assert {"companion_b", "companion_c"} <= speakers, speakers

    # which connections are direct: a-b by a hole punch, every pair with c still relayed
    def kinds(stats: Event, key: str) -> list[str]:
        return list(stats["connections"].get(ids[key], []))

    def punched() -> list[Event]:
        """a's and b's hole punches to each other (each says ok, how long, to which addresses)."""
        return [
            e
            for key in ("a", "b")
            for e in list(procs[key].events)
            if e.get("event") == "hole_punch" and e.get("peer") == ids["b" if key == "a" else "a"]
        ]

    a_stats = wait_stats(procs["a"], lambda s: "direct" in kinds(s, "b"), 60)
    b_stats = wait_stats(procs["b"], lambda s: "direct" in kinds(s, "a"), 30)
    c_stats = procs["c"].stats()
    # (it failed once in a full run, 5 punches failed in 60 s on the saturated machine: why, next time)
    assert "direct" in kinds(a_stats, "b"), f"{json.dumps(a_stats)}\npunches: {punched()}"
    assert "direct" in kinds(b_stats, "a"), json.dumps(b_stats)
    for stats, other in ((a_stats, "c"), (b_stats, "c"), (c_stats, "a"), (c_stats, "b")):
        assert kinds(stats, other) and set(kinds(stats, other)) == {"relayed"}, json.dumps(stats)

    # the direct connection exists a moment before DCUtR returns and logs its punch: wait for it
    deadline = time.monotonic() + 30
    while not any(e["ok"] for e in punched()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(e["ok"] for e in punched()), punched()
    # nobody can dial a home directly: every companion-to-companion connection began relayed
    assert sum(procs[k].stats()["relayed_dials"] for k in COMPANIONS) >= 3
    # no punch through c's NAT ever succeeds, on either side
    with_c = [
        e
        for key in COMPANIONS
        for e in procs[key].events
        if e.get("event") == "hole_punch" and (key == "c" or e.get("peer") == ids["c"])
    ]
    assert not any(e["ok"] for e in with_c), with_c
