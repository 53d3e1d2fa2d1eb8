"""Where a WebRTC client posts its SDP offer: the bridge's ``/webrtc/offer``.

The request itself goes through :func:`companion.bridge.httpclient.request`.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MAX_REPLY_BYTES", "offer_url"]

MAX_REPLY_BYTES: Final = 256 * 1024
"""The most of an answer to an offer that is read (an SDP answer is a few kilobytes)."""


def offer_url(base: str, path: str = "/webrtc/offer") -> str:
    """The offer endpoint of a bridge given as ``http(s)://`` or as its ``ws(s)://`` URL."""
    parts = urlsplit(base if "://" in base else f"http://{base}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported bridge URL scheme {parts.scheme!r}: use http(s):// or ws(s)://")
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))
