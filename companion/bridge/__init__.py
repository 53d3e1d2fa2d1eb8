"""The client bridge: aikyo's Firehose protocol for WebSocket clients, and the web page.

Clients send ``{"topic": T, "body": {...}}`` to publish; they receive the raw JSON of every
payload on ``messages``, ``queries`` and ``actions`` (``states`` on request). The protocol
core is pure (:mod:`.frames`, :mod:`.clients`, :mod:`.access`, :mod:`.core`); :class:`Bridge`
is the trio shell around it.
"""

from companion.bridge.access import AccessDenied, AccessPolicy, check_access
from companion.bridge.channel import ChannelClosed, FrameChannel, WebSocketChannel
from companion.bridge.clients import DEFAULT_TOPICS, ClientQueue, ClientRegistry, QueueLimits, parse_topics
from companion.bridge.core import Fanout, FirehoseCore
from companion.bridge.frames import (
    CLIENT_TOPICS,
    FrameError,
    Issue,
    PublishRequest,
    decode_frame,
    interpret_request,
)
from companion.bridge.httpserver import HttpRequest, HttpResponse, Route, json_response, text_response
from companion.bridge.server import Bridge, BridgeConfig, ReceiveHook

__all__ = [
    "CLIENT_TOPICS",
    "DEFAULT_TOPICS",
    "AccessDenied",
    "AccessPolicy",
    "Bridge",
    "BridgeConfig",
    "ChannelClosed",
    "ClientQueue",
    "ClientRegistry",
    "Fanout",
    "FirehoseCore",
    "FrameChannel",
    "FrameError",
    "HttpRequest",
    "HttpResponse",
    "Issue",
    "PublishRequest",
    "QueueLimits",
    "ReceiveHook",
    "Route",
    "WebSocketChannel",
    "check_access",
    "decode_frame",
    "interpret_request",
    "json_response",
    "parse_topics",
    "text_response",
]
