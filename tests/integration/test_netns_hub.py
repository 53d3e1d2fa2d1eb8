"""Three companions given only a hub's address (``--peer HUB``) find each other.

Before, each knew the hub alone and never learned of the others: the hub saw everyone, the
others saw only the hub. Now their presence announcements, relayed by the hub, put everyone in
every directory, and the ring (from the announced addresses) and the DHT connect them
directly. Separate ``companion run`` processes on 127.0.0.1 (no mDNS), the way a user starts
them; the clock starts when the last one reports ``started``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from companion.app.lines import parse_sees
from support.live import start_companion, stdout_line
from support.network import network

pytestmark = pytest.mark.integration

FIND_DEADLINE = 5.0
"""Seconds from the last node's start until all four see each other (issue 12)."""
CONNECT_DEADLINE = 15.0
"""Seconds from the last node's start until the DHT connected each to both others (bound 8)."""


def test_three_nodes_bootstrapped_to_one_hub_find_each_other(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        _hub, hub_addr = start_companion(net, "hub", "Hub", "speak", seed=0)
        nodes = {
            k: start_companion(net, k, k.upper(), "speak", hub_addr, seed=i + 1)[0]
            for i, k in enumerate("xyz")
        }
        started = time.monotonic()
        everyone = frozenset({"companion_hub", *(f"companion_{k}" for k in nodes)})
        ids = {k: p.event("started", 5)["peer_id"] for k, p in nodes.items()}
        for proc in nodes.values():
            left = FIND_DEADLINE - (time.monotonic() - started)
            stdout_line(proc, lambda s: (parse_sees(s) or ("", frozenset()))[1] == everyone, max(left, 0.01))
        elapsed = time.monotonic() - started
        assert elapsed < FIND_DEADLINE
        # the others were found by the DHT, not given: each connects to both other non-hubs
        for key, proc in nodes.items():
            for other in (k for k in nodes if k != key):
                left = CONNECT_DEADLINE - (time.monotonic() - started)
                proc.event("peer_connected", max(left, 0.01), peer=ids[other])
        for key, proc in nodes.items():
            stats = proc.stats()
            assert {ids[k] for k in nodes if k != key} <= set(stats["connections"]), (
                key,
                stats["connections"],
            )
        # The ring (dialled from the announced addresses) may connect them before the DHT's
        # first rounds (measured: all connected 2 s after the start, no lookup yet); the DHT
        # still asks the hub, within a few rounds (1, 2, 4 s apart).
        lookups: dict[str, int] = {}
        while sum(n > 0 for n in lookups.values()) < 2:
            assert time.monotonic() - started < CONNECT_DEADLINE, lookups
            lookups = {key: proc.stats()["dht_lookups"] for key, proc in nodes.items()}
            time.sleep(0.5)
