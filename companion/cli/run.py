"""``companion run CARD...``: one libp2p node per card, each with its conversation engine.

Each card's model is ``--model`` (for every card), else the card's ``settings.model``, else the
offline scripted model; every distinct model is built and checked at start-up, while the nodes
already dial their peers, so a missing key or an endpoint that is down is an error now (exit 2),
not mid-conversation. History and working memory live in ``--data-dir/<companion id>/``. With
``--ws HOST:PORT`` the process also serves clients with the bridge of ``companion bridge``
(WebSocket, the page, WebRTC).

What runs is :mod:`companion.app.run`; this module parses the arguments and maps failures to
exit statuses. Standard output (:mod:`companion.app.lines`): ``<id> peer <peer id>`` followed by
indented addresses, ``<id> sees <id>,<id>...`` whenever a node's directory changes, and ``bridge
ws://HOST:PORT/`` followed by the page and WebRTC URLs. Ctrl-C or SIGTERM stops in order and
loses nothing (the reply in flight finishes within 3 s or is withdrawn; exit 130 or 0); a second
one stops at once (130 or 143); SIGUSR1 logs a ``stats`` event per node.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from companion.app import collector
from companion.app.cards import resolve_card
from companion.app.paths import default_data_dir
from companion.app.stopping import is_interrupt
from companion.cli.exits import command_status
from companion.cli.options import (
    TOKEN_ENV,
    add_log_level_arguments,
    add_metrics_argument,
    add_multiaddr_argument,
    add_no_mdns_argument,
    chosen_log_level,
    metrics_address,
    parse_ws_address,
    resolve_token,
    standalone_args,
)
from companion.cli.trust import add_trust_arguments, trust_options

if TYPE_CHECKING:
    from companion.app.bridge import BridgeOptions

__all__ = ["register", "standalone"]

logger = logging.getLogger("companion.cli.run")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run companions (one libp2p node and conversation engine per card)",
        description="Run one libp2p node per card, each with its conversation engine, until Ctrl-C or "
        "SIGTERM; SIGUSR1 logs drop counters. With --ws, also serve clients (WebSocket, page, WebRTC).",
    )
    parser.add_argument(
        "cards",
        nargs="+",
        metavar="CARD",
        help="card files (YAML or TOML), or the name of a card shipped with companion (pim, ostra, juniper)",
    )
    add_multiaddr_argument(
        parser,
        "--listen",
        "listen address, e.g. /ip4/0.0.0.0/tcp/4001 (default: all interfaces, a free port); "
        "once for all cards (ports counted up) or once per card",
    )
    add_multiaddr_argument(
        parser,
        "--peer",
        "bootstrap peer, e.g. /ip4/192.168.1.20/tcp/4001/p2p/12D3KooW...; redialled when lost",
    )
    add_no_mdns_argument(parser)
    add_multiaddr_argument(
        parser,
        "--relay",
        "circuit relay (companion relay) to be reachable through from behind NAT, "
        "e.g. /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...; also a bootstrap peer",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=8,
        metavar="N",
        help="connections each node opens to peers it discovers (default 8); others may dial in",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where node keys, history and memory are kept (default: {default_data_dir()})",
    )
    models = parser.add_argument_group("models")
    models.add_argument(
        "--model",
        default=None,
        metavar="SPEC",
        help="model for every card: scripted (offline), openai:NAME, anthropic:NAME "
        "(default: each card's settings.model, else scripted)",
    )
    models.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (Ollama, vLLM...)")
    models.add_argument(
        "--seed", type=int, default=0, help="scripted model seed of the first card (the next get +1, +2...)"
    )
    models.add_argument(
        "--pace", type=float, default=0.0, metavar="SECONDS", help="pause before each reply (default 0)"
    )
    models.add_argument(
        "--no-pipeline",
        action="store_true",
        help="start the next turn only once a voiced line was heard, not while it is voiced",
    )
    clients = parser.add_argument_group("clients (the bridge inside this process)")
    clients.add_argument(
        "--ws",
        default=None,
        metavar="HOST:PORT",
        help="serve WebSocket clients, the page and WebRTC here (e.g. 127.0.0.1:8080; port 0 picks one)",
    )
    clients.add_argument(
        "--token",
        nargs="?",
        const="",
        default=None,
        metavar="TOKEN",
        help=f"require this shared token from clients; without a value, ${TOKEN_ENV} or a generated one",
    )
    clients.add_argument("--no-webrtc", action="store_true", help="do not accept WebRTC clients")
    clients.add_argument("--no-voice", action="store_true", help="WebRTC clients get no voice from here")
    add_trust_arguments(parser)
    add_metrics_argument(parser)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    add_log_level_arguments(parser, "WARNING", "every event (INFO: joins, turns, decisions)")
    parser.add_argument(
        "--stats-interval", type=float, default=None, metavar="SECONDS", help="log a stats event this often"
    )
    parser.set_defaults(func=main)


def _bridge_options(args: argparse.Namespace) -> BridgeOptions | None:
    """The client side of ``--ws`` (``None`` without it); raises ``ValueError`` for a bad address."""
    if args.ws is None:
        if args.token is not None or args.no_webrtc or args.no_voice:
            raise ValueError("--token, --no-webrtc and --no-voice need --ws")
        return None
    from companion.app.bridge import BridgeOptions  # the bridge's modules only with --ws (start-up)

    host, port = parse_ws_address(args.ws)
    return BridgeOptions(
        host=host,
        port=port,
        token=resolve_token(args.token),
        webrtc=not args.no_webrtc,
        voice=not args.no_voice,
    )


def main(args: argparse.Namespace) -> int:
    from companion.app.engines import EngineOptions
    from companion.app.logs import configure_node_logging
    from companion.app.run import RunOptions, run_nodes

    try:
        bridge = _bridge_options(args)
        trust = trust_options(args)
        metrics = metrics_address(args)
        if args.pace < 0:
            raise ValueError("--pace must not be negative")
        if args.max_connections < 1:
            raise ValueError("--max-connections must be at least 1")
    except ValueError as exc:
        print(f"companion run: {exc}", file=sys.stderr)
        return 2
    configure_node_logging(chosen_log_level(args), args.log_format)
    options = RunOptions(
        cards=[str(resolve_card(card)) for card in args.cards],
        listen=args.listen,
        peers=args.peer,
        mdns=not args.no_mdns,
        data_dir=args.data_dir or default_data_dir(),
        stats_interval=args.stats_interval,
        engine=EngineOptions(
            model=args.model,
            base_url=args.base_url,
            seed=args.seed,
            pace=args.pace,
            pipeline=not args.no_pipeline,
        ),
        bridge=bridge,
        relays=args.relay,
        max_connections=args.max_connections,
        trust=trust,
        metrics=metrics,
    )
    from companion.card.model import CardError
    from companion.models.errors import ModelSetupError

    # a refusal the user can fix (card, address, model, port) is one line and exit 2
    refusals = (CardError, ModelSetupError, ValueError, OSError)
    return command_status("run", partial(run_nodes, options), logger, refusals, said=_said_by_the_check)


def _said_by_the_check(exc: BaseException) -> bool:
    """A model that cannot work is said once, by the check's own line."""
    from companion.models.errors import ModelSetupError

    return isinstance(exc, ModelSetupError) and exc.reported


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.cli.run ...``: the same command without the other subcommands."""
    args = standalone_args("run", register, argv)
    try:
        return int(args.func(args))
    except BaseException as exc:  # Ctrl-C before the signal receiver is installed
        if is_interrupt(exc):
            return 130
        raise
    finally:
        collector.resume()


if __name__ == "__main__":
    collector.pause()  # the module's own imports above ran already; the rest is start-up still
    sys.exit(standalone())
