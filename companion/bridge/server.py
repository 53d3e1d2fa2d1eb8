"""The bridge's trio shell: client sessions, the listening socket, the page and the endpoints.

Decisions live in :class:`~companion.bridge.core.FirehoseCore`; this module moves bytes. Each
client gets two tasks: one writes its queue out, one reads its frames and publishes them.
Payloads the bridge's node receives are handed to :meth:`Bridge.deliver`, which never blocks;
what the bridge publishes reaches its clients the same way, as the node's echo (the echo rule of
:mod:`companion.ports`), never the sender's own frame back.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import socket
import traceback
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio
from trio_websocket import wrap_server_stream

from companion.bind import bind_reason
from companion.bridge.access import AccessDenied, AccessPolicy, check_access, needs_token
from companion.bridge.channel import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    ChannelClosed,
    FrameChannel,
    WebSocketChannel,
)
from companion.bridge.clients import DEFAULT_TOPICS, ClientQueue, QueueLimits, parse_topics
from companion.bridge.core import Fanout, FirehoseCore
from companion.bridge.frames import MAX_FRAME_BYTES, FrameError, frame_ref, session_frame
from companion.bridge.handshake import check_handshake
from companion.bridge.httpserver import (
    HttpError,
    HttpRequest,
    HttpResponse,
    ReplayStream,
    Route,
    json_response,
    read_request,
    send_response,
    text_response,
)
from companion.bridge.ratelimit import DEFAULT_CLIENT_RATE, DEFAULT_TOTAL_RATE, RateLimit
from companion.log import log_event
from companion.memory import Inbound, Publisher
from companion.protocol import TOPICS, Envelope, Message, Metadata, QueryResult

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["Bridge", "BridgeBindError", "BridgeConfig", "ReceiveHook"]

logger = logging.getLogger("companion.bridge")

SHUTDOWN_GRACE: Final = 0.2
DELIVERED_IDS_KEPT: Final = 256
"""Message ids the bridge remembers having received (:meth:`Bridge.written`)."""
REFUSAL_LOG_INTERVAL: Final = 10.0
"""A client's refusals of one kind are logged once, then at most once per interval with the
number left out (a flood of 10,000 frames is a few lines, not 10,000)."""
WEB_DIR: Final = Path(__file__).resolve().parent.parent / "web"
_CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
_PAGE_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data: https:; "
        "style-src 'self'; script-src 'self'",
    ),
    ("Referrer-Policy", "no-referrer"),
)

ReceiveHook = Callable[[Any], Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None]
"""aikyo's receive handler: turns any client frame (decoded JSON) into ``{"topic", "body"}`` to
publish, or ``None`` when the hook consumed the frame itself. May be sync or async."""


class BridgeBindError(OSError):
    """The bridge cannot listen where it was told (in use, not this machine's, no permission);
    the message names the address and what to do."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.errno = code


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """How a bridge serves clients. A ``host`` other than loopback needs a ``token``."""

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    """Names a request's ``Host`` may carry besides the bound address (``--allow-host``)."""
    client_rate: RateLimit = DEFAULT_CLIENT_RATE
    """How fast one client may send frames; more are answered ``rate_limited``."""
    total_rate: RateLimit = DEFAULT_TOTAL_RATE
    """How fast all clients together may send frames."""
    limits: QueueLimits = field(default_factory=QueueLimits)
    default_topics: frozenset[str] = DEFAULT_TOPICS
    max_clients: int = 64
    request_timeout: float = 10.0
    """Deadline to read an HTTP request head (and to finish the WebSocket handshake)."""
    publish_timeout: float = 5.0
    hook_timeout: float = 5.0
    close_timeout: float = 2.0
    """How long a closing handshake may take before the socket is simply dropped."""
    drain_timeout: float = 10.0
    """A client whose own answers (error frames) fill half its queue is not read from until it
    takes them; if it does not within this time, it is disconnected as too slow."""
    serve_page: bool = True

    def __post_init__(self) -> None:
        if self.token is None and needs_token(self.host):
            raise ValueError(
                f"a bridge listening on {self.host} (not loopback) must require a token: "
                "give one (--token), or listen on 127.0.0.1"
            )
        if self.token is not None and not self.token.strip():
            raise ValueError("the bridge token must not be empty")

    @property
    def access(self) -> AccessPolicy:
        return AccessPolicy(
            self.token,
            self.allowed_origins,
            bind_host=self.host,
            allowed_hosts=self.allowed_hosts,
            machine_names=_machine_names(),
        )


@dataclass
class _LogLimit:
    """Log an event of a kind once, then at most once per interval, saying how many were left
    out in between: a flood of refusals is a few lines, and still counted."""

    interval: float = REFUSAL_LOG_INTERVAL
    _last: dict[object, tuple[float, int]] = field(default_factory=dict)

    def admit(self, key: object, now: float) -> int | None:
        """``None``: do not log this one. Else log it, with the number left out since the last."""
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now, 0)
        return last[1] if last is not None else 0


