"""The ``/webrtc/offer`` exchange as pure functions: the request body in, the answer body out.

A client posts ``{"type": "offer", "sdp": "...", "voice": true, "topics": ["messages", ...]}``
after ICE gathering has completed (no trickle: one request, one answer). An offer that can
receive audio gets a voice track; ``voice`` (default: whether the offer has an audio section)
says whether the bridge starts speaking ``speak`` queries on it at once (a control frame
switches it later). The answer is ``{"type": "answer", "sdp": "...", "session": ID, "voice":
bool}``, ``voice`` telling whether the bridge speaks now. Refusals are ``{"error": {"code",
"message"}}`` with a 4xx status, like the bridge's error frames.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from companion.protocol import TOPICS

__all__ = [
    "MAX_SDP_BYTES",
    "OfferError",
    "OfferRequest",
    "answer_body",
    "audio_codec",
    "error_body",
    "parse_offer",
]

MAX_SDP_BYTES: Final = 64 * 1024

OfferErrorCode: TypeAlias = Literal[
    "not_json", "invalid_offer", "unknown_topic", "no_data_channel", "busy", "negotiation_failed"
]


@dataclass(frozen=True, slots=True)
class OfferError:
    """Why an offer was refused: ``status`` for HTTP, ``code`` stable, ``message`` for people."""

    status: int
    code: OfferErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class OfferRequest:
    sdp: str
    voice: bool
    topics: frozenset[str] | None


def _has_section(sdp: str, media: str) -> bool:
    return any(line.startswith(f"m={media} ") for line in sdp.splitlines())


def parse_offer(body: bytes | str, query_topics: str | None = None) -> OfferRequest | OfferError:
    """Check a posted offer. ``query_topics`` is the URL's ``?topics=`` (as for a WebSocket)."""
    try:
        obj: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return OfferError(400, "not_json", f"the offer is not JSON: {str(exc)[:200]}")
    if not isinstance(obj, dict):
        return OfferError(400, "invalid_offer", 'post {"type": "offer", "sdp": "..."}')
    if obj.get("type") != "offer":
        return OfferError(400, "invalid_offer", f'"type" must be "offer", got {obj.get("type")!r}')
    sdp = obj.get("sdp")
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        return OfferError(400, "invalid_offer", '"sdp" must be the offer\'s SDP text (it starts with "v=0")')
    if len(sdp.encode("utf-8")) > MAX_SDP_BYTES:
        return OfferError(413, "invalid_offer", f"the SDP is larger than {MAX_SDP_BYTES} bytes")
    if not _has_section(sdp, "application"):
        return OfferError(
            400,
            "no_data_channel",
            "the offer has no data channel: create one (any label) before createOffer()",
        )
    has_audio = _has_section(sdp, "audio")
    voice = obj.get("voice", has_audio)
    if not isinstance(voice, bool):
        return OfferError(400, "invalid_offer", '"voice" must be true or false')
    if voice and not has_audio:
        return OfferError(
            400,
            "invalid_offer",
            "voice needs an audio section: "
            'addTransceiver("audio", {direction: "recvonly"}) before createOffer()',
        )
    raw_topics = obj.get("topics", query_topics)
    topics = _topics(raw_topics)
    if isinstance(topics, OfferError):
        return topics
    return OfferRequest(sdp=sdp, voice=voice, topics=topics)


def _topics(raw: Any) -> frozenset[str] | OfferError | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        items = [t.strip() for t in raw.split(",") if t.strip()]
    elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        items = list(raw)
    else:
        return OfferError(400, "invalid_offer", '"topics" must be a list of topic names')
    unknown = sorted(set(items) - set(TOPICS))
    if unknown:
        return OfferError(
            400, "unknown_topic", f"unknown topic(s) {', '.join(unknown)}; choose from {', '.join(TOPICS)}"
        )
    return frozenset(items) if items else None


def audio_codec(sdp: str) -> str | None:
    """The codec an SDP's (first) audio section sends with: its first payload type's name,
    lower-cased (``"opus"``, ``"pcmu"``...); ``None`` without audio."""
    payload_type: str | None = None
    in_audio = False
    for line in sdp.splitlines():
        if line.startswith("m="):
            if payload_type is not None:
                break
            fields = line[2:].split()
            in_audio = fields[0] == "audio" and len(fields) > 3
            if in_audio:
                payload_type = fields[3]
        elif in_audio and payload_type is not None and line.startswith(f"a=rtpmap:{payload_type} "):
            return line.split(" ", 1)[1].split("/", 1)[0].lower()
    return None


def answer_body(sdp: str, session_id: str, voice: bool) -> str:
    return json.dumps({"type": "answer", "sdp": sdp, "session": session_id, "voice": voice})


def error_body(error: OfferError) -> str:
    return json.dumps({"error": {"code": error.code, "message": error.message}})
