"""What both ends of a WebRTC connection share, the bridge's sessions (:mod:`.session`) and the
clients (:mod:`.client`): the settings each end's own class extends, a peer connection made
without STUN/TURN servers, and its close within a deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCPeerConnection

from companion.rtc.ice import LOOPBACK
from companion.rtc.island import AsyncioIsland

__all__ = ["PeerSettings", "close_peer", "new_peer_connection"]


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """The settings both ends have (each end's own class adds the rest)."""

    ice_addresses: tuple[str, ...] | None = LOOPBACK
    """Local addresses offered as ICE candidates (``None``: every interface but loopback)."""
    connect_timeout: float = 15.0
    """Answer (sent or received) to the data channel open."""
    close_timeout: float = 5.0
    """How long closing the peer connection may take before it is left behind."""


async def new_peer_connection() -> RTCPeerConnection:
    """Created on the asyncio side; no STUN/TURN servers (aiortc would otherwise ask Google's)."""
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def close_peer(island: AsyncioIsland, pc: RTCPeerConnection | None, settings: PeerSettings) -> bool:
    """Close ``pc`` (none: nothing to close) within ``settings.close_timeout``; ``False`` when the
    deadline passed first, for the caller to log before it moves on."""
    return pc is None or await island.close_within(pc.close, settings.close_timeout)
