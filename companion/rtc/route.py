"""Putting WebRTC on a bridge: the ``POST /webrtc/offer`` route and the gateway behind it.

The bridge checks the token and origin exactly as for a WebSocket (``Route(needs_token=True)``);
the handler only turns the request into :meth:`RtcGateway.offer` and its reply into JSON.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

from companion.bridge.httpserver import HttpRequest, HttpResponse, Route, json_response
from companion.log import log_event
from companion.memory import Publisher
from companion.rtc.gateway import RtcGateway
from companion.rtc.ice import candidate_addresses_for
from companion.rtc.session import SessionSettings
from companion.voice import EspeakSynthesizer, Synthesizer

if TYPE_CHECKING:
    from companion.bridge import Bridge

__all__ = ["OFFER_PATH", "offer_route", "serve_webrtc"]

logger = logging.getLogger("companion.rtc")

OFFER_PATH: Final = "/webrtc/offer"


def offer_route(gateway: RtcGateway) -> Route:
    """The route to add with ``bridge.add_route(OFFER_PATH, offer_route(gateway))``."""

    async def handle(request: HttpRequest) -> HttpResponse:
        reply = await gateway.offer(request.body, query_topics=request.query_value("topics"))
        return json_response(reply.status, reply.body)

    return Route(handle, needs_token=True, methods=frozenset({"POST"}))


@asynccontextmanager
async def serve_webrtc(
    bridge: Bridge,
    publisher: Publisher,
    *,
    voice: bool = True,
    synthesizer: Synthesizer | None = None,
    settings: SessionSettings | None = None,
) -> AsyncIterator[RtcGateway]:
    """Accept WebRTC clients on ``bridge`` for the duration of the block.

    ``publisher`` publishes the speak results (the bridge's node). With ``voice``, the
    synthesizer is ``synthesizer`` or espeak-ng when installed; ICE candidates follow the
    bridge's listening address unless ``settings`` say otherwise.
    """
    if voice and synthesizer is None:
        if EspeakSynthesizer.available():
            synthesizer = EspeakSynthesizer()
        else:
            log_event(logger, "voice_unavailable", logging.WARNING, reason="espeak-ng is not installed")
    if settings is None:
        settings = SessionSettings(ice_addresses=candidate_addresses_for(bridge.config.host))
    async with RtcGateway(
        bridge, publisher, synthesizer=synthesizer if voice else None, settings=settings
    ) as gateway:
        bridge.add_route(OFFER_PATH, offer_route(gateway))
        log_event(
            logger,
            "webrtc_ready",
            path=OFFER_PATH,
            voice=gateway.synthesizer.name if gateway.synthesizer else None,
            ice=",".join(settings.ice_addresses) if settings.ice_addresses else "all interfaces",
        )
        yield gateway
