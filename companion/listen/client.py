"""The terminal client's trio shell: one WebSocket to the bridge, typed lines, and the voice.

:func:`run_listener` connects, then runs five tasks until the person quits or the connection
ends: frames from the bridge, lines from the person (any channel of strings, so tests need no
terminal), the companion directory refreshed from the bridge's ``/companions``, the voice,
which speaks lines one at a time and reports each ``speak`` query when its audio has finished,
and the clock, which ticks the status line (``Juniper is thinking… (12 s)``) once a second
while someone thinks.

It subscribes to ``states`` as well as aikyo's default topics (``?topics=``; an aikyo Firehose
ignores the parameter): a states array that chooses nobody because the conversation reached
``terminal`` is how a client learns that it is over.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import trio
from pydantic import ValidationError
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    ConnectionTimeout,
    DisconnectionTimeout,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from companion.bridge.access import token_from
from companion.bridge.httpclient import ReplyTooLarge, RequestFailed, RequestTimedOut, request
from companion.listen.core import START_HINT, Effect, ListenSession, Quit, Send, Show, Speak
from companion.listen.voice import Voice, VoiceError
from companion.log import log_event
from companion.protocol import ACTIONS, MESSAGES, QUERIES, STATES, Message, Metadata

if TYPE_CHECKING:
    from companion.rtc.listen import MessageConnection

__all__ = [
    "DirectoryError",
    "ListenOptions",
    "fetch_companions",
    "fetch_history",
    "run_listener",
    "with_query",
]

logger = logging.getLogger("companion.listen")

MAX_DIRECTORY_BYTES: Final = 1024 * 1024
MAX_HISTORY_BYTES: Final = 4 * 1024 * 1024
HISTORY_LINES: Final = 100
"""How many recent messages to ask the bridge's ``/history`` for, on each connection."""
RECONNECT_FIRST: Final = 0.5
RECONNECT_MAX: Final = 10.0
"""The wait before reconnecting doubles from the first to the last value, as the page's does."""
DISCONNECT_TIMEOUT: Final = 2.0
LISTEN_TOPICS: Final = (MESSAGES, QUERIES, ACTIONS, STATES)
"""What the client asks the bridge for: aikyo's Firehose topics, and ``states`` for the end."""


@dataclass(frozen=True)
class ListenOptions:
    url: str = "ws://127.0.0.1:8080/"
    user_id: str = "user_me"
    token: str | None = None
    voice: Voice | None = None
    answer_speak: bool = True
    connect_timeout: float = 10.0
    directory_interval: float = 10.0
    directory_timeout: float = 5.0
    voice_queue: int = 32
    webrtc: bool = False
    """Connect over a WebRTC data channel instead of a WebSocket (companion.rtc.listen)."""
    rtc_voice: bool = False
    """With ``webrtc``: the bridge speaks the lines on an audio track (and answers them)."""
    rtc_player: tuple[str, ...] | None = None
    """Where that audio goes: a player argv with ``{rate}`` (``None``: received, not played)."""
    reconnect_for: float = 600.0
    """After a connection is lost, how long to keep trying to reconnect before giving up."""


def effective_token(options: ListenOptions) -> str | None:
    """``--token``, else the one in the URL (``ws://host:port/?token=X``): the same token goes
    to the WebSocket, to ``/companions`` and to the WebRTC offer."""
    return options.token or token_from(options.url, {})


class DirectoryError(RuntimeError):
    """The bridge's companion list could not be read."""


def with_query(url: str, **params: str | None) -> str:
    """``url`` with the given query parameters set (``None`` values left out)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update({k: v for k, v in params.items() if v is not None})
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def subscribed(url: str) -> str:
    """``url`` asking for :data:`LISTEN_TOPICS`, unless it names its own ``topics``."""
    if "topics" in dict(parse_qsl(urlsplit(url).query)):
        return url
    return with_query(url, topics=",".join(LISTEN_TOPICS))


def _without_token(url: str) -> str:
    """A URL to show on screen: the token is a secret."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "token"]
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def directory_url(ws_url: str, token: str | None, path: str = "/companions") -> str:
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return with_query(urlunsplit((scheme, parts.netloc, path, "", "")), token=token)