@dataclass
class _Session:
    client_id: str
    label: str
    queue: ClientQueue
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    wakeup: trio.Event = field(default_factory=trio.Event)
    kicked: str | None = None
    sending: bool = False
    cut: bool = False
    """The writer was cancelled in the middle of a frame: the stream is unusable."""
    room: trio.Event = field(default_factory=trio.Event)
    """Set by the writer when it takes a frame: the reader may be waiting for room."""
    refused: Counter[str] = field(default_factory=Counter)
    logs: _LogLimit = field(default_factory=_LogLimit)
    """Its refusals are logged once per code and interval."""

    def kick(self, reason: str, grace: float) -> None:
        """Disconnect: at once if no frame is being written, else once the frame in flight is
        written (a client that is reading takes it at once) or ``grace`` runs out."""
        if self.kicked is None:
            self.kicked = reason
        if self.sending:
            self.scope.deadline = min(self.scope.deadline, trio.current_time() + grace)
        else:
            self.scope.cancel()


class Bridge:
    """Serves Firehose clients over WebSocket (and any other :class:`FrameChannel`).

    ``publisher`` is where client frames go (the libp2p node, or a MemoryEndpoint in tests);
    everything that node receives must be handed to :meth:`deliver` (or :meth:`handle`), its
    own publications included: that is how clients see each other's frames. ``directory`` is
    the live mapping of connected companions (for names on the page).
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        directory: Mapping[str, Metadata] | None = None,
        config: BridgeConfig | None = None,
        receive_hook: ReceiveHook | None = None,
    ) -> None:
        self.config = config or BridgeConfig()
        self.core = FirehoseCore(
            self.config.limits,
            self.config.default_topics,
            client_rate=self.config.client_rate,
            total_rate=self.config.total_rate,
        )
        self._access = self.config.access
        self.refused: Counter[str] = Counter()
        """Client frames refused so far, by error code (every one got an error frame)."""
        self.published = 0
        """Client frames published so far."""
        self.requests_refused: Counter[int] = Counter()
        """HTTP requests and handshakes refused so far, by status (421, 403, 401, 400...)."""
        self._request_logs = _LogLimit()
        self._publisher = publisher
        self._directory: Mapping[str, Metadata] = directory if directory is not None else {}
        self._hook = receive_hook
        self._sessions: dict[str, _Session] = {}
        self._routes: dict[str, Route] = {}
        self._port: int | None = None
        self._listeners: Sequence[trio.SocketListener] | None = None
        self._clients_changed = trio.Event()
        self._delivered_ids: deque[str] = deque(maxlen=DELIVERED_IDS_KEPT)
        """The latest messages' ids that reached this bridge (for :meth:`written`)."""
        self._progress = trio.Event()
        """Set (and replaced) whenever a message arrives or a frame is written to a client."""
        self.add_route("/companions", Route(self._companions_route))
        if self.config.serve_page:
            self._add_page_routes()

    # --- public surface --------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the bridge is not listening yet")
        return self._port

    @property
    def client_count(self) -> int:
        return len(self._sessions)

    async def wait_for_clients(self, count: int) -> None:
        """Return once exactly ``count`` clients are connected (the caller sets the deadline)."""
        while len(self._sessions) != count:
            await self._clients_changed.wait()

    def _clients_change(self) -> None:
        self._clients_changed.set()
        self._clients_changed = trio.Event()
        self._progressed()

    def set_receive_hook(self, hook: ReceiveHook | None) -> None:
        self._hook = hook

    def add_route(self, path: str, route: Route) -> None:
        """Serve an extra HTTP endpoint on the bridge's port (e.g. ``/webrtc/offer``); a path
        ending in ``/`` (not ``/`` itself) serves every path below it."""
        self._routes[path] = route

    def deliver(self, inbound: Inbound) -> None:
        """A payload the node received (the echo of this bridge's own included); queued for
        subscribed clients. Never blocks. Our own topics between companions (the previews of
        messages) are nobody's client's business, and aikyo's clients never see them."""
        if inbound.topic in TOPICS:
            self._apply(self.core.network_payload(inbound))
            if isinstance(inbound.payload, Message):
                self._delivered_ids.append(inbound.payload.params.id)
                self._progressed()

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def written(self, ids: Iterable[str], timeout: float) -> bool:
        """Wait until the messages ``ids`` have reached this bridge and every frame queued for a
        client has been written to it (a stop lets the clients read a reply published in its
        last moment before they are closed); ``False`` if ``timeout`` passed first."""
        wanted = set(ids)
        with trio.move_on_after(timeout):
            while not (
                wanted <= set(self._delivered_ids)
                and all(not len(s.queue) and not s.sending for s in self._sessions.values())
            ):
                await self._progress.wait()
            return True
        return False

    async def handle(self, inbound: Inbound) -> None:
        """The node's inbound handler interface: same as :meth:`deliver`."""
        self.deliver(inbound)

    async def pump(self, inbound: trio.MemoryReceiveChannel[Inbound]) -> None:
        """Deliver everything from a channel of inbound payloads until it closes."""
        async for item in inbound:
            self.deliver(item)

    async def serve_channel(
        self, channel: FrameChannel, *, topics: Iterable[str] | None = None, label: str = ""
    ) -> None:
        """Run one client until it closes, falls too far behind, or the bridge stops."""
        client_id, queue = self.core.connect(topics)
        session = _Session(client_id, label or client_id, queue)
        self._sessions[client_id] = session
        self._clients_change()
        log_event(logger, "client_connected", client=session.label, clients=len(self._sessions))
        close_code, close_reason = CLOSE_NORMAL, "closed"
        try:
            with session.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop, session, channel)
                    await self._read_loop(session, channel)
                    nursery.cancel_scope.cancel()
            if session.kicked is not None:
                close_code, close_reason = CLOSE_POLICY, session.kicked
                log_event(
                    logger, "client_too_slow", logging.WARNING, client=session.label, reason=session.kicked
                )
        except BaseException as exc:
            if _only(exc, trio.Cancelled):
                close_code, close_reason = CLOSE_GOING_AWAY, "bridge shutting down"
            else:
                close_code, close_reason = CLOSE_INTERNAL_ERROR, "internal error"
            raise
        finally:
            self.core.disconnect(client_id)
            self._sessions.pop(client_id, None)
            self._clients_change()
            # On shutdown the connection's reader is already cancelled, so the peer's closing
            # reply can never be read: send our close frame and give up waiting quickly.
            # A frame cut in the middle leaves nothing sensible to say: just drop the socket.
            grace = self.config.close_timeout if close_code != CLOSE_GOING_AWAY else SHUTDOWN_GRACE
            if session.cut:
                grace = 0
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(grace),
                contextlib.suppress(ChannelClosed, trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await channel.close(close_code, close_reason)
            fields: dict[str, Any] = {"refused": dict(session.refused)} if session.refused else {}
            log_event(
                logger,
                "client_disconnected",
                logging.INFO,
                client=session.label,
                code=close_code,
                reason=close_reason,
                cut=session.cut,
                clients=len(self._sessions),
                **fields,
            )

    async def bind(self) -> int:
        """Take the listening address now (before anything else starts, so a taken port is an
        error at once); :meth:`serve` then serves it. Returns the port (port 0 picks one).
        Raises :class:`BridgeBindError`, naming the address, when it cannot."""
        if self._listeners is None:
            try:
                listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
            except OSError as exc:
                raise _bind_error(self.config.host, self.config.port, exc) from exc
            self._listeners = listeners
            self._port = int(listeners[0].socket.getsockname()[1])
        assert self._port is not None
        return self._port

    async def serve(self, *, task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``config.host:config.port`` (port 0 picks one; or what :meth:`bind` took);
        reports the port when ready."""
        port = await self.bind()
        listeners, self._listeners = self._listeners, None
        assert listeners is not None
        log_event(logger, "bridge_listening", host=self.config.host, port=port)
        task_status.started(port)
        await trio.serve_listeners(self._on_connection, listeners)

    # --- client sessions -------------------------------------------------------------------

    def _apply(self, fanout: Fanout) -> None:
        for client_id in fanout.queued:
            session = self._sessions.get(client_id)
            if session is not None:
                session.wakeup.set()
        for client_id, reason in fanout.too_slow:
            session = self._sessions.get(client_id)
            if session is not None:
                session.kick(reason, self.config.close_timeout)

    async def _write_loop(self, session: _Session, channel: FrameChannel) -> None:
        while True:
            if session.kicked is not None:
                session.scope.cancel()
                return
            frame = session.queue.pop()
            if frame is None:
                session.wakeup = trio.Event()
                await session.wakeup.wait()
                continue
            session.room.set()
            session.sending = True
            try:
                await channel.send(frame)
            except trio.Cancelled:
                session.cut = True
                raise
            except ChannelClosed:
                session.scope.cancel()
                return
            finally:
                session.sending = False
                self._progressed()

    async def _read_loop(self, session: _Session, channel: FrameChannel) -> None:
        while True:
            await self._wait_for_room(session)
            data = await channel.receive()
            if data is None:
                return
            await self._handle_frame(session, data)

    async def _wait_for_room(self, session: _Session) -> None:
        """Every frame a client sends is answered (published, or an error frame), so a client
        that sends faster than it reads fills its own queue with answers. Past half the queue
        its frames are not read until it takes its answers: the flood is slowed down by TCP
        instead of answers being lost. A client that never takes them is too slow."""
        limits = session.queue.limits
        high_frames, high_bytes = max(1, limits.max_frames // 2), max(1, limits.max_bytes // 2)

        def full() -> bool:
            return len(session.queue) >= high_frames or session.queue.pending_bytes >= high_bytes

        if not full():
            return
        with trio.move_on_after(self.config.drain_timeout):
            while full() and session.kicked is None:
                session.room = trio.Event()
                await session.room.wait()
            return
        session.kick(
            f"client too slow: it did not read its answers within {self.config.drain_timeout:g}s",
            self.config.close_timeout,
        )
        await trio.sleep_forever()  # the kick cancels this session

    async def _handle_frame(self, session: _Session, data: str | bytes) -> None:
        obj = self.core.decode(data)
        if isinstance(obj, FrameError):
            self._refuse(session, obj)
            return
        wait = self.core.admit(session.client_id, trio.current_time())
        if wait > 0.0:
            limit = self.config.client_rate
            self._refuse(
                session,
                FrameError(
                    "rate_limited",
                    f"too many frames: this bridge takes {limit.describe()} per client "
                    f"(and {self.config.total_rate.describe()} in all); send it again in {wait:.2f}s",
                    ref=frame_ref(obj),
                    retry_after=wait,
                ),
            )
            return
        named = session_frame(obj)
        if named is not None:
            if isinstance(named, FrameError):
                self._refuse(session, named)
            else:
                self.core.name_session(session.client_id, named)
            return
        if self._hook is not None:
            hooked = await self._run_hook(session, obj)
            if hooked is None or isinstance(hooked, FrameError):
                if isinstance(hooked, FrameError):
                    self._refuse(session, hooked)
                return
            obj = hooked
        request = self.core.interpret(obj)
        if isinstance(request, FrameError):
            self._refuse(session, request)
            return
        answer = request.envelope.id if isinstance(request.envelope, QueryResult) else None
        if isinstance(request.envelope, QueryResult):
            refused = self.core.claim_answer(session.client_id, request.envelope)
            if refused is not None:
                self._refuse(session, refused)
                return
        published = False
        echo = self.core.sending(session.client_id, request.topic, request.envelope)
        try:
            published = await self._publish(session, request.topic, request.envelope)
        finally:
            if answer is not None:
                self.core.answer_done(answer, published=published)
            if not published:
                self.core.not_sent(echo)
        if published:
            self.published += 1

    async def _publish(self, session: _Session, topic: str, envelope: Envelope) -> bool:
        """Publish a client's envelope; ``False`` (and an error frame) if the network would not."""
        try:
            with trio.fail_after(self.config.publish_timeout):
                await self._publisher.publish(topic, envelope)
        except trio.TooSlowError:
            log_event(logger, "client_publish_timeout", logging.WARNING, client=session.label, topic=topic)
            self._refuse(
                session, FrameError("publish_failed", "the network did not accept the frame in time")
            )
            return False
        except Exception as exc:
            _log_failure("client_publish_failed", exc, client=session.label, topic=topic)
            self._refuse(
                session, FrameError("publish_failed", f"publishing failed: {type(exc).__name__}: {exc}")
            )
            return False
        log_event(logger, "client_published", logging.DEBUG, client=session.label, topic=topic)
        return True

    async def _run_hook(self, session: _Session, obj: Any) -> Any | FrameError | None:
        assert self._hook is not None
        try:
            with trio.fail_after(self.config.hook_timeout):
                result = self._hook(obj)
                if inspect.isawaitable(result):
                    result = await result
        except trio.TooSlowError:
            return FrameError("hook_failed", f"the receive hook took over {self.config.hook_timeout}s")
        except Exception as exc:
            log_event(
                logger,
                "receive_hook_failed",
                logging.ERROR,
                client=session.label,
                error=f"{type(exc).__name__}: {exc}",
            )
            return FrameError("hook_failed", f"the receive hook failed: {type(exc).__name__}: {exc}")
        return result

    def _refuse(self, session: _Session, error: FrameError) -> None:
        """Answer a refused frame with its error frame; count it; log it (bounded)."""
        self.refused[error.code] += 1
        session.refused[error.code] += 1
        left_out = session.logs.admit(error.code, trio.current_time())
        if left_out is not None:
            fields: dict[str, Any] = {"left_out": left_out} if left_out else {}
            log_event(
                logger,
                "frame_refused",
                logging.INFO,
                client=session.label,
                code=error.code,
                detail=error.message[:200],
                **fields,
            )
        self._apply(self.core.error_to(session.client_id, error))

    def _refuse_request(self, event: str, denied: AccessDenied, **fields: Any) -> None:
        """Count a refused request or handshake; log it once per kind and interval."""
        self.requests_refused[denied.status] += 1
        left_out = self._request_logs.admit((event, denied.status), trio.current_time())
        if left_out is not None:
            if left_out:
                fields["left_out"] = left_out
            log_event(logger, event, logging.INFO, status=denied.status, reason=denied.reason[:200], **fields)

    def stats(self) -> dict[str, Any]:
        """Clients now, frames published and refused (by code), requests refused (by status)."""
        return {
            "clients": len(self._sessions),
            "published": self.published,
            "refused": dict(self.refused),
            "requests_refused": {str(status): n for status, n in sorted(self.requests_refused.items())},
        }

    # --- HTTP and WebSocket ----------------------------------------------------------------

    async def _on_connection(self, stream: trio.SocketStream) -> None:
        label = _peer_label(stream)
        try:
            await self._handle_connection(stream, label)
        except Exception as exc:
            if not _only(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
                _log_failure("bridge_connection_failed", exc, peer=label)
        finally:
            await trio.aclose_forcefully(stream)

    async def _handle_connection(self, stream: trio.SocketStream, label: str) -> None:
        try:
            with trio.fail_after(self.config.request_timeout):
                request = await read_request(stream)
        except trio.TooSlowError:
            log_event(logger, "http_request_timeout", logging.INFO, peer=label)
            return
        except HttpError as exc:
            await self._respond(stream, text_response(exc.status, exc.reason))
            return
        if request.is_websocket:
            await self._serve_websocket(stream, request, label)
        else:
            await self._serve_http(stream, request, label)

    async def _respond(self, stream: trio.abc.Stream, response: HttpResponse) -> None:
        with trio.move_on_after(self.config.close_timeout):
            await send_response(stream, response)

    async def _serve_websocket(self, stream: trio.SocketStream, request: HttpRequest, label: str) -> None:
        denied = check_handshake(request.method, request.http_version, request.headers) or check_access(
            self._access, request.target, request.headers
        )
        if denied is not None:
            self._refuse_request("client_refused", denied, peer=label)
            await self._respond(stream, _refusal(denied))
            return
        topics = parse_topics(request.query_value("topics"), self.config.default_topics)
        if isinstance(topics, str):
            await self._respond(stream, text_response(400, topics))
            return
        if len(self._sessions) >= self.config.max_clients:
            await self._respond(
                stream, text_response(503, f"bridge full ({self.config.max_clients} clients)")
            )
            return
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(self.config.request_timeout):
                    ws_request = await wrap_server_stream(
                        nursery,
                        ReplayStream(stream, request.raw),
                        message_queue_size=4,
                        max_message_size=4 * MAX_FRAME_BYTES,
                    )
                    ws = await ws_request.accept()
            except trio.TooSlowError:
                log_event(logger, "websocket_handshake_timeout", logging.INFO, peer=label)
                nursery.cancel_scope.cancel()
                return
            await self.serve_channel(WebSocketChannel(ws), topics=topics, label=label)
            nursery.cancel_scope.cancel()

    async def _serve_http(self, stream: trio.SocketStream, request: HttpRequest, label: str) -> None:
        route = self._routes.get(request.path) or self._prefix_route(request.path)
        # Host and Origin for every request, so a rebinding page gets not even the page (or a
        # 404 that tells it the bridge is there); the token for the routes that need it.
        denied = check_access(
            self._access, request.target, request.headers, token=route is not None and route.needs_token
        )
        if denied is not None:
            self._refuse_request("request_refused", denied, peer=label, path=request.path[:200])
            await self._respond(stream, _refusal(denied))
            return
        if route is None:
            await self._respond(stream, text_response(404, f"no such page: {request.path[:200]}"))
            return
        if request.method not in route.methods:
            await self._respond(stream, text_response(405, f"{request.method[:20]} not allowed here"))
            return
        try:
            with trio.fail_after(route.timeout or self.config.request_timeout):
                response = await route.handler(request)
        except trio.TooSlowError:
            response = text_response(504, "the handler did not answer in time")
        await self._respond(stream, response)

    def _prefix_route(self, path: str) -> Route | None:
        """A route added for a path ending in ``/`` serves every path below it (``/actions/``)."""
        for prefix, route in self._routes.items():
            if prefix.endswith("/") and prefix != "/" and path.startswith(prefix):
                return route
        return None

    async def _companions_route(self, request: HttpRequest) -> HttpResponse:
        companions = [m.model_dump(by_alias=True) for m in list(self._directory.values())]
        return json_response(200, json.dumps({"companions": companions}, ensure_ascii=False))

    def _add_page_routes(self) -> None:
        if not WEB_DIR.is_dir():
            log_event(logger, "web_page_missing", logging.WARNING, path=str(WEB_DIR))
            return
        for path in sorted(WEB_DIR.iterdir()):
            content_type = _CONTENT_TYPES.get(path.suffix)
            if content_type is None or not path.is_file():
                continue
            response = HttpResponse(200, path.read_bytes(), content_type, _PAGE_HEADERS)
            route = Route(_static(response), needs_token=False)
            self.add_route(f"/{path.name}", route)
            if path.name == "index.html":
                self.add_route("/", route)


def _static(response: HttpResponse) -> Callable[[HttpRequest], Awaitable[HttpResponse]]:
    async def handler(request: HttpRequest) -> HttpResponse:
        return response

    return handler


def _only(exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]) -> bool:
    """``exc`` is of ``kinds``, or an exception group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(e, kinds) for e in exc.exceptions)
    return isinstance(exc, kinds)


def _log_failure(event: str, exc: BaseException, **fields: Any) -> None:
    """An infrastructure failure or a bug: logged with its context and traceback."""
    log_event(
        logger,
        event,
        logging.ERROR,
        error=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)),
        **fields,
    )


def _refusal(denied: AccessDenied) -> HttpResponse:
    response = text_response(denied.status, denied.reason)
    return replace(response, headers=response.headers + denied.headers)


def _machine_names() -> tuple[str, ...]:
    """This machine's own names (``Host`` values a wildcard-bound bridge accepts)."""
    try:
        name = socket.gethostname().lower()
    except OSError:
        return ()
    return (name, f"{name}.local") if name else ()


def _bind_error(host: str, port: int, exc: OSError) -> BridgeBindError:
    """An error that names the address, and says what to do."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    free = f"--ws {shown.rpartition(':')[0]}:0" if port else None
    why = bind_reason(exc.errno, exc.strerror or str(exc), free)
    return BridgeBindError(f"cannot listen on {shown} (--ws): {why}", exc.errno)


def _peer_label(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except (OSError, ValueError):
        return "unknown"
    return f"{host}:{port}"
