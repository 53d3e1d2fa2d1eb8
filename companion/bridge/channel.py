"""A frame channel: one client's two-way pipe of Firehose frames, whatever carries it.

The bridge serves any :class:`FrameChannel`; a WebSocket is one, a WebRTC data channel is
another. Each adapter maps its transport's close and error signals onto this small surface.
"""

from __future__ import annotations

from typing import Final, Protocol

from trio_websocket import ConnectionClosed, WebSocketConnection

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "ChannelClosed",
    "FrameChannel",
    "WebSocketChannel",
    "truncate_reason",
]

CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_POLICY: Final = 1008
"""Used for a client that fell too far behind (the reason text says so)."""
CLOSE_INTERNAL_ERROR: Final = 1011


class ChannelClosed(Exception):
    """The client went away while we were sending."""


class FrameChannel(Protocol):
    async def send(self, text: str) -> None:
        """Send one frame; raise :class:`ChannelClosed` if the client is gone."""
        ...

    async def receive(self) -> str | bytes | None:
        """The next frame from the client, or ``None`` once it has closed."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close with a code and a human reason; may wait for the peer (callers set a deadline)."""
        ...


def truncate_reason(reason: str, limit: int = 123) -> str:
    """A WebSocket close reason is at most 123 bytes of UTF-8."""
    data = reason.encode("utf-8")
    if len(data) <= limit:
        return reason
    return data[:limit].decode("utf-8", "ignore")


class WebSocketChannel:
    """:class:`FrameChannel` over a trio-websocket connection."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws

    async def send(self, text: str) -> None:
        try:
            await self._ws.send_message(text)
        except ConnectionClosed as exc:
            raise ChannelClosed(str(exc.reason)) from None

    async def receive(self) -> str | bytes | None:
        try:
            message: str | bytes = await self._ws.get_message()
        except ConnectionClosed:
            return None
        return message

    async def close(self, code: int, reason: str) -> None:
        await self._ws.aclose(code, truncate_reason(reason))
