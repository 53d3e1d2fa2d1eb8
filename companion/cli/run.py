"""``companion run CARD...``: start one libp2p node per card and keep them running.

Each node prints its peer id and addresses, joins the network (``--peer`` bootstrap addresses,
mDNS unless ``--no-mdns``), and hands every payload that passed its edge to a handler made by
:func:`make_handler`. Ctrl-C or SIGTERM closes every host cleanly; SIGUSR1 logs a ``stats``
event per node (drops by reason, payloads accepted and delivered).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..log import configure_logging, log_event
from ..protocol import Action, Message, Query, QueryResult
from ..transport import Inbound

if TYPE_CHECKING:
    from ..card import LoadedCard
    from ..node import CompanionNode, InboundHandler

__all__ = ["HandlerFactory", "LoggingHandler", "default_data_dir", "make_handler", "register", "run_nodes"]

logger = logging.getLogger("companion.cli.run")

HandlerFactory = Callable[["LoadedCard", "CompanionNode", trio.Nursery], "InboundHandler"]
"""``(card, node, nursery) -> handler``: the nursery lives as long as the node runs."""


class LoggingHandler:
    """Logs each received payload as an ``inbound`` event (until the engine takes over)."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    async def handle(self, inbound: Inbound) -> None:
        log_event(logger, "inbound", node=self.node_name, **summarize(inbound))


def summarize(inbound: Inbound) -> dict[str, Any]:
    """The fields of a payload worth a log line (ids, senders, a text excerpt)."""
    payload = inbound.payload
    out: dict[str, Any] = {"topic": inbound.topic, "peer": inbound.sender_peer}
    if isinstance(payload, list):
        out["states"] = [
            {"from": s.params.from_, "state": s.params.state, "selected": s.params.selected} for s in payload
        ]
    elif isinstance(payload, Message):
        p = payload.params
        out.update(method=payload.method, id=p.id, sender=p.from_, to=p.to, text=p.message[:200])
    elif isinstance(payload, Query):
        out.update(
            method=payload.method, id=payload.id, sender=payload.params.from_, type=payload.params.type
        )
    elif isinstance(payload, QueryResult):
        out.update(id=payload.id, ok=payload.error is None)
    elif isinstance(payload, Action):
        out.update(method=payload.method, sender=payload.params.from_, name=payload.params.name)
    return out


def make_handler(loaded: LoadedCard, node: CompanionNode, nursery: trio.Nursery) -> InboundHandler:
    """The handler a card's node feeds. Plug the conversation engine in here."""
    return LoggingHandler(node.name)


def dialable(addr: str) -> list[str]:
    """A wildcard listen address spelled out with this machine's IPv4 addresses (for ``--peer``)."""
    if "/ip4/0.0.0.0/" not in addr:
        return [addr]
    try:
        import ifaddr  # zeroconf's dependency, so present wherever py-libp2p is

        ips = [
            str(ip.ip)
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
            if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
        ]
    except Exception:
        ips = []
    return [addr.replace("/ip4/0.0.0.0/", f"/ip4/{ip}/") for ip in ips] or [addr]


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "companion"


@dataclass(frozen=True)
class RunOptions:
    cards: Sequence[str]
    listen: Sequence[str]
    peers: Sequence[str]
    mdns: bool
    data_dir: Path
    stats_interval: float | None


def listen_addrs_for(listen: Sequence[str], count: int) -> list[str]:
    """One listen address per card: given per card, or one shared with ports counted up from it."""
    if not listen:
        listen = ["/ip4/0.0.0.0/tcp/0"]
    if len(listen) == count:
        return list(listen)
    if len(listen) != 1:
        raise ValueError(f"give one --listen for all cards or one per card ({count}), not {len(listen)}")
    parts = listen[0].split("/")
    if "tcp" not in parts:
        raise ValueError(f"--listen {listen[0]!r} is not a TCP multiaddr")
    at = parts.index("tcp") + 1
    port = int(parts[at])
    out = []
    for i in range(count):
        parts[at] = str(port + i if port else 0)
        out.append("/".join(parts))
    return out


