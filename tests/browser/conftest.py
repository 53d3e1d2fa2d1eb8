"""Browser tests need the distribution's Chromium; the set-up installs it when it can. The
``memory_bridge`` fixture serves the page from a bridge whose network is a MemoryHub."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from browser.browser_cdp import ensure_chromium
from companion.bridge import Bridge
from companion.memory import MemoryEndpoint
from companion.protocol import Metadata
from support.bridges import bridge_on_hub


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = ensure_chromium()
    if path is None:
        pytest.skip("Chromium is not installed and could not be installed (needs root and apt-get)")
    return path


@dataclass
class MemoryBridge:
    bridge: Bridge
    companion: MemoryEndpoint
    """Stands for the network: what it publishes reaches the bridge, and the other way round."""
    port: int


MakeBridge = Callable[..., Awaitable[MemoryBridge]]


@pytest.fixture
def memory_bridge(nursery: trio.Nursery) -> MakeBridge:
    """``await memory_bridge(directory, **BridgeConfig fields)``: a bridge on 127.0.0.1 (a free
    port unless ``port`` is given), running until the test ends."""

    async def make(directory: Mapping[str, Metadata] | None = None, **config: Any) -> MemoryBridge:
        net = bridge_on_hub(nursery, directory, **config)
        port = await nursery.start(net.bridge.serve)
        return MemoryBridge(net.bridge, net.companion, port)

    return make
