"""``companion bridge``: join the network as a libp2p node (not a companion) and serve clients.

WebSocket clients speak aikyo's Firehose protocol, so existing aikyo clients work unchanged;
the same port serves the web page at ``/``. The WebSocket binds 127.0.0.1 unless ``--ws`` says
otherwise; ``--token`` makes every client present a shared token.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..bridge import DEFAULT_TOPICS, Bridge, BridgeConfig, QueueLimits
from ..bridge.access import needs_token
from ..bridge.ratelimit import DEFAULT_CLIENT_RATE, DEFAULT_TOTAL_RATE, RateLimit
from ..log import configure_logging, log_event
from ..protocol import STATES, Metadata
from ..transport import Publisher
from .trust import TrustOptions, add_trust_arguments, open_trust, trust_options

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from ..node import CompanionNode

__all__ = [
    "BridgeOptions",
    "client_urls",
    "make_bridge",
    "parse_ws_address",
    "register",
    "run_bridge",
    "serve_clients",
]

logger = logging.getLogger("companion.cli.bridge")

TOKEN_ENV = "COMPANION_BRIDGE_TOKEN"
BRIDGE_KEY = "bridge.key"
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


def parse_ws_address(value: str) -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080``, ``localhost:0`` or just ``8080`` (on 127.0.0.1)."""
    text = value.strip()
    if text.startswith("ws://"):
        text = text[len("ws://") :].rstrip("/")
    if text.isdigit():
        return "127.0.0.1", _port(text, value)
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"--ws {value!r}: write an IPv6 address as [::1]:8080")
        return host, _port(port, value)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--ws {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host, _port(port, value)


def _port(text: str, value: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"--ws {value!r}: the port must be a number from 0 to 65535")
    return int(text)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def run_bridge(
    options: BridgeOptions,
    *,
    ready: Callable[[Bridge, CompanionNode], None] | None = None,
) -> None:
    """Start the node, then the WebSocket/HTTP server; run until SIGINT/SIGTERM or cancellation."""
    from ..node import CompanionNode, NodeConfig
    from ..node.discovery import parse_peer_addr

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
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, bridge)
        port = await nursery.start(serve_clients, options, bridge, bridge.publisher(node))
        print(f"bridge peer {node.peer_id}", flush=True)
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
                log_event(logger, "stopping", signal=signal.Signals(signum).name)
                break
        nursery.cancel_scope.cancel()


def make_bridge(
    options: BridgeOptions, node: CompanionNode, directory: Mapping[str, Metadata] | None = None
) -> Bridge:
    """A bridge whose clients publish through ``node``, a node that is not a companion (a
    companion's node may publish only as that companion). ``directory`` lists the companions
    for the page (default: those ``node`` sees)."""
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
    return Bridge(node, directory=known, config=config, self_peer=node.peer_id)


