"""Separate `companion run` processes on 127.0.0.1: discovery through --peer, joins, leaves
(SIGKILL, SIGTERM; SIGSTOP in test_network_hostile.py), and a restarted node keeping its peer id."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from support.network import Proc, network

pytestmark = pytest.mark.integration


def joined(proc: Proc, key: str, timeout: float = 20.0) -> None:
    proc.event("companion_joined", timeout, companion_id=f"companion_{key}")


def test_three_nodes_join_then_leave_on_kill(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        a_addr = a_started["addrs"][0]
        b, b_started = net.companion("b", a_addr)
        c, _ = net.companion("c", a_addr, b_started["addrs"][0])
        for proc, others in ((a, "bc"), (b, "ac"), (c, "ab")):
            for key in others:
                joined(proc, key)

        c.signal(signal.SIGKILL)
        a.event("companion_left", 10, companion_id="companion_c")
        b.event("companion_left", 10, companion_id="companion_c")

        # a frozen peer (SIGSTOP) is dropped by the health checks: test_network_hostile.py tests
        # it with short settings (the defaults probe a silent connection after 30 s)
        assert a.running and b.running


def test_sigterm_is_seen_at_once_and_restart_keeps_the_peer_id(tmp_path: Path) -> None:
    data = tmp_path / "a-data"
    with network(tmp_path) as net:
        a, first = net.companion("a", data_dir=data)
        addr = first["addrs"][0]
        b, _ = net.companion("b", addr)
        joined(a, "b")
        joined(b, "a")

        stopped_at = time.monotonic()
        assert a.stop() == 0
        a.event("stopped", 5)
        b.event("companion_left", 5, companion_id="companion_a")
        assert time.monotonic() - stopped_at < 5  # a clean close, not a health-check timeout

        port = addr.split("/")[4]
        again = Proc(
            "a2",
            [*a.popen.args[:6], "/ip4/127.0.0.1/tcp/" + port, *a.popen.args[7:]],  # type: ignore[index]
        )
        net.procs.append(again)
        second = again.event("started", 30)
        assert second["peer_id"] == first["peer_id"]
        assert second["addrs"][0] == addr
        # b redials its bootstrap peer and the companion joins again
        b.wait_for(
            lambda e: (
                e.get("event") == "companion_joined"
                and e.get("companion_id") == "companion_a"
                and b.count("companion_joined", companion_id="companion_a") >= 2
            ),
            30,
            "a second join of companion_a",
        )


def test_mdns_finds_and_dials_peers_on_this_host(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        # unique ids: other nodes on the LAN may answer mDNS too, these two must find each other
        stamp = str(time.monotonic_ns())
        a, _ = net.companion(f"mdns_a{stamp}", mdns=True)
        b, _ = net.companion(f"mdns_b{stamp}", mdns=True)
        joined(a, f"mdns_b{stamp}", 30)
        joined(b, f"mdns_a{stamp}", 30)
