"""The bridge's wiring: a libp2p node that is not a companion, and the clients it serves.

WebSocket clients speak aikyo's Firehose protocol, so existing aikyo clients work unchanged; the
same port serves the web page at ``/`` and, unless turned off, WebRTC offers. ``companion
bridge`` runs :func:`run_bridge`; ``companion run --ws`` builds the same bridge with
:func:`make_bridge` and serves it with :func:`serve_clients` (:mod:`.clients`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from companion.app.datadir import hold_key
from companion.app.lines import peer_line
from companion.app.stopping import Interrupted, note_stopping
from companion.app.trust import TrustOptions, open_trust
from companion.bridge import DEFAULT_TOPICS, Bridge, BridgeConfig, QueueLimits
from companion.bridge.access import needs_token
from companion.bridge.ratelimit import DEFAULT_CLIENT_RATE, DEFAULT_TOTAL_RATE, RateLimit
from companion.bridge.views import RecentMessages, serve_history
from companion.log import log_event
from companion.memory import Publisher
from companion.ports import Inbound
from companion.protocol import MESSAGES, STATES, Metadata

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from companion.node import CompanionNode

__all__ = [
    "BRIDGE_KEY",
    "DEFAULT_CLIENT_RATE",
    "DEFAULT_TOTAL_RATE",
    "BridgeOptions",
    "QueueLimits",
    "RateLimit",
    "bridge_peer_id",
    "client_urls",
    "make_bridge",
    "run_bridge",
    "serve_clients",
]

logger = logging.getLogger("companion.app.bridge")

BRIDGE_KEY: Final = "bridge.key"
"""The bridge node's key file under ``<data dir>/keys/``."""


@dataclass(frozen=True)
class BridgeOptions:
    """What ``companion bridge`` (and ``companion run --ws``) serve clients with.

    A bridge bound beyond loopback without a token gets a generated one here
    (``token_generated``), so every command that builds its options from these prints it
    with its URLs (:func:`client_urls`) and no client gets in without it.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    listen: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",)
    peers: Sequence[str] = ()
    mdns: bool = True
    key_path: Path | None = None
    """The node key (its peer id, which operators trust as an answerer); kept across runs."""
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    """Extra names a request's ``Host`` may carry (``--allow-host``)."""
    states: bool = False
    limits: QueueLimits = field(default_factory=QueueLimits)
    client_rate: RateLimit = DEFAULT_CLIENT_RATE
    total_rate: RateLimit = DEFAULT_TOTAL_RATE
    webrtc: bool = True
    """Accept WebRTC clients too (``POST /webrtc/offer``, docs/webrtc.md)."""
    voice: bool = True
    """WebRTC clients that ask for voice hear speak queries synthesized on the bridge."""
    data_dir: Path | None = None
    """Where the trust file is (pinned companion ids); ``None``: pins in memory only."""
    trust: TrustOptions = field(default_factory=TrustOptions)
    token_generated: bool = False
    """The token was made up because the bridge listens beyond loopback and none was given."""

    def __post_init__(self) -> None:
        if self.token is None and needs_token(self.host):
            object.__setattr__(self, "token", secrets.token_urlsafe(18))
            object.__setattr__(self, "token_generated", True)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def run_bridge(
    options: BridgeOptions,
    *,
    ready: Callable[[Bridge, CompanionNode], None] | None = None,
) -> None:
    """Start the node, then the WebSocket/HTTP server; run until SIGINT (then raise
    :class:`~.stopping.Interrupted` once stopped), SIGTERM or cancellation. A second bridge on
    the same key is refused at once (:func:`hold_key`): it would be the same peer id twice."""
    with hold_key(options.key_path, "companion bridge"):
        await _serve_bridge(options, ready)


