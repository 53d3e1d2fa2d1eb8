"""``companion run`` stops with SIGTERM right after a burst: its history on disk holds every message.

The store writes behind (:mod:`companion.store.sqlite`); this is the promise that makes that safe: a
node that stops, however busy, flushes before it exits. A raw peer sends 600 messages to the
companion at 150 a second; the moment the companion logged the last one it gets SIGTERM, and the
reopened store must hold each of them once, in the order they arrived.
"""

from __future__ import annotations

from pathlib import Path

from companion.protocol import MESSAGES
from companion.store.sqlite import Store
from support.network import network, warm_up

COUNT = 600


def test_sigterm_after_a_burst_keeps_every_message(tmp_path: Path) -> None:
    data = tmp_path / "data-a"
    with network(tmp_path) as net:
        a, started = net.companion("a", data_dir=data)
        raw, _ = net.raw("x")
        raw.send({"op": "connect", "addr": started["addrs"][0]})
        raw.event("connected", 15)
        a.event("companion_joined", 30, companion_id="companion_x")
        # the burst's first message must not precede raw's mesh
        warm_up(raw, a, "companion_x", ["companion_a"])
        raw.send(
            {
                "op": "flood",
                "topic": MESSAGES,
                "rate": 150,
                "count": COUNT,
                "size": 300,
                "to": ["companion_a"],
            }
        )
        a.wait_for(
            lambda e: e.get("event") == "inbound" and e.get("id") == f"flood-{COUNT - 1}",
            60,
            "the last message of the burst",
        )
        arrived = [
            str(e["id"])
            for e in list(a.events)
            if e.get("event") == "inbound" and str(e.get("id")).startswith("flood-")
        ]
        assert a.stop() == 0  # SIGTERM: a clean exit
        assert a.event("store_closed", 10)["complete"] is True
        assert a.count("store_closed") == 1 and a.count("run_failed") == 0
    with Store.in_directory(data / "companion_a") as store:
        stored = [m.params.id for m in store.recent(10 * COUNT) if m.params.id.startswith("flood-")]
    assert stored == list(dict.fromkeys(arrived))  # every one, once, in order of arrival
    assert len(stored) == COUNT
