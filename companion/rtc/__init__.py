"""WebRTC clients for the bridge (aiortc on a trio-asyncio island).

The server side (:class:`RtcGateway`, :class:`RtcSession`) answers ``/webrtc/offer`` and moves
the Firehose frames between a data channel and the bridge, plus an optional voice track that
speaks ``speak`` queries; the client side (:func:`connect_rtc`) is what ``companion listen
--webrtc`` and the tests use.
"""

from companion.rtc.client import (
    ClientClosed,
    ClientSettings,
    OfferRejected,
    ReceivedAudio,
    RtcClient,
    Signaler,
    connect_rtc,
)
from companion.rtc.control import StopSpeech, VoiceSwitch, interpret_control
from companion.rtc.gateway import OfferReply, RtcGateway
from companion.rtc.ice import LOOPBACK, candidate_addresses_for, host_addresses
from companion.rtc.island import AsyncioIsland, open_island
from companion.rtc.seam import FrameServer
from companion.rtc.session import (
    DataChannelFrames,
    NegotiationFailed,
    RtcSession,
    SessionSettings,
    SessionStats,
)
from companion.rtc.signaling import OfferError, OfferRequest, parse_offer
from companion.rtc.voicequeue import FRAME_SAMPLES, SAMPLE_RATE, FrameStep, QueueFull, VoiceQueue

__all__ = [
    "FRAME_SAMPLES",
    "LOOPBACK",
    "SAMPLE_RATE",
    "AsyncioIsland",
    "ClientClosed",
    "ClientSettings",
    "DataChannelFrames",
    "FrameServer",
    "FrameStep",
    "NegotiationFailed",
    "OfferError",
    "OfferRejected",
    "OfferReply",
    "OfferRequest",
    "QueueFull",
    "ReceivedAudio",
    "RtcClient",
    "RtcGateway",
    "RtcSession",
    "SessionSettings",
    "SessionStats",
    "Signaler",
    "StopSpeech",
    "VoiceQueue",
    "VoiceSwitch",
    "candidate_addresses_for",
    "connect_rtc",
    "host_addresses",
    "interpret_control",
    "open_island",
    "parse_offer",
]
