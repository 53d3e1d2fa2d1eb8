"""What ``companion run CARD...`` starts: one libp2p node per card, each with its conversation engine.

Each node dials the one before (a chain: presence and the DHT introduce the rest). With
``options.bridge`` (``--ws``) the process also serves clients with the bridge of ``companion
bridge``, on a node of its own (:mod:`.clients`). Standard output follows :mod:`.lines`:
``<id> peer <peer id>`` with indented addresses, ``<id> sees ...`` whenever a node's directory
changes, and ``bridge ws://HOST:PORT/`` with the page and WebRTC URLs.
SIGINT or SIGTERM closes every host cleanly; SIGUSR1 logs a ``stats`` event per node; SIGHUP
reads the cards' tools again (:func:`.actions.reload_tools`). With clients, ``POST
/actions/TOOL`` runs a companion's tool (:mod:`companion.bridge.actions`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..log import log_event
from .actions import reload_tools, runtime_of, serve_actions
from .engines import EngineOptions, HandlerFactory, engine_handlers, prepare_models
from .lines import announce_directory, peer_line, print_addresses
from .stopping import Interrupted
from .trust import TrustOptions, open_trust

if TYPE_CHECKING:
    from ..actions import ActionRuntime
    from ..bridge import Bridge
    from ..card import LoadedCard
    from ..node import CompanionNode
    from .bridge import BridgeOptions

__all__ = ["RunOptions", "Running", "listen_addrs_for", "run_nodes"]

logger = logging.getLogger("companion.app.run")


@dataclass(frozen=True)
class RunOptions:
    cards: Sequence[str]
    listen: Sequence[str]
    peers: Sequence[str]
    mdns: bool
    data_dir: Path
    stats_interval: float | None
    engine: EngineOptions = field(default_factory=EngineOptions)
    bridge: BridgeOptions | None = None
    """Serve clients from this process (``--ws``); host, port and client options only."""
    relays: Sequence[str] = ()
    """Circuit relays (``--relay``): reachable through them from behind NAT (NodeConfig.relays)."""
    max_connections: int = 8
    """Connections each node opens itself (``--max-connections``, NodeConfig.max_connections)."""
    trust: TrustOptions = field(default_factory=TrustOptions)
    """``--trust``, ``--approver``, ``--answerer``; with the data directory's trust file."""


@dataclass(frozen=True)
class Running:
    """What :func:`run_nodes` started, handed to its ``ready`` callback."""

    nodes: list[CompanionNode]
    """The companions' nodes, in card order."""
    bridge: Bridge | None = None
    client_node: CompanionNode | None = None
    """The node the bridge publishes through (not a companion)."""
    ws_port: int | None = None


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
    handler_factory: HandlerFactory | None = None,
    ready: Callable[[Running], None] | None = None,
) -> None:
    """Load every card, prepare the models (unless ``handler_factory`` replaces the engines),
    start a node for each card (each one also dials the one before) and, with
    ``options.bridge``, serve clients from the clients' node (:mod:`.clients`); run until SIGINT
    (then raise :class:`~.stopping.Interrupted` once every node has stopped), SIGTERM or
    cancellation. Each handler publishes through its own node."""
    from ..card import load_card
    from ..node import CompanionNode, NodeConfig
    from ..node.discovery import parse_peer_addr
    from .clients import open_to_clients, start_client_node

    for addr in (*options.peers, *options.relays):
        parse_peer_addr(addr)
    loaded = [load_card(path) for path in options.cards]
    ids = [card.card.metadata.id for card in loaded]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two cards share a companion id: {ids}")
    addrs = listen_addrs_for(options.listen, len(loaded))
    trust = open_trust(options.data_dir, options.trust)
    models = await prepare_models(loaded, options.engine) if handler_factory is None else {}
    nodes: list[CompanionNode] = []
    async with trio.open_nursery() as nursery:
        clients = None
        if options.bridge is not None:
            clients = await start_client_node(options.bridge, nodes, nursery, trust)
        runtimes: dict[str, ActionRuntime] = {}  # POST /actions/TOOL reaches these
        if clients is not None:
            serve_actions(clients.bridge, runtimes)
        if handler_factory is None:
            handler_factory = engine_handlers(models, data_dir=options.data_dir)
        for card, listen in zip(loaded, addrs, strict=True):
            metadata = card.card.metadata
            # the card before (a bootstrap peer, so protected from trimming): a chain, not a
            # protected full mesh; presence and the DHT introduce the rest
            local = [a for node in nodes[-1:] for a in node.listen_addrs[:1]]
            extra = [clients.address] if clients is not None else []
            config = NodeConfig(
                listen=(listen,),
                peers=(*options.peers, *local, *extra),
                mdns=options.mdns,
                key_path=options.data_dir / "keys" / f"{metadata.id}.key",
                replay_path=options.data_dir / "replay" / f"{metadata.id}.ids",
                name=metadata.id,
                stats_interval=options.stats_interval,
                relays=tuple(options.relays),
                max_connections=options.max_connections,
            )
            node = CompanionNode(metadata, config, trust=trust)
            run_one = partial(_run_one, runtimes=runtimes)
            await nursery.start(run_one, card, node, handler_factory)
            nodes.append(node)
            print(peer_line(metadata.id, node.peer_id), flush=True)
            print_addresses(node.listen_addrs)
            announce_directory(node)
        running = Running(nodes)
        if clients is not None and options.bridge is not None:
            port = await open_to_clients(options.bridge, clients, set(ids), nursery)
            running = Running(nodes, clients.bridge, clients.node, port)
        if ready is not None:
            ready(running)
        everyone = [*nodes, *([running.client_node] if running.client_node else [])]
        reload = partial(reload_tools, loaded, runtimes)
        stopped_by = await _serve_signals(everyone, nursery.cancel_scope, reload)
    if stopped_by == signal.SIGINT:
        raise Interrupted


async def _run_one(
    card: LoadedCard,
    node: CompanionNode,
    handler_factory: HandlerFactory,
    *,
    runtimes: dict[str, ActionRuntime],
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        handler = handler_factory(card, node, nursery)
        runtime = runtime_of(handler)
        if runtime is not None:
            runtimes[card.card.metadata.id] = runtime
        await nursery.start(node.run, handler)
        task_status.started()


async def _serve_signals(
    nodes: Sequence[CompanionNode], scope: trio.CancelScope, reload: Callable[[], None]
) -> int:
    """Serve SIGHUP (reload tools) and SIGUSR1 (stats) until SIGINT or SIGTERM, then cancel
    ``scope``; the signal that stopped."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                reload()
                continue
            if signum == signal.SIGUSR1:
                for node in nodes:
                    node.log_stats()
                continue
            log_event(logger, "stopping", signal=signal.Signals(signum).name)
            scope.cancel()
            return signum
    raise AssertionError("unreachable: the signal receiver never ends")
