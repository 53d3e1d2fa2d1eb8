"""When the DHT asks its neighbours who else exists, and how often.

Each FIND_NODE costs both ends ~15-20 ms of CPU. A companion in a network smaller than its dial
target (three friends, a bridge beside them) never reaches the target; with clients and trims
opening and closing connections, the old schedule started over at one round a second after every
change and asked every neighbour again: half of an idle companion's CPU. These tests drive the
schedule with the connection changes of a real evening (a client that reconnects every few
seconds) and count what is asked.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL_ID
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from companion.node import routing
from companion.node.config import NodeConfig, make_host
from companion.node.discovery import parse_peer_addr
from companion.node.routing import LOOKUP_INTERVAL_MAX, DhtDiscovery

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)


class Changes:
    """The node's "a connection opened or closed" pulse, fired by the test."""

    def __init__(self) -> None:
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()


@contextlib.asynccontextmanager
async def no_service(_service: Any) -> AsyncIterator[None]:
    yield


async def test_changes_ask_only_new_neighbours_and_the_timer_keeps_doubling(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "background_trio_service", no_service)  # no DHT service, no network
    changes = Changes()
    discovery = DhtDiscovery(
        make_host(NodeConfig(listen=LOOPBACK), create_new_key_pair()),
        name="n",
        max_connections=4,
        wait_for_change=changes.wait,
    )
    rounds: list[tuple[float, bool]] = []
    count = 0

    async def counted_round(*, everyone: bool = True) -> bool:
        nonlocal count
        rounds.append((trio.current_time(), everyone))
        count += 1
        return count == 1  # only the first round learns a peer not known before

    monkeypatch.setattr(discovery, "round", counted_round)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(discovery.run)
        await trio.sleep(200)  # quiet: rounds at 0, 1 (learned at 0), 3, 7, 15, 31, 63, 127
        quiet = [(round(t - start), everyone) for t, everyone in rounds]
        assert quiet == [(t, True) for t in (0, 1, 3, 7, 15, 31, 63, 127)]
        rounds.clear()
        for _ in range(40):  # a client reconnecting every 3 s for two minutes
            changes.fire()
            await trio.sleep(3)
        assert len(rounds) == 40 and not any(everyone for _, everyone in rounds)  # one small round each
        rounds.clear()
        churn_ended = trio.current_time()
        await trio.sleep(2 * LOOKUP_INTERVAL_MAX)
        nursery.cancel_scope.cancel()
    # the timer went on where it was (128 s after the last round, then 256, 512, at most 600 s),
    # where the old schedule started over at 1 s after every change
    after = [(round(t - churn_ended), everyone) for t, everyone in rounds]
    assert after == [(125, True), (381, True), (893, True)]  # 893 - 381 = 512 < LOOKUP_INTERVAL_MAX
    assert LOOKUP_INTERVAL_MAX == 600


@contextlib.asynccontextmanager
async def dht_server() -> AsyncIterator[Any]:
    """A real host serving the DHT."""
    host = make_host(NodeConfig(listen=LOOPBACK), create_new_key_pair())
    dht = KadDHT(host, DHTMode.SERVER, enable_providers=False, enable_values=False)
    async with host.run(listen_addrs=[Multiaddr(a) for a in LOOPBACK]), background_trio_service(dht):
        yield host


async def test_a_round_after_a_change_asks_only_neighbours_never_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = make_host(NodeConfig(listen=LOOPBACK), create_new_key_pair())
    changes = Changes()
    discovery = DhtDiscovery(host, name="n", max_connections=4, wait_for_change=changes.wait)
    async with (
        host.run(listen_addrs=[Multiaddr(a) for a in LOOPBACK]),
        background_trio_service(discovery.dht),
        dht_server() as first,
        dht_server() as second,
    ):
        for server in (first, second):
            with trio.fail_after(10):
                await host.connect(parse_peer_addr(f"{server.get_addrs()[0]}"))
                while KAD_PROTOCOL_ID not in host.get_peerstore().get_protocols(server.get_id()):
                    await trio.sleep(0.05)  # identify tells which protocols it serves
        asked: list[Any] = []
        query = discovery.dht.peer_routing._query_peer_for_closest

        async def counted_query(peer: ID, key: bytes) -> list[ID]:
            asked.append(peer)
            return await query(peer, key)

        monkeypatch.setattr(discovery.dht.peer_routing, "_query_peer_for_closest", counted_query)
        servers = sorted((first.get_id(), second.get_id()), key=str)
        with trio.fail_after(20):
            await discovery.round(everyone=False)  # both are new: both asked (two keys each)
            assert sorted(asked, key=str) == sorted([*servers, *servers], key=str)
            await discovery.round(everyone=False)  # a change, no new neighbour: nobody asked
            assert len(asked) == 4
            await discovery.round(everyone=True)  # the timer's round asks everyone again
            assert len(asked) == 8
        assert discovery.lookups == 2
