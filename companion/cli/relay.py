"""``companion relay``: a public relay and bootstrap node for companions on other networks.

No companion runs here. Companions behind NAT reserve a slot on it (``companion run --relay
ADDR``) and are reached through it; DCUtR then tries to replace each relayed connection with a
direct one. Its DHT lets any companion that knows this one address find the others (the wiring
is :mod:`companion.app.relay`; this module parses the arguments).

Standard output, as ``companion run`` prints it: ``relay peer <peer id>`` then one indented
address per line (give one of them to ``--relay`` and ``--peer``). Ctrl-C exits with status 130,
SIGTERM with 0, both after closing every connection; SIGUSR1 logs a ``stats`` event.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from companion.app.logs import configure_node_logging
from companion.app.paths import default_data_dir
from companion.app.relay import DEFAULT_LISTEN, KEY_NAME, relay_options, run_relay
from companion.cli.exits import command_status
from companion.cli.options import (
    add_log_level_arguments,
    add_metrics_argument,
    add_multiaddr_argument,
    chosen_log_level,
    metrics_address,
    standalone_args,
)

__all__ = ["register"]

logger = logging.getLogger("companion.cli.relay")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "relay",
        help="run a public relay and bootstrap node (no companion)",
        description="Run a circuit relay v2 node with an AutoNAT server and a DHT, for companions on "
        "other networks and behind NAT: give its address to companion run --relay (and --peer).",
    )
    add_multiaddr_argument(
        parser, "--listen", f"listen address (default {DEFAULT_LISTEN}: open this TCP port in the firewall)"
    )
    add_multiaddr_argument(
        parser, "--peer", "another relay or bootstrap node to stay connected to (their DHTs meet)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where the relay's key is kept, so its peer id survives restarts "
        f"(default: {default_data_dir()}/keys/{KEY_NAME})",
    )
    parser.add_argument(
        "--max-reservations",
        type=int,
        default=128,
        metavar="N",
        help="companions that may be reachable through this relay at once (default 128)",
    )
    add_metrics_argument(parser)
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    add_log_level_arguments(parser, "INFO", "DEBUG: every reservation and relayed stream")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.max_reservations < 1:
        print("companion relay: --max-reservations must be at least 1", file=sys.stderr)
        return 2
    try:
        metrics = metrics_address(args)
    except ValueError as exc:
        print(f"companion relay: {exc}", file=sys.stderr)
        return 2
    configure_node_logging(chosen_log_level(args), args.log_format)
    options = relay_options(args.max_reservations)
    data_dir = args.data_dir or default_data_dir()
    run = partial(run_relay, args.listen, args.peer, data_dir, options, metrics=metrics)
    return command_status("relay", run, logger)  # an address or port to fix: one line, exit 2


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.cli.relay ...``: the same command without the other subcommands."""
    args = standalone_args("relay", register, argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(standalone())