async def _serve_bridge(
    options: BridgeOptions, ready: Callable[[Bridge, CompanionNode], None] | None
) -> None:
    from companion.node import CompanionNode, NodeConfig
    from companion.node.discovery import parse_peer_addr

    for addr in options.peers:
        parse_peer_addr(addr)
    node = CompanionNode(
        None,
        NodeConfig(
            listen=tuple(options.listen),
            peers=tuple(options.peers),
            mdns=options.mdns,
            key_path=options.key_path,
            name="bridge",
        ),
        trust=open_trust(options.data_dir, options.trust),
    )
    bridge = make_bridge(options, node)
    await bridge.bind()  # a taken --ws address is an error before the node starts
    from companion.app.metrics import ProcessMetrics

    ProcessMetrics().serve_on(bridge, node)  # /metrics, /healthz, /readyz on the bridge's port
    recent = RecentMessages()
    serve_history(bridge, recent.source)  # no store here: what it relayed since it started
    stopped_by = None
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, _Remembering(bridge, recent))
        port = await nursery.start(serve_clients, options, bridge, node)
        print(peer_line("bridge", node.peer_id), flush=True)
        for addr in node.listen_addrs:
            print(f"  {addr}", flush=True)
        for url in client_urls(options, port):
            print(f"  {url}", flush=True)
        if ready is not None:
            ready(bridge, node)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
            async for signum in signals:
                if signum == signal.SIGUSR1:  # counters, as companion run logs them
                    node.log_stats()
                    log_event(logger, "bridge_stats", **bridge.stats())
                    continue
                note_stopping(logger, signum)
                stopped_by = signum
                break
        nursery.cancel_scope.cancel()
    if stopped_by == signal.SIGINT:
        raise Interrupted


@dataclass(frozen=True, slots=True)
class _Remembering:
    """The standalone bridge's node handler: each message is noted for ``/history``, then
    everything goes to the bridge as before."""

    bridge: Bridge
    recent: RecentMessages

    async def handle(self, inbound: Inbound) -> None:
        if inbound.topic == MESSAGES:  # not a preview of one (PREVIEWS)
            self.recent.note(inbound.payload)
        await self.bridge.handle(inbound)


def make_bridge(
    options: BridgeOptions, node: CompanionNode, directory: Mapping[str, Metadata] | None = None
) -> Bridge:
    """A bridge whose clients publish through ``node``, a node that is not a companion (a
    companion's node may publish only as that companion); run ``node`` with the bridge as its
    handler, so clients get everything it receives. ``directory`` lists the companions for
    the page (default: those ``node`` sees)."""
    topics = DEFAULT_TOPICS | {STATES} if options.states else DEFAULT_TOPICS
    config = BridgeConfig(
        host=options.host,
        port=options.port,
        token=options.token,
        allowed_origins=options.allowed_origins,
        allowed_hosts=options.allowed_hosts,
        client_rate=options.client_rate,
        total_rate=options.total_rate,
        limits=options.limits,
        default_topics=topics,
    )
    known = node.directory if directory is None else directory
    return Bridge(node, directory=known, config=config)


async def serve_clients(
    options: BridgeOptions,
    bridge: Bridge,
    publisher: Publisher,
    *,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve WebSocket clients (and WebRTC ones unless ``options.webrtc`` is off) until
    cancelled; reports the bound port. ``publisher`` publishes what the bridge itself says
    (speak results of its voice): the bridge's node, so the echo shows them to its clients."""
    async with _webrtc(options, bridge, publisher), trio.open_nursery() as nursery:
        port = await nursery.start(bridge.serve)
        task_status.started(port)


def client_urls(options: BridgeOptions, port: int) -> list[str]:
    """What clients open: the WebSocket, the page and (with WebRTC) the offer endpoint."""
    token_query = f"?token={options.token}" if options.token else ""
    base = f"{_url_host(options.host)}:{port}"
    urls = [f"ws://{base}/{token_query}", f"page: http://{base}/{token_query}"]
    if options.webrtc:
        urls.append(f"webrtc: http://{base}/webrtc/offer{token_query}")
    if options.token_generated:
        urls.append(
            f"token: {options.token} (generated: clients beyond loopback must present it; "
            "--token TOKEN chooses one)"
        )
    return urls


def _webrtc(
    options: BridgeOptions, bridge: Bridge, publisher: Publisher
) -> AbstractAsyncContextManager[object]:
    """WebRTC clients on the same port, served by the same bridge (see docs/webrtc.md)."""
    if not options.webrtc:
        return contextlib.nullcontext()
    from companion.rtc.route import serve_webrtc

    return serve_webrtc(bridge, publisher, voice=options.voice)


def bridge_peer_id(key_path: Path) -> str:
    """The peer id the bridge's clients publish under (``--print-peer-id``), creating its key if
    needed. Raises ``ValueError`` for a key file that cannot be used, ``OSError`` when it cannot
    be read or written."""
    from libp2p.peer.id import ID

    from companion.node.identity import IdentityError, load_or_create_key_pair

    try:
        pair = load_or_create_key_pair(key_path)
    except IdentityError as exc:
        raise ValueError(str(exc)) from exc
    return str(ID.from_pubkey(pair.public_key).to_base58())