async def run_nodes(
    options: RunOptions,
    *,
    handler_factory: HandlerFactory = make_handler,
    ready: Callable[[list[CompanionNode]], None] | None = None,
) -> None:
    """Load every card, start a node for each (later ones also dial the earlier ones), run until
    SIGINT/SIGTERM or cancellation."""
    from ..card import load_card
    from ..node import CompanionNode, NodeConfig
    from ..node.discovery import parse_peer_addr

    for addr in options.peers:
        parse_peer_addr(addr)
    loaded = [load_card(path) for path in options.cards]
    ids = [card.card.metadata.id for card in loaded]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two cards share a companion id: {ids}")
    addrs = listen_addrs_for(options.listen, len(loaded))
    nodes: list[CompanionNode] = []
    async with trio.open_nursery() as nursery:
        for card, listen in zip(loaded, addrs, strict=True):
            metadata = card.card.metadata
            local = [a for node in nodes for a in node.listen_addrs[:1]]
            config = NodeConfig(
                listen=(listen,),
                peers=(*options.peers, *local),
                mdns=options.mdns,
                key_path=options.data_dir / "keys" / f"{metadata.id}.key",
                name=metadata.id,
                stats_interval=options.stats_interval,
            )
            node = CompanionNode(metadata, config)
            await nursery.start(_run_one, card, node, handler_factory)
            nodes.append(node)
            print(f"{metadata.id} peer {node.peer_id}", flush=True)
            for addr in node.listen_addrs:
                for shown in dialable(addr):
                    print(f"  {shown}", flush=True)
        if ready is not None:
            ready(nodes)
        await _serve_signals(nodes, nursery.cancel_scope)


async def _run_one(
    card: LoadedCard,
    node: CompanionNode,
    handler_factory: HandlerFactory,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        handler = handler_factory(card, node, nursery)
        await nursery.start(node.run, handler)
        task_status.started()


async def _serve_signals(nodes: Sequence[CompanionNode], scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                for node in nodes:
                    node.log_stats()
                continue
            log_event(logger, "stopping", signal=signal.Signals(signum).name)
            scope.cancel()
            return


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run companions (one libp2p node per card)",
        description="Run one libp2p node per card until Ctrl-C or SIGTERM; SIGUSR1 logs drop counters.",
    )
    parser.add_argument("cards", nargs="+", metavar="CARD", help="card files (YAML or TOML)")
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="listen address, e.g. /ip4/0.0.0.0/tcp/4001 (default: all interfaces, a free port); "
        "once for all cards (ports counted up) or once per card",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="bootstrap peer, e.g. /ip4/192.168.1.20/tcp/4001/p2p/12D3KooW...; redialled when lost",
    )
    parser.add_argument("--no-mdns", action="store_true", help="do not discover peers on the LAN")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where node keys are kept (default: {default_data_dir()})",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--stats-interval", type=float, default=None, metavar="SECONDS", help="log a stats event this often"
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import companion.node  # noqa: F401  (py-libp2p resets its loggers on import: import it first)

    configure_logging(args.log_level.upper(), args.log_format)
    options = RunOptions(
        cards=args.cards,
        listen=args.listen,
        peers=args.peer,
        mdns=not args.no_mdns,
        data_dir=args.data_dir or default_data_dir(),
        stats_interval=args.stats_interval,
    )
    try:
        trio.run(run_nodes, options)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _report_failure(exc)
    return 0


def _report_failure(exc: BaseException) -> int:
    from ..card import CardError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, CardError | ValueError):
        print(f"companion run: {exc}", file=sys.stderr)
        return 2
    logger.exception("run failed", extra={"companion_event": "run_failed"})
    return 1


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.cli.run ...``: the same command without the other subcommands."""
    parser = argparse.ArgumentParser(prog="companion")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(standalone())
