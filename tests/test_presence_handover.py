"""A connection hands the new peer the latest announcement; it does not announce to everyone.

Real nodes on loopback. With 30 companions one per process every connection made while the DHT,
the ring and the connection bound settled triggered an announcement to the whole network (16 a
node in the first two minutes, each delivered to all 30 from several mesh peers): most of the
network's traffic while a conversation started. A node now hands its latest signed
announcement to the peer that connected, and that peer relays it only if it was new to it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from companion.node import presence as presence_module
from companion.node.announcements import PRESENCE_TOPIC
from companion.node.presence import PresenceService, PresenceSettings
from support.cards import metadata as md
from support.nodes import presence_service, running, until

AT_ONCE = 5.0
"""Well under any periodic announcement (100 s), so only a hand-over explains what arrives."""


@pytest.fixture
def no_warmup_no_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes announce once at start and never ask: what arrives after that came from a
    connection (the warm-up announcements and the requests would announce to everyone)."""
    monkeypatch.setattr(presence_module, "WARMUP", ())
    monkeypatch.setattr(presence_module, "REQUEST_AFTER", ())


async def test_a_new_connection_is_handed_the_latest_announcement_and_nobody_announces_anew(
    no_warmup_no_requests: None,
) -> None:
    """a and b know each other. c starts and dials a only: c hears a at once, and b hears c
    through a's relay of c's hand-over, while neither a nor b publishes anything and b hears
    nothing new from a (a's announcement went to c alone)."""
    async with (
        trio.open_nursery() as nursery,
        running(nursery, md("b"), dht=False) as (b, _),
        running(nursery, md("a"), peers=[b.listen_addrs[0]], dht=False) as (a, _),
    ):
        await until(lambda: {"companion_a", "companion_b"} <= set(a.directory) & set(b.directory), 15)
        await until(lambda: a.presence.published == 1 and b.presence.published == 1, AT_ONCE)
        # the directories fill from the metadata exchange too: wait for the announcements
        await until(lambda: b.membership.presence.of_peer(a.peer_id) is not None, AT_ONCE)
        a_heard_by_b = b.membership.presence.of_peer(a.peer_id)
        assert a_heard_by_b is not None
        async with running(nursery, md("c"), peers=[a.listen_addrs[0]], dht=False) as (c, _):
            await until(lambda: "companion_a" in c.directory and "companion_c" in b.directory, AT_ONCE)
            assert a.presence.handed_over >= 1 and c.presence.handed_over >= 1
            assert (a.presence.published, b.presence.published) == (1, 1), "a connection announced anew"
            again = b.membership.presence.of_peer(a.peer_id)
            assert again is not None and again.seq == a_heard_by_b.seq
            assert b.drops.by_reason["replay"] == 0, b.drops.by_reason
            nursery.cancel_scope.cancel()


def _service() -> tuple[PresenceService, SimpleNamespace]:
    """A companion's presence service over a pubsub that keeps what it is asked to send."""
    service = presence_service(
        settings=PresenceSettings(interval=100.0, ttl=300, min_gap=1.0, max_bytes=65536)
    )
    me = ID.from_base58(service.membership.self_peer)
    sent: list[tuple[ID, object]] = []
    router = SimpleNamespace(send_rpc=lambda peer, rpc: sent.append((peer, rpc)))
    pubsub = SimpleNamespace(router=router, peer_topics={PRESENCE_TOPIC: set()}, sent=sent, my_id=me)

    async def publish(topic: str, data: bytes) -> None:  # gossipsub hands its own message to the validator
        service.validate(me, rpc_pb2.Message(topicIDs=[topic], from_id=me.to_bytes(), data=data))

    pubsub.publish = publish
    service._pubsub = pubsub
    return service, pubsub


async def test_an_announcement_that_reports_a_loss_or_is_old_is_not_handed_over() -> None:
    """Only peers on the presence topic are handed anything (aikyo's never subscribe). Handed
    over later, an old loss report would make the peer suspect a companion that refuted it long
    ago; an announcement older than pubsub's memory of seen messages would be refused as a
    replay by peers that had it. A new announcement goes to everyone instead."""
    service, pubsub = _service()
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    pubsub.peer_topics[PRESENCE_TOPIC].add(peer)
    await service._announce(leaving=False)
    assert service._hand_over([peer]) and len(pubsub.sent) == 1
    aikyo = ID.from_pubkey(create_new_key_pair().public_key)  # connected, never on the topic
    assert not service._hand_over([aikyo]) and len(pubsub.sent) == 1

    service._report_lost(
        ID.from_pubkey(create_new_key_pair().public_key).to_base58(), int(time.time() * 1000)
    )
    await service._announce(leaving=False)
    assert not service._hand_over([peer]), "an announcement reporting a loss was handed over"

    service._lost.clear()
    await service._announce(leaving=False)
    assert service._hand_over([peer])
    service._handing_since -= presence_module.SEEN_TTL  # as if published two minutes ago
    assert not service._hand_over([peer]), "an announcement peers may have forgotten was handed over"


async def test_trimming_a_peer_that_holds_no_announcements_announces_nothing() -> None:
    """A node hands its announcement to a peer it trims, so the peer keeps it listed; a peer
    that is not on the presence topic (an aikyo node, a bridge, a client) holds none. Trimming
    one announced anew to the whole network (30 idle companions and a client that kept dialling
    back the nodes that trimmed it: 8 such announcements in 90 s, beside ~30 refreshes)."""
    service, pubsub = _service()
    await service._announce(leaving=False)
    published = service.published
    client = ID.from_pubkey(create_new_key_pair().public_key)  # connected, never on the topic
    await service.announce_now([client.to_base58()])
    assert (service.published, pubsub.sent) == (published, [])

    peer = ID.from_pubkey(create_new_key_pair().public_key)
    pubsub.peer_topics[PRESENCE_TOPIC].add(peer)
    await service.announce_now([client.to_base58(), peer.to_base58()])
    assert service.published == published and [to for to, _ in pubsub.sent] == [peer]  # handed over
    service._handing_since -= presence_module.SEEN_TTL  # too old to hand over: announced anew
    await service.announce_now([peer.to_base58()])
    assert service.published == published + 1


async def test_an_own_announcement_a_failed_write_took_is_announced_again() -> None:
    """Twelve companions started at once under load: a node's announcements went down with the
    streams that failed while connections churned (``send_failed``), and it stayed unknown to
    part of the network until its next interval. Such a loss now triggers an announcement; a
    peer's message relayed, or this node's message on another topic, does not."""
    service, pubsub = _service()
    me = pubsub.my_id.to_bytes()
    other = ID.from_pubkey(create_new_key_pair().public_key).to_bytes()
    service.unsent(rpc_pb2.Message(topicIDs=[PRESENCE_TOPIC], from_id=other, data=b"{}"))
    service.unsent(rpc_pb2.Message(topicIDs=["messages"], from_id=me, data=b"{}"))
    assert not service._triggered.is_set()
    service.unsent(rpc_pb2.Message(topicIDs=[PRESENCE_TOPIC], from_id=me, data=b"{}"))
    assert service._triggered.is_set()
