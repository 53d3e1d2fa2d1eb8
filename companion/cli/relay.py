"""``companion relay``: a public relay and bootstrap node for companions on other networks.

No companion runs here. Companions behind NAT reserve a slot on it (``companion run --relay
ADDR``) and are reached through it; DCUtR then tries to replace each relayed connection with a
direct one. Its DHT lets any companion that knows this one address find the others.

Standard output, as ``companion run`` prints it: ``relay peer <peer id>`` then one indented
address per line (give one of them to ``--relay`` and ``--peer``). Ctrl-C exits with status 130,
SIGTERM with 0, both after closing every connection; SIGUSR1 logs a ``stats`` event.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from ..log import configure_logging, log_event

if TYPE_CHECKING:
    from ..node.relay_node import RelayNode, RelayOptions

__all__ = ["RELAY_LINE", "register", "run_relay"]

logger = logging.getLogger("companion.cli.relay")

RELAY_LINE: Final = "relay peer "
DEFAULT_LISTEN: Final = "/ip4/0.0.0.0/tcp/4001"
KEY_NAME: Final = "relay.key"


class Interrupted(Exception):
    """SIGINT arrived: the relay stopped cleanly and the command exits with 130."""


async def run_relay(
    listen: Sequence[str],
    peers: Sequence[str],
    data_dir: Path | None,
    options: RelayOptions,
    *,
    ready: Callable[[RelayNode], None] | None = None,
) -> None:
    """Start the relay, print its peer id and addresses, serve until SIGINT (raises
    :class:`Interrupted`), SIGTERM or cancellation."""
    from ..node import NodeConfig
    from ..node.discovery import parse_peer_addr
    from ..node.relay_node import RelayNode
    from .run import dialable

    for addr in peers:
        parse_peer_addr(addr)
    config = NodeConfig(
        listen=tuple(listen) or (DEFAULT_LISTEN,),
        peers=tuple(peers),
        key_path=data_dir / "keys" / KEY_NAME if data_dir is not None else None,
        name="relay",
        max_connections=options.max_reservations * 2,
    )
    relay = RelayNode(config, options)
    interrupted = False
    # signals are caught from before the first line is printed: a SIGUSR1 right after it is stats
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            print(f"{RELAY_LINE}{relay.peer_id}", flush=True)
            for addr in relay.listen_addrs:
                for shown in dialable(addr):
                    print(f"  {shown}", flush=True)
            if ready is not None:
                ready(relay)
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    relay.log_stats()
                    continue
                log_event(logger, "stopping", signal=signal.Signals(signum).name)
                interrupted = signum == signal.SIGINT
                break
            nursery.cancel_scope.cancel()
    if interrupted:
        raise Interrupted


def register(subparsers: Any) -> None:
    from .run import default_data_dir

    parser = subparsers.add_parser(
        "relay",
        help="run a public relay and bootstrap node (no companion)",
        description="Run a circuit relay v2 node with an AutoNAT server and a DHT, for companions on "
        "other networks and behind NAT: give its address to companion run --relay (and --peer).",
    )
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help=f"listen address (default {DEFAULT_LISTEN}: open this TCP port in the firewall)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="another relay or bootstrap node to stay connected to (their DHTs meet)",
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
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import companion.node  # noqa: F401  (py-libp2p resets its loggers on import: import it first)

    from ..node.relay_node import RelayOptions
    from .run import default_data_dir

    if args.max_reservations < 1:
        print("companion relay: --max-reservations must be at least 1", file=sys.stderr)
        return 2
    configure_logging(args.log_level.upper(), args.log_format)
    options = RelayOptions(max_reservations=args.max_reservations)
    data_dir = args.data_dir or default_data_dir()
    try:
        trio.run(run_relay, args.listen, args.peer, data_dir, options)
    except (KeyboardInterrupt, Interrupted):
        return 130
    except BaseException as exc:
        return _report_failure(exc)
    return 0


def _report_failure(exc: BaseException) -> int:
    """An address or port the user can fix is one line and exit 2; anything else exit 1."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, Interrupted):
        return 130
    if isinstance(exc, ValueError | OSError):
        print(f"companion relay: {exc}", file=sys.stderr)
        return 2
    logger.exception("relay failed", extra={"companion_event": "relay_failed"})
    return 1


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.cli.relay ...``: the same command without the other subcommands."""
    parser = argparse.ArgumentParser(prog="companion")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["relay", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(standalone())
