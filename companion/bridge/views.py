"""What a bridge shows its clients besides the Firehose: the recent conversation and faces.

``GET /history?limit=N`` answers ``{"messages": [{"at": SECONDS, "message": PAYLOAD}, ...]}``,
oldest first, from a source the composition root hands in (the companions' stores in
``companion run --ws``; a standalone ``companion bridge``, which has no store, remembers the last
:data:`MAX_HISTORY` messages it relayed since it started, :class:`RecentMessages`): a client
that connects, reloads or joins late shows what was said.
``GET /appearance`` answers ``{"companions": {ID: {"color": "#rrggbb" | null, "image": URL |
null}}}`` from the cards' optional ``appearance`` (never on the wire to peers: aikyo's metadata
is five fields), and ``GET /faces/ID`` serves a card's own image file. Every route follows the
WebSocket's access rules (Host, Origin, token) and is bounded: at most :data:`MAX_HISTORY`
messages and :data:`MAX_HISTORY_BYTES` of JSON, the oldest left out first.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote

import trio

from companion.bridge.httpserver import HttpRequest, HttpResponse, Route, json_response, text_response
from companion.log import log_event
from companion.protocol import Message, encode

__all__ = [
    "DEFAULT_HISTORY",
    "FACES_PREFIX",
    "MAX_HISTORY",
    "MAX_HISTORY_BYTES",
    "Face",
    "HistorySource",
    "RecentMessages",
    "TimedMessage",
    "serve_faces",
    "serve_history",
]

logger = logging.getLogger("companion.bridge.views")

DEFAULT_HISTORY: Final = 100
MAX_HISTORY: Final = 500
MAX_HISTORY_BYTES: Final = 2 * 1024 * 1024
HISTORY_TIMEOUT: Final = 5.0
FACES_PREFIX: Final = "/faces/"

TimedMessage = tuple[float | None, Message]
"""A message and when it was stored (seconds since the epoch; ``None``: not known)."""
HistorySource = Callable[[int], Awaitable[list[TimedMessage]]]
"""The last N messages, oldest first."""


@dataclass(frozen=True, slots=True)
class Face:
    """A companion's appearance as clients get it: a colour, and an image given as a URL or as
    the bytes of the card's own file (served at ``/faces/ID``)."""

    color: str | None = None
    image_url: str | None = None
    image: bytes | None = None
    content_type: str | None = None


class RecentMessages:
    """The last ``size`` messages a bridge relayed, in memory, for ``/history`` where no store
    is (a standalone ``companion bridge``). A message id seen again (gossip delivers each once,
    a peer may repeat one) is kept once; the newest are kept."""

    def __init__(self, size: int = MAX_HISTORY, clock: Callable[[], float] = time.time) -> None:
        self._messages: deque[TimedMessage] = deque(maxlen=size)
        self._ids: deque[str] = deque(maxlen=size)
        self._clock = clock

    def note(self, payload: object) -> None:
        """Remember ``payload`` if it is a message not seen yet; anything else is ignored."""
        if not isinstance(payload, Message) or payload.params.id in self._ids:
            return
        self._ids.append(payload.params.id)
        self._messages.append((self._clock(), payload))

    async def source(self, limit: int) -> list[TimedMessage]:
        """The last ``limit`` messages, oldest first (a :data:`HistorySource`)."""
        return list(self._messages)[-limit:] if limit > 0 else []


def history_body(messages: Sequence[TimedMessage], limit: int) -> str:
    """The JSON of ``/history``: the last ``limit`` messages, fewer if they would pass
    :data:`MAX_HISTORY_BYTES` (the newest are kept)."""
    items: list[str] = []
    size = 0
    for at, message in reversed(messages[-limit:] if limit > 0 else []):
        item = '{"at":' + json.dumps(at) + ',"message":' + encode(message).decode("utf-8") + "}"
        size += len(item.encode("utf-8")) + 1
        if size > MAX_HISTORY_BYTES:
            break
        items.append(item)
    return '{"messages":[' + ",".join(reversed(items)) + "]}"


def parse_limit(value: str | None) -> int | str:
    """``?limit=N`` (default :data:`DEFAULT_HISTORY`, at most :data:`MAX_HISTORY`), or why not."""
    if value is None:
        return DEFAULT_HISTORY
    if not value.isdigit() or len(value) > 6:
        return f"limit must be a whole number from 0 to {MAX_HISTORY}"
    return min(int(value), MAX_HISTORY)


def serve_history(bridge: Any, source: HistorySource) -> None:
    """Serve ``GET /history`` on ``bridge`` from ``source``."""

    async def handler(request: HttpRequest) -> HttpResponse:
        limit = parse_limit(request.query_value("limit"))
        if isinstance(limit, str):
            return text_response(400, limit)
        with trio.move_on_after(HISTORY_TIMEOUT) as scope:
            messages = await source(limit)
        if scope.cancelled_caught:
            log_event(logger, "history_timeout", logging.WARNING, timeout=HISTORY_TIMEOUT)
            return text_response(503, f"the history could not be read within {HISTORY_TIMEOUT:g} s")
        return json_response(200, history_body(messages, limit))

    bridge.add_route("/history", Route(handler, timeout=HISTORY_TIMEOUT + 1))


def serve_faces(bridge: Any, faces: Mapping[str, Face]) -> None:
    """Serve ``GET /appearance`` and ``GET /faces/ID`` on ``bridge`` for ``faces`` (companion id
    -> face)."""
    listing: dict[str, dict[str, str | None]] = {}
    for cid, face in faces.items():
        url = face.image_url if face.image is None else FACES_PREFIX + quote(cid, safe="")
        listing[cid] = {"color": face.color, "image": url}
    body = json.dumps({"companions": listing}, ensure_ascii=False)

    async def appearance(request: HttpRequest) -> HttpResponse:
        return json_response(200, body)

    async def image(request: HttpRequest) -> HttpResponse:
        face = faces.get(unquote(request.path[len(FACES_PREFIX) :]))
        if face is None or face.image is None or face.content_type is None:
            return text_response(404, "no such face")
        return HttpResponse(200, face.image, face.content_type)

    bridge.add_route("/appearance", Route(appearance))
    bridge.add_route(FACES_PREFIX, Route(image))
