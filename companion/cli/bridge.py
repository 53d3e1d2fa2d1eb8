"""``companion bridge``: join the network as a libp2p node (not a companion) and serve clients.

WebSocket clients speak aikyo's Firehose protocol, so existing aikyo clients work unchanged;
the same port serves the web page at ``/``. The WebSocket binds 127.0.0.1 unless ``--ws`` says
otherwise; ``--token`` makes every client present a shared token. The wiring is
:mod:`companion.app.bridge`; this module parses the arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

from companion.app.bridge import (
    BRIDGE_KEY,
    DEFAULT_CLIENT_RATE,
    DEFAULT_TOTAL_RATE,
    BridgeOptions,
    QueueLimits,
    RateLimit,
    bridge_peer_id,
    run_bridge,
)
from companion.app.logs import configure_node_logging
from companion.app.paths import default_data_dir
from companion.cli.exits import command_status
from companion.cli.options import (
    TOKEN_ENV,
    add_log_level_arguments,
    add_multiaddr_argument,
    add_no_mdns_argument,
    chosen_log_level,
    parse_ws_address,
    resolve_token,
)
from companion.cli.trust import add_trust_arguments, trust_options

__all__ = ["register"]

logger = logging.getLogger("companion.cli.bridge")


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
    add_multiaddr_argument(
        parser, "--peer", "bootstrap peer, e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...; redialled when lost"
    )
    add_multiaddr_argument(parser, "--listen", "libp2p listen address (default /ip4/0.0.0.0/tcp/0)")
    add_no_mdns_argument(parser)
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
    add_log_level_arguments(parser, "INFO", "the peers' payloads and every client frame")
    parser.set_defaults(func=main)


def _rate(flag: str, rate: float, burst: int) -> RateLimit:
    try:
        return RateLimit(rate, burst)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _print_peer_id(key_path: Path) -> int:
    """``--print-peer-id``: the id companions see this bridge's clients publish under."""
    try:
        peer_id = bridge_peer_id(key_path)
    except (ValueError, OSError) as exc:
        print(f"companion bridge: {exc}", file=sys.stderr)
        return 2
    print(peer_id, flush=True)
    return 0


def main(args: argparse.Namespace) -> int:
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
    configure_node_logging(chosen_log_level(args), args.log_format)
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
    return command_status("bridge", partial(run_bridge, options), logger)
