"""How a node's libp2p host and gossipsub are configured, and why each default is what it is.

Measured on py-libp2p 0.8.1 (see ``shared/notes``): its defaults suit long-lived DHT nodes, not a
handful of companions that must notice each other within seconds.
"""

from __future__ import annotations

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
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from ..presence import DEFAULT_INTERVAL, DEFAULT_TTL
from ..protocol import MAX_PAYLOAD_BYTES, PRESENCE_MAX_TTL
from .topology import dial_target

__all__ = ["GOSSIP_V11", "GOSSIP_V12", "NodeConfig", "make_gossipsub", "make_host"]

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
    heartbeat_interval: int = 1
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 16
    """At least the expected number of peers: pruning a small mesh can empty it (measured)."""
    prune_back_off: int = 5
    health_check_interval: float = 3.0
    ping_timeout: float = 2.0
    """A frozen peer is noticed after about initial delay + interval + timeout (< 10 s)."""
    dial_timeout: float = 5.0
    close_timeout: float = 5.0
    """How long an orderly stop may take before the host is cancelled outright."""
    metadata_timeout: float = 5.0
    redial_initial: float = 0.5
    redial_max: float = 30.0
    replay_capacity: int = 65536
    inbound_buffer: int = 1024
    stats_interval: float | None = None
    """Log a ``stats`` event this often (seconds); ``None`` for only on request and at stop."""
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
    """Health monitoring on: a frozen (SIGSTOPped) peer's connection is aborted within seconds."""
    low = low_watermark(config.max_connections)
    return ConnectionConfig(
        enable_health_monitoring=True,
        health_initial_delay=1.0,
        health_warmup_window=0.0,
        health_check_interval=config.health_check_interval,
        ping_timeout=config.ping_timeout,
        abort_connection_on_ping_failure=True,
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
    """A TCP host with Noise only (no plaintext, secio or TLS fallbacks) and Yamux."""
    _swarm._HAPPY_EYEBALLS_DELAY = 0  # py-libp2p waits 250 ms before every dial otherwise
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_preference="YAMUX",
        listen_addrs=[multiaddr.Multiaddr(a) for a in config.listen],
        enable_mDNS=config.mdns,
        connection_config=connection_config(config),
        **config.extra_host_options,
    )


def make_gossipsub(config: NodeConfig) -> GossipSub:
    """Gossipsub tuned for a few companions: fast heartbeat, no publish rate cap."""
    return GossipSub(
        protocols=list(config.gossip_protocols),
        degree=config.degree,
        degree_low=config.degree_low,
        degree_high=config.degree_high,
        heartbeat_initial_delay=0.1,
        heartbeat_interval=config.heartbeat_interval,
        prune_back_off=config.prune_back_off,
        spam_protection_enabled=False,
    )
