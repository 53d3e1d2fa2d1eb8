"""``POST /webrtc/offer`` on the bridge's HTTP port.

The bridge checks the token and origin exactly as for a WebSocket (``Route(needs_token=True)``);
this handler only turns the request into :meth:`RtcGateway.offer` and its reply into JSON.
"""

from __future__ import annotations

from typing import Final

from ..bridge.httpserver import HttpRequest, HttpResponse, Route, json_response
from .gateway import RtcGateway

__all__ = ["OFFER_PATH", "offer_route"]

OFFER_PATH: Final = "/webrtc/offer"


def offer_route(gateway: RtcGateway) -> Route:
    """The route to add with ``bridge.add_route(OFFER_PATH, offer_route(gateway))``."""

    async def handle(request: HttpRequest) -> HttpResponse:
        reply = await gateway.offer(request.body, query_topics=request.query_value("topics"))
        return json_response(reply.status, reply.body)

    return Route(handle, needs_token=True, methods=frozenset({"POST"}))
