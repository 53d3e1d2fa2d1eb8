"""A bridge on an in-memory network: what every bridge, WebRTC, listen and browser test that needs
no libp2p starts from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from companion.bridge import Bridge, BridgeConfig
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import Metadata


@dataclass(frozen=True)
class HubBridge:
    hub: MemoryHub
    bridge: Bridge
    node: MemoryEndpoint
    """The bridge's node (endpoint ``bridge``): what it publishes comes back to it (the echo rule)."""
    companion: MemoryEndpoint
    """Endpoint ``companion``: stands for the network; what it publishes reaches the bridge, and
    the other way round."""


def bridge_on_hub(
    nursery: trio.Nursery, directory: Mapping[str, Metadata] | None = None, **config: Any
) -> HubBridge:
    """A bridge (``BridgeConfig(port=0, **config)``) whose node is the endpoint ``bridge`` of a new
    :class:`MemoryHub`, handed everything that node receives until ``nursery`` ends. Serving it
    is the caller's: ``port = await nursery.start(hub_bridge.bridge.serve)``."""
    hub = MemoryHub()
    node, companion = hub.endpoint("bridge"), hub.endpoint("companion")
    bridge = Bridge(node, directory=directory, config=BridgeConfig(**{"port": 0, **config}))
    nursery.start_soon(bridge.pump, node.receive_channel)
    return HubBridge(hub, bridge, node, companion)