async def serve_clients(
    options: BridgeOptions,
    bridge: Bridge,
    publisher: Publisher,
    *,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve WebSocket clients (and WebRTC ones unless ``options.webrtc`` is off) until
    cancelled; reports the bound port. ``publisher`` publishes what the bridge itself says
    (speak results of its voice): ``bridge.publisher(node)``."""
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
    from ..rtc.route import serve_webrtc

    return serve_webrtc(bridge, publisher, voice=options.voice)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bridge",
        help="serve WebSocket clients and the web page (aikyo Firehose protocol)",
        description=(
            "Join the companion network as a libp2p node (not a companion) and serve clients: "
            'they send {"topic": T, "body": {...}} to publish, and receive every payload on '
            "messages, queries and actions. The web page is served at /."
        ),
    )
    parser.add_argument(
        "--ws",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="where clients connect (default 127.0.0.1:8080; 0.0.0.0:8080 to accept other machines)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="bootstrap peer, e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...; redialled when lost",
    )
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="libp2p listen address (default /ip4/0.0.0.0/tcp/0)",
    )
    parser.add_argument("--no-mdns", action="store_true", help="do not discover peers on the LAN")
    parser.add_argument(
        "--token",
        nargs="?",
        const="",
        default=None,
        metavar="TOKEN",
        help=f"require this shared token from clients (?token=...); without a value, or with "
        f"${TOKEN_ENV} set, one is generated or read from the environment",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also accept browser pages from this origin (the bridge's own page and loopback "
        "pages are always accepted; '*' accepts any)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept requests whose Host is this name (e.g. a reverse proxy's; by default "
        "only the --ws address, and localhost for a loopback one; '*' accepts any)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_CLIENT_RATE.rate,
        metavar="FRAMES",
        help=f"frames per second one client may send (default {DEFAULT_CLIENT_RATE.rate:g}); "
        "more are answered with rate_limited error frames",
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=DEFAULT_CLIENT_RATE.burst,
        metavar="FRAMES",
        help=f"frames one client may send at once after a pause (default {DEFAULT_CLIENT_RATE.burst})",
    )
    parser.add_argument(
        "--total-rate",
        type=float,
        default=DEFAULT_TOTAL_RATE.rate,
        metavar="FRAMES",
        help=f"frames per second all clients together may send (default {DEFAULT_TOTAL_RATE.rate:g}, "
        "bursts of twice that)",
    )
    parser.add_argument("--states", action="store_true", help="send the states topic to every client")
    parser.add_argument(
        "--no-webrtc", action="store_true", help="do not accept WebRTC clients (POST /webrtc/offer)"
    )
    parser.add_argument(
        "--no-voice",
        action="store_true",
        help="WebRTC clients get no voice from the bridge (speak queries are left to the clients)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=QueueLimits().max_frames,
        metavar="FRAMES",
        help="frames a client may fall behind before it is disconnected",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the bridge's node key and trust file are kept (keys/bridge.key: its peer id stays "
        "the same across runs, so companions can trust it as an answerer)",
    )
    parser.add_argument(
        "--print-peer-id",
        action="store_true",
        help="print the bridge's peer id (creating its key if needed) and exit, e.g. for "
        "companion run --approver",
    )
    add_trust_arguments(parser, answers=False)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=main)


def _rate(flag: str, rate: float, burst: int) -> RateLimit:
    try:
        return RateLimit(rate, burst)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _print_peer_id(key_path: Path) -> int:
    """``--print-peer-id``: the id companions see this bridge's clients publish under."""
    from libp2p.peer.id import ID

    from ..node.identity import IdentityError, load_or_create_key_pair

    try:
        pair = load_or_create_key_pair(key_path)
    except (IdentityError, OSError) as exc:
        print(f"companion bridge: {exc}", file=sys.stderr)
        return 2
    print(ID.from_pubkey(pair.public_key).to_base58(), flush=True)
    return 0


def resolve_token(arg: str | None) -> str | None:
    """``--token X`` -> X; ``--token`` -> $COMPANION_BRIDGE_TOKEN or a fresh random token; absent
    -> $COMPANION_BRIDGE_TOKEN or no token."""
    env = os.environ.get(TOKEN_ENV) or None
    if arg is None:
        return env
    if arg:
        return arg
    return env or secrets.token_urlsafe(18)


def main(args: argparse.Namespace) -> int:
    from .run import default_data_dir

    data_dir = args.data_dir or default_data_dir()
    key_path = data_dir / "keys" / BRIDGE_KEY
    if args.print_peer_id:
        return _print_peer_id(key_path)
    try:
        host, port = parse_ws_address(args.ws)
        trust = trust_options(args)
        if args.max_queue < 1:
            raise ValueError("--max-queue must be at least 1")
        client_rate = _rate("--rate/--burst", args.rate, args.burst)
        total_rate = _rate("--total-rate", args.total_rate, max(1, round(2 * args.total_rate)))
    except ValueError as exc:
        print(f"companion bridge: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level.upper(), args.log_format)
    options = BridgeOptions(
        host=host,
        port=port,
        listen=tuple(args.listen) or BridgeOptions.listen,
        peers=tuple(args.peer),
        mdns=not args.no_mdns,
        key_path=key_path,
        token=resolve_token(args.token),
        allowed_origins=tuple(args.allow_origin),
        allowed_hosts=tuple(args.allow_host),
        states=args.states,
        limits=QueueLimits(max_frames=args.max_queue),
        client_rate=client_rate,
        total_rate=total_rate,
        webrtc=not args.no_webrtc,
        voice=not args.no_voice,
        data_dir=data_dir,
        trust=trust,
    )
    try:
        trio.run(run_bridge, options)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # type: ignore[assignment]
        if isinstance(exc, ValueError | OSError):
            print(f"companion bridge: {exc}", file=sys.stderr)
            return 2
        logger.exception("bridge failed", extra={"companion_event": "bridge_failed"})
        return 1
    return 0
