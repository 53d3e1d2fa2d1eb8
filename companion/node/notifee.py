"""A py-libp2p notifee for connection events only.

py-libp2p's ``INotifee`` declares six abstract callbacks; the node's notifees want one or two of
them (a connection opened or closed). :class:`ConnectionNotifee` answers every callback with
nothing, so each subclass states only what it does.
"""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetConn, INetStream, INotifee
from multiaddr import Multiaddr

__all__ = ["ConnectionNotifee"]


class ConnectionNotifee(INotifee):
    """Every network event ignored; override ``connected`` and ``disconnected`` as needed
    (py-libp2p awaits them inline while it connects: keep them short)."""

    async def connected(self, network: Any, conn: INetConn) -> None:
        return None

    async def disconnected(self, network: Any, conn: INetConn) -> None:
        return None

    async def opened_stream(self, network: Any, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: Any, stream: INetStream) -> None:
        return None

    async def listen(self, network: Any, multiaddr: Multiaddr) -> None:
        return None

    async def listen_close(self, network: Any, multiaddr: Multiaddr) -> None:
        return None