async def fetch_companions(url: str, *, timeout: float = 5.0) -> list[Metadata]:
    """GET the bridge's ``/companions`` (plain HTTP on loopback; the caller's URL carries the token)."""
    status, body = await _get(url, timeout, MAX_DIRECTORY_BYTES)
    parts = urlsplit(url)
    if status != 200:
        raise DirectoryError(
            f"{parts.path} answered {status}: {bytes(body).decode('utf-8', 'replace').strip()}"
        )
    try:
        data = json.loads(body)
        return [Metadata.model_validate(item) for item in data["companions"]]
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise DirectoryError(f"unexpected companion list: {exc}") from exc


async def fetch_history(url: str, *, timeout: float = 5.0) -> list[tuple[float | None, Message]]:
    """GET the bridge's ``/history``: the recent messages with their times, oldest first. A
    bridge without one (``companion bridge`` alone: 404) has none; an entry that is not a
    message is left out."""
    status, body = await _get(url, timeout, MAX_HISTORY_BYTES)
    if status == 404:
        return []
    if status != 200:
        raise DirectoryError(
            f"/history answered {status}: {bytes(body[:300]).decode('utf-8', 'replace').strip()}"
        )
    try:
        items = json.loads(body)["messages"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DirectoryError(f"unexpected history: {exc}") from exc
    out: list[tuple[float | None, Message]] = []
    for item in items if isinstance(items, list) else []:
        try:
            message = Message.model_validate(item["message"])
        except (KeyError, TypeError, ValidationError):
            continue
        at = item.get("at")
        out.append((float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None, message))
    return out


async def _get(url: str, timeout: float, limit: int) -> tuple[int, bytes]:
    """GET ``url`` over plain HTTP: its status and body (at most ``limit`` bytes)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise DirectoryError(f"cannot fetch {url!r}: only http:// is supported")
    try:
        reply = await request("GET", url, timeout=timeout, limit=limit)
    except ReplyTooLarge as exc:
        raise DirectoryError(f"{parts.path} answered more than {limit} bytes") from exc
    except RequestTimedOut as exc:
        raise DirectoryError(f"no answer from {parts.netloc} within {timeout:g}s") from exc
    except RequestFailed as exc:
        raise DirectoryError(f"cannot read {parts.path} from {parts.netloc}: {exc}") from exc
    return reply.status, reply.body


async def run_listener(
    options: ListenOptions,
    lines: trio.MemoryReceiveChannel[str],
    show: Callable[[Show], None],
) -> int:
    """Run the client until the person quits (0) or the connection fails (1). A connection
    that was up and is lost (the bridge restarted) is made again, the wait doubling from
    :data:`RECONNECT_FIRST` to :data:`RECONNECT_MAX` seconds, for ``options.reconnect_for``
    seconds; what was said meanwhile comes from the bridge's ``/history``."""
    session = ListenSession(
        options.user_id, answer_speak=options.answer_speak, voice=options.voice is not None
    )
    token = effective_token(options)
    if token != options.token:
        options = replace(options, token=token)
    link = _Link(options, session, lines, show)
    connect = link.connect_rtc if options.webrtc else link.connect
    shown = _without_token(options.url)
    code = await connect(first=True)
    lost_since, wait = trio.current_time(), RECONNECT_FIRST
    while code is None or code == _CONNECTED_THEN_LOST:  # lost: reconnect, bounded in time
        if code == _CONNECTED_THEN_LOST:
            lost_since, wait = trio.current_time(), RECONNECT_FIRST
        if trio.current_time() - lost_since > options.reconnect_for:
            show(Show(f"gave up: no answer from {shown} for {options.reconnect_for:g} s", "error"))
            return 1
        show(Show(f"reconnecting to {shown} in {wait:g} s…"))
        await trio.sleep(wait)
        wait = min(wait * 2, RECONNECT_MAX)
        code = await connect(first=False)
    return code


_CONNECTED_THEN_LOST: Final = -1
"""What a connection returns when it was made and then lost: try again at once (from the
shortest wait), however long the last one lasted."""

_NOT_IN_TIME: Final = -2
"""What :meth:`_Link.converse` returns when the connection was not made within the deadline."""


@dataclass(frozen=True)
class _Link:
    """What every connection of one run of the client shares, over WebSocket or WebRTC.

    Each connection returns the exit code when the client is done, ``None`` when a
    reconnection could not be made (try again later), :data:`_CONNECTED_THEN_LOST` when it was
    made and lost. The first connection failing is final (a wrong address or token is the
    person's to fix)."""

    options: ListenOptions
    session: ListenSession
    lines: trio.MemoryReceiveChannel[str]
    show: Callable[[Show], None]

    async def converse(
        self, opening: AbstractAsyncContextManager[WebSocketConnection | MessageConnection], *, first: bool
    ) -> int:
        """Open the connection within ``connect_timeout`` (our own deadline: trio-websocket
        0.12 leaves its reader task waiting on a server that accepted the socket but never
        answers, so its own timeout never returns), then run the client on it until done."""
        connecting = trio.CancelScope(deadline=trio.current_time() + self.options.connect_timeout)
        with connecting:
            async with opening as connection:
                connecting.deadline = math.inf
                client = _Client(self.options, self.session, connection, self.show, first=first)
                code = await client.run(self.lines)
                return _CONNECTED_THEN_LOST if client.lost else code
        return _NOT_IN_TIME

    def failed(self, failure: Show, *, first: bool) -> int | None:
        """A connection that could not be made: final (1) if it was the first."""
        if first:
            self.show(failure)
            return 1
        return None

    async def connect(self, *, first: bool) -> int | None:
        """Over WebSocket; a refusal (401, 403, 421) is always final."""
        options = self.options
        url = subscribed(with_query(options.url, token=options.token))
        shown = _without_token(options.url)
        too_slow = Show(f"could not connect to {shown} within {options.connect_timeout:g}s", "error")
        opening = open_websocket_url(
            url, connect_timeout=options.connect_timeout + 1, disconnect_timeout=DISCONNECT_TIMEOUT
        )
        try:
            code = await self.converse(opening, first=first)
            return self.failed(too_slow, first=first) if code == _NOT_IN_TIME else code
        except ConnectionTimeout:
            return self.failed(too_slow, first=first)
        except DisconnectionTimeout:
            return 0  # we were leaving anyway; the bridge did not answer our close in time
        except ConnectionRejected as exc:
            refused = Show(f"could not connect to {shown}: {_describe(exc)}", "error")
            return self.failed(refused, first=first or exc.status_code in (401, 403, 421))
        except HandshakeError as exc:
            return self.failed(Show(f"could not connect to {shown}: {_describe(exc)}", "error"), first=first)
        except OSError as exc:
            return self.failed(Show(f"could not connect to {shown}: {exc}", "error"), first=first)

    async def connect_rtc(self, *, first: bool) -> int | None:
        """``--webrtc``: the same client over a data channel; the connection offers the two
        calls the client uses, with the same ``ConnectionClosed`` at the end. A refused offer is
        final."""
        from companion.rtc import OfferRejected
        from companion.rtc.listen import open_rtc_listener

        options = self.options
        shown = _without_token(options.url)
        opening = open_rtc_listener(
            options.url,
            token=options.token,
            voice=options.rtc_voice,
            player=options.rtc_player,
            topics=LISTEN_TOPICS,
        )
        try:
            code = await self.converse(opening, first=first)
            if code != _NOT_IN_TIME:
                return code
            too_slow = f"could not connect to {shown} over WebRTC within {options.connect_timeout:g}s"
            return self.failed(Show(too_slow, "error"), first=first)
        except OfferRejected as exc:
            self.show(Show(f"the bridge refused WebRTC: {exc}", "error"))
            return 1
        except (OSError, trio.TooSlowError) as exc:
            return self.failed(Show(f"could not connect to {shown} over WebRTC: {exc}", "error"), first=first)


def _describe(exc: HandshakeError) -> str:
    if isinstance(exc, ConnectionRejected):
        body = (exc.body or b"").decode("utf-8", "replace").strip()
        hint = ""
        if exc.status_code == 401:
            hint = (
                "; give the token with --token TOKEN (or $COMPANION_BRIDGE_TOKEN), or in the URL: "
                "--ws 'ws://HOST:PORT/?token=TOKEN' (the bridge prints it)"
            )
        return f"the bridge refused ({exc.status_code}): {body[:300]}{hint}"
    cause = exc.__cause__
    return str(cause or exc) or type(exc).__name__


class _Client:
    def __init__(
        self,
        options: ListenOptions,
        session: ListenSession,
        ws: WebSocketConnection | MessageConnection,
        show: Callable[[Show], None],
        *,
        first: bool = True,
    ) -> None:
        self.options = options
        self.session = session
        self.ws = ws
        self.show = show
        self.first = first
        self.exit_code = 0
        self.lost = False
        """The bridge closed the connection or went away (not the person leaving)."""
        self.speak_send, self.speak_receive = trio.open_memory_channel[Speak](options.voice_queue)
        self.frame_seen = trio.Event()
        """Set by each frame: the clock looks again at when the status next changes."""

    async def run(self, lines: trio.MemoryReceiveChannel[str]) -> int:
        where = f"{_without_token(self.options.url)} as {self.session.user_id}"
        if self.first:
            self.show(Show(f"connected to {where}"))
            self.show(Show(START_HINT))
        else:
            self.show(Show(f"reconnected to {where}"))
        await self._refresh_directory(warn=self.first)
        await self._load_history()
        async with trio.open_nursery() as nursery:
            self.scope = nursery.cancel_scope
            nursery.start_soon(self._frames)
            nursery.start_soon(self._lines, lines)
            nursery.start_soon(self._directory)
            nursery.start_soon(self._clock)
            if self.options.voice is not None:
                nursery.start_soon(self._voice, self.options.voice)
        return self.exit_code

    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Show):
                self.show(effect)
            elif isinstance(effect, Send):
                try:
                    await self.ws.send_message(effect.frame)
                except ConnectionClosed:
                    return  # _frames notices and reports it
            elif isinstance(effect, Speak):
                try:
                    self.speak_send.send_nowait(effect)
                except trio.WouldBlock:
                    await self._apply(
                        self.session.speak_done(effect.query_id, error="too many lines waiting")
                    )
            elif isinstance(effect, Quit):
                self.scope.cancel()

    async def _frames(self) -> None:
        while True:
            try:
                frame = await self.ws.get_message()
            except ConnectionClosed as exc:
                reason = exc.reason
                detail = f"{reason.code} {reason.reason or ''}".strip() if reason is not None else "closed"
                self.show(Show(f"the bridge closed the connection ({detail})", "error"))
                self.exit_code = 1
                self.lost = True
                self.scope.cancel()
                return
            await self._apply(self.session.on_frame(frame, trio.current_time()))
            self.frame_seen.set()

    async def _clock(self) -> None:
        """Tick the session when its status line next changes (a thinking counter's second);
        asleep while nobody thinks."""
        while True:
            due = self.session.next_tick(trio.current_time())
            with trio.move_on_at(math.inf if due is None else due):
                await self.frame_seen.wait()
            self.frame_seen = trio.Event()
            await self._apply(self.session.tick(trio.current_time()))

    async def _lines(self, lines: trio.MemoryReceiveChannel[str]) -> None:
        async for line in lines:
            await self._apply(self.session.on_input(line, trio.current_time()))
        self.scope.cancel()  # end of input: leave

    async def _refresh_directory(self, *, warn: bool) -> None:
        url = directory_url(self.options.url, self.options.token)
        try:
            companions = await fetch_companions(url, timeout=self.options.directory_timeout)
        except DirectoryError as exc:
            if warn:
                log_event(logger, "directory_unavailable", logging.WARNING, error=str(exc))
            return
        self.session.set_companions(companions)

    async def _load_history(self) -> None:
        """What was said before this connection (or while the last one was down)."""
        url = with_query(
            directory_url(self.options.url, self.options.token, "/history"), limit=str(HISTORY_LINES)
        )
        try:
            items = await fetch_history(url, timeout=self.options.directory_timeout)
        except DirectoryError as exc:
            log_event(logger, "history_unavailable", logging.WARNING, error=str(exc))
            return
        await self._apply(self.session.on_history(items))

    async def _directory(self) -> None:
        while True:
            await trio.sleep(self.options.directory_interval)
            await self._refresh_directory(warn=False)

    async def _voice(self, voice: Voice) -> None:
        async for item in self.speak_receive:
            try:
                await voice.say(item.text, item.emotion)
            except VoiceError as exc:
                await self._apply(self.session.speak_done(item.query_id, error=str(exc)))
            else:
                await self._apply(self.session.speak_done(item.query_id, engine=voice.name))
