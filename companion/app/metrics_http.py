"""The HTTP side of the metrics: ``/metrics``, ``/healthz`` and ``/readyz``.

On the bridge's port when there is one (``companion run --ws``, ``companion bridge``:
:func:`add_metrics_routes`, under the bridge's access rules), and on ``--metrics HOST:PORT``
(:func:`serve_metrics`: a small HTTP server on trio with the bridge's request reader, one
request per connection, each within :data:`REQUEST_TIMEOUT`). ``/healthz`` answers 200 while
the process's event loop runs (it answers from it); ``/readyz`` 200 once every node is connected
to a peer and every companion's engine is ready, else 503 and what is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.log import log_event

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from companion.app.metrics import ProcessMetrics
    from companion.bridge import Bridge
    from companion.bridge.httpserver import HttpRequest, HttpResponse

__all__ = ["METRICS_LINE", "REQUEST_TIMEOUT", "add_metrics_routes", "respond", "serve_metrics"]

logger = logging.getLogger("companion.app.metrics_http")

METRICS_LINE: Final = "metrics "
"""``metrics http://HOST:PORT/metrics`` on standard output once ``--metrics`` serves."""
REQUEST_TIMEOUT: Final = 10.0
"""Seconds a client of ``--metrics`` has to send its request, and we to answer it."""


def add_metrics_routes(bridge: Bridge, metrics: ProcessMetrics) -> None:
    """``/metrics`` (with the bridge's token, when it has one), ``/healthz`` and ``/readyz``
    (without: a liveness probe has no secret) on the bridge's port."""
    from companion.bridge.httpserver import Route

    if bridge not in metrics.bridges:
        metrics.bridges.append(bridge)
    bridge.add_route("/metrics", Route(_handler(metrics, "/metrics")))
    bridge.add_route("/healthz", Route(_handler(metrics, "/healthz"), needs_token=False))
    bridge.add_route("/readyz", Route(_handler(metrics, "/readyz"), needs_token=False))


def _handler(metrics: ProcessMetrics, path: str) -> Callable[[HttpRequest], Any]:
    async def handle(request: HttpRequest) -> HttpResponse:
        return respond(metrics, path, request.headers)

    return handle


def respond(metrics: ProcessMetrics, path: str, headers: Mapping[str, str]) -> HttpResponse:
    """The answer to ``GET path`` (``/metrics``, ``/healthz`` or ``/readyz``; else 404)."""
    from companion.bridge.httpserver import HttpResponse, text_response

    if path == "/metrics":
        body, content_type = metrics.exposition(headers.get("accept", ""))
        return HttpResponse(200, body, content_type)
    if path == "/healthz":
        return text_response(200, "ok")
    if path == "/readyz":
        missing = metrics.readiness()
        if missing:
            return text_response(503, "not ready: " + "; ".join(missing))
        return text_response(200, "ready")
    return text_response(404, "this port serves /metrics, /healthz and /readyz")


async def serve_metrics(
    host: str,
    port: int,
    metrics: ProcessMetrics,
    *,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``--metrics HOST:PORT``: serve :func:`respond` until cancelled; ``task_status.started``
    with the port once listening (prints ``metrics http://HOST:PORT/metrics``). An address in
    use raises ``OSError`` before that (the command exits 2)."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:  # one line for the user: which flag, which address, what is wrong
        reason = exc.strerror or str(exc)
        raise OSError(f"--metrics {host}:{port}: cannot listen there: {reason}") from None
    bound = listeners[0].socket.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"{METRICS_LINE}http://{shown}:{bound}/metrics", flush=True)
    log_event(logger, "metrics_listening", host=host, port=bound)
    task_status.started(bound)
    await trio.serve_listeners(lambda stream: _serve_one(stream, metrics), listeners)


async def _serve_one(stream: trio.SocketStream, metrics: ProcessMetrics) -> None:
    """One request, one response, within :data:`REQUEST_TIMEOUT`; anything a client sends is
    answered or dropped, never raised into the server."""
    from companion.bridge.httpserver import HttpError, read_request, send_response, text_response

    try:
        with trio.move_on_after(REQUEST_TIMEOUT):
            try:
                request = await read_request(stream)
            except HttpError as exc:
                await send_response(stream, text_response(exc.status, exc.reason))
                return
            if request.method != "GET":
                await send_response(stream, text_response(405, f"{request.method[:20]} not allowed here"))
                return
            await send_response(stream, respond(metrics, request.path, request.headers))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the client went away
    finally:
        await trio.aclose_forcefully(stream)
