"""The seam between WebRTC sessions and the bridge.

The bridge serves any :class:`~companion.bridge.channel.FrameChannel` with
:meth:`~companion.bridge.server.Bridge.serve_channel`: the same queue, slow-client rule,
receive hook, error frames and fan-out as a WebSocket client. A session hands it a channel
backed by its data channel (:class:`~companion.rtc.frames.DataChannelFrames`). Only the voice
talks to the network on its own account: it publishes the results of the speak queries it
answered, through the bridge's node; the node's echo shows them to the bridge's clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from companion.bridge.channel import FrameChannel

__all__ = ["FrameServer"]


class FrameServer(Protocol):
    """What a session needs from the bridge (``companion.bridge.Bridge`` is one)."""

    async def serve_channel(
        self, channel: FrameChannel, *, topics: Iterable[str] | None = None, label: str = ""
    ) -> None:
        """Run one client until it closes, falls too far behind, or the bridge stops."""
        ...
