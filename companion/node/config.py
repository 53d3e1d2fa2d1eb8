"""How a node's libp2p host and gossipsub are configured, and why each default is what it is.

Measured on py-libp2p 0.8.1 (see ``shared/notes``): its defaults suit long-lived DHT nodes, not a
handful of companions that must notice each other within seconds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiaddr
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network import swarm as _swarm
from libp2p.network.config import MAX_CONNECTIONS, ConnectionConfig
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from companion.node.announcements import DEFAULT_INTERVAL, DEFAULT_TTL
from companion.node.frames import WholeFrames
from companion.node.listening import refuse_taken
from companion.node.pubsub import CountingGossipSub
from companion.node.topology import dial_target
from companion.protocol import MAX_PAYLOAD_BYTES, PRESENCE_MAX_TTL

__all__ = ["GOSSIP_V11", "GOSSIP_V12", "YAMUX_RELEASE_ON_READ", "NodeConfig", "make_gossipsub", "make_host"]

YAMUX_RELEASE_ON_READ = "PY_YAMUX_RELEASE_ON_READ"

GOSSIP_V11: tuple[TProtocol, ...] = (PROTOCOL_ID_V11, PROTOCOL_ID)
"""gossipsub v1.1 and v1.0: measured faster in py-libp2p 0.8.1 (no IDONTWANT for every message)."""
GOSSIP_V12: tuple[TProtocol, ...] = (PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID)


@dataclass(frozen=True)
class NodeConfig:
    """Everything a :class:`~companion.node.CompanionNode` needs besides its metadata."""

    listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",)
    """Multiaddrs to listen on; ``/ip4/0.0.0.0/tcp/PORT`` to accept other machines."""
    peers: Sequence[str] = ()
    """Bootstrap multiaddrs (with ``/p2p/PEER_ID``), dialled at start and redialled when lost."""
    mdns: bool = False
    """Find and dial peers on the LAN by mDNS (blocks the loop ~1.5 s at start)."""
    key_path: Path | None = None
    """Where the node key lives; ``None`` for a fresh key each run."""
    name: str = ""
    """A label for logs (the companion id, or ``bridge``)."""
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    gossip_protocols: Sequence[TProtocol] = GOSSIP_V11
    """v1.1: in py-libp2p 0.8.1 v1.2's IDONTWANT for every message cost 1.7-1.9x the CPU and lost
    the most messages at 20 msg/s (measured), for a few companions it saves nothing."""
    heartbeat_interval: int = 1
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 8
    """Gossipsub's D / D_low / D_high, as libp2p deployments use them: a mesh above 8 peers is
    pruned to 6, so a node forwards to about 6 peers however large the network (measured with
    10 nodes: 27 % fewer RPCs and 26 % less CPU than never pruning)."""
    prune_back_off: int = 5
    """Seconds a pruned peer waits before it may GRAFT again. py-libp2p's 60 s, with low degrees,
    emptied a 10-node mesh (re-GRAFTs refused as floods); 5 s refills it within seconds."""
    outbound_queue_size: int = 128
    """RPCs py-libp2p may hold per peer before it drops (its own default is 32, silently)."""
    publish_wait: float = 2.0
    """How long a publish may wait while a peer's send queue is half full (then it publishes
    anyway, and what overflows is counted as ``outbound_queue_full``)."""
    health_check_interval: float = 30.0
    """A connection silent this long is probed with a Yamux ping (traffic proves it alive)."""
    health_timeout: float = 10.0
    """How long a probe's answer may take."""
    health_failures_allowed: int = 1
    """Unanswered probes in a row that are tolerated; one more closes the connection
    (``unresponsive``). A frozen peer is noticed within interval + (allowed + 1) x timeout."""
    dial_timeout: float = 5.0
    close_timeout: float = 5.0
    """How long an orderly stop may take before the host is cancelled outright."""
    metadata_timeout: float = 5.0
    redial_initial: float = 0.5
    redial_max: float = 30.0
    replay_capacity: int = 65536
    """Most message ids the replay guard remembers (the oldest are forgotten first)."""
    replay_window: float = 24 * 3600.0
    """Seconds a handled message id is remembered, across restarts when ``replay_path`` is set."""
    replay_path: Path | None = None
    """Where handled message ids persist (in the data directory), so a replay after a restart
    is still refused; ``None`` keeps them in memory only."""
    inbound_buffer: int = 1024
    stats_interval: float | None = None
    """Log a ``stats`` event this often (seconds); ``None`` for only on request and at stop."""
    yamux_batched_window: bool = True
    """Send a Yamux window update once 16 KiB were read (``yamux.py``); ``False`` for
    py-libp2p's own, which credits every other small read."""
    extra_host_options: dict[str, Any] = field(default_factory=dict)
    # --- beyond one network (routing.py, relay.py) ------------------------------------------
    relays: Sequence[str] = ()
    """Circuit relay v2 relays (``.../p2p/PEER_ID``), kept connected like bootstrap peers. While
    AutoNAT does not find this node reachable it holds a reservation on each and advertises the
    circuit address; peers it cannot dial directly it dials through them."""
    max_connections: int = 8
    """The most connections this node keeps, inbound ones included, besides protected ones
    (bootstrap peers, relays, allowed bridges): it dials half as many itself (DHT discovery,
    mDNS, py-libp2p's connection manager) and trims the excess (``topology.py``)."""
    trim_grace: float = 10.0
    """Seconds a new connection is kept before it may be trimmed: time to exchange metadata and
    a first presence announcement."""
    dht: bool = True
    """Run the Kademlia DHT, so any one bootstrap address finds the rest of the network."""
    hole_punch: bool = True
    """Replace relayed connections by direct ones with DCUtR when the NATs allow it."""
    # --- presence (presence.py) -------------------------------------------------------------
    presence: bool = True
    """Announce this companion on the presence topic and take others' announcements, so the
    directory holds companions that are not directly connected."""
    presence_interval: float = DEFAULT_INTERVAL
    """Seconds between announcements (each wait jittered to 75-100 % of it)."""
    presence_ttl: int = DEFAULT_TTL
    """Seconds an announcement lasts: how long a killed companion stays listed by nodes not
    connected to it."""
    presence_min_gap: float = 1.0
    """Seconds between two announcements triggered by a new peer or companion."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.trim_grace < 0:
            raise ValueError(f"trim_grace must not be negative, not {self.trim_grace}")
        if not 0 < self.presence_interval <= self.presence_ttl / 2:
            raise ValueError(
                f"presence_interval ({self.presence_interval} s) must be positive and at most half of "
                f"presence_ttl ({self.presence_ttl} s), so a lost announcement does not make a "
                "companion leave; raise the ttl or shorten the interval"
            )
        if not 1 <= self.presence_ttl <= PRESENCE_MAX_TTL:
            raise ValueError(f"presence_ttl must be 1..{PRESENCE_MAX_TTL} seconds, not {self.presence_ttl}")
        if self.presence_min_gap < 0:
            raise ValueError(f"presence_min_gap must not be negative, not {self.presence_min_gap}")


def connection_config(config: NodeConfig) -> ConnectionConfig:
    """py-libp2p's health monitor off: :mod:`companion.node.health` watches connections instead
    (py-libp2p's pinged on a fresh stream every few seconds, aborted peers without the ping
    protocol, and cost most of an idle node's CPU)."""
    low = low_watermark(config.max_connections)
    return ConnectionConfig(
        enable_health_monitoring=False,
        dial_timeout=config.dial_timeout,
        min_connections=min(1, low),
        low_watermark=low,
        high_watermark=config.max_connections,
        grace_period=config.trim_grace,
        max_connections=max(MAX_CONNECTIONS, config.max_connections),
    )


def low_watermark(max_connections: int) -> int:
    """py-libp2p's connection manager dials known peers up to the midpoint of its low and high
    watermarks (routing.py). The high one is the bound (where its own pruner starts; it cannot
    close connections with streams, see topology.py), the low one makes the midpoint
    :func:`~.topology.dial_target`."""
    return max(0, 2 * dial_target(max_connections) - max_connections)


def make_host(config: NodeConfig, key_pair: KeyPair) -> Any:
    """A TCP host with Noise only (no plaintext, secio or TLS fallbacks) and Yamux.

    Yamux window updates are batched: one per 16 KiB read (the node applies
    :func:`~.yamux.batch_window_updates` to every connection, unless ``yamux_batched_window`` is
    off). py-libp2p's own switch ``PY_YAMUX_RELEASE_ON_READ=0`` is set too (unless the
    environment sets it), for when the batching is off: it halves py-libp2p's updates (measured
    ~10 % less CPU and ~20 % lower p99 than ``1``).

    Every connection writes its frames whole (:mod:`.frames`): a writer whose deadline passes
    mid-write no longer spends a Noise nonce without sending, which broke the connection.
    """
    _swarm._HAPPY_EYEBALLS_DELAY = 0  # py-libp2p waits 250 ms before every dial otherwise
    refuse_taken(config.listen)  # py-libp2p would share a port in use (SO_REUSEPORT): listening.py
    os.environ.setdefault(YAMUX_RELEASE_ON_READ, "0")
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_preference="YAMUX",
        listen_addrs=[multiaddr.Multiaddr(a) for a in config.listen],
        enable_mDNS=config.mdns,
        connection_config=connection_config(config),
        **config.extra_host_options,
    )
    host.get_network().register_notifee(WholeFrames())  # first: before any other notifee writes
    return host


def make_gossipsub(config: NodeConfig) -> CountingGossipSub:
    """Gossipsub tuned for conversations: a 1 s heartbeat that stays 1 s (py-libp2p's adaptive
    gossip stretched it to 30 s after 30 s in a quiet network), degrees that prune, no publish
    rate cap (the edge and the bridge limit rates), and every dropped payload counted."""
    return CountingGossipSub(
        protocols=list(config.gossip_protocols),
        degree=config.degree,
        degree_low=config.degree_low,
        degree_high=config.degree_high,
        heartbeat_initial_delay=0.1,
        heartbeat_interval=config.heartbeat_interval,
        prune_back_off=config.prune_back_off,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
    )
