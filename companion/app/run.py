"""What ``companion run CARD...`` starts: one libp2p node per card, each with its conversation engine.

Each node dials the one before (a chain: presence and the DHT introduce the rest). With
``options.bridge`` (``--ws``) the process also serves clients with the bridge of ``companion
bridge``, on a node of its own (:mod:`.clients`). Standard output follows :mod:`.lines`:
``<id> peer <peer id>`` with indented addresses, ``<id> sees ...`` whenever a node's directory
changes, and ``bridge ws://HOST:PORT/`` with the page and WebRTC URLs.
SIGINT or SIGTERM stops in order (:func:`.stopping.stop_in_order`: turns, clients, nodes, then
the files; a second signal stops at once); SIGUSR1 logs a ``stats`` event per node; SIGHUP
reads the cards' tools again (:func:`.actions.reload_tools`). With clients, ``POST
/actions/TOOL`` runs a companion's tool (:mod:`companion.bridge.actions`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from companion.app import collector
from companion.app.engines import (
    CompanionHandler,
    EngineOptions,
    HandlerFactory,
    PendingHandler,
    engine_handlers,
    prepare_models,
)
from companion.app.lines import announce_directory, peer_line, print_addresses
from companion.app.stopping import Interrupted, Stop, note_stopping, stop_in_order
from companion.app.trust import TrustOptions, open_trust
from companion.log import log_event

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from companion.actions import ActionRuntime
    from companion.app.bridge import BridgeOptions
    from companion.app.metrics import ProcessMetrics
    from companion.bridge import Bridge
    from companion.card.model import LoadedCard
    from companion.node import CompanionNode, InboundHandler
    from companion.ports import ConversationStore

__all__ = ["DIAL_HEAD_START", "RunOptions", "Running", "listen_addrs_for", "run_nodes"]

logger = logging.getLogger("companion.app.run")

DIAL_HEAD_START: Final = 0.5
"""Seconds the models and engines wait for the nodes' first connections before they are
prepared (start-up): preparing imports a few hundred milliseconds of modules, which would hold
up the handshakes of the first dials; a peer that is slow to answer delays them by this much."""


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
    metrics: tuple[str, int] | None = None
    """``--metrics HOST:PORT``: serve ``/metrics``, ``/healthz``, ``/readyz`` there (with
    ``--ws`` they are on the bridge's port too; :mod:`.metrics`)."""


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
    """Load every card, start a node for each card (each one also dials the one before) and,
    while the nodes dial their peers, prepare the models (unless ``handler_factory`` replaces
    the engines) and each node's engine; with ``options.bridge``, serve clients from the
    clients' node (:mod:`.clients`). Run until SIGINT (then raise
    :class:`~.stopping.Interrupted` once every node has stopped), SIGTERM or cancellation.
    Each handler publishes through its own node.

    Start-up order: a node runs with a :class:`~.engines.PendingHandler` (payloads wait for the
    engine), is not present to others (no announcement; metadata requests wait) and its
    ``<id> peer`` line is printed once its engine is ready, so the line still means "this
    companion answers", and no other node counts it as a leader before. A model that cannot
    work (:func:`~.engines.prepare_models`) stops every node and is raised here, as a bad card
    is (before any node starts)."""
    from companion.app.clients import let_clients_in, run_client_node
    from companion.app.datadir import hold_data_dirs
    from companion.card.model import load_card
    from companion.node import CompanionNode, NodeConfig
    from companion.node.discovery import parse_peer_addr

    for addr in (*options.peers, *options.relays):
        parse_peer_addr(addr)
    loaded = [load_card(path) for path in options.cards]
    ids = [card.card.metadata.id for card in loaded]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two cards share a companion id: {ids}")
    addrs = listen_addrs_for(options.listen, len(loaded))
    trust = open_trust(options.data_dir, options.trust)
    nodes: list[CompanionNode] = []
    runtimes: dict[str, ActionRuntime] = {}  # POST /actions/TOOL and SIGHUP reach these
    stores: dict[str, ConversationStore] = {}  # the bridge's /history reads these
    clients = None
    companions: list[CompanionHandler] = []  # what the stop in order stops, then closes
    clients_scope: trio.CancelScope | None = None
    stopped_by: list[int] = []
    metrics = _metrics(ids) if options.metrics is not None or options.bridge is not None else None
    # one process per companion, layouts migrated: before any node, until every store closed
    async with hold_data_dirs(options.data_dir, ids), trio.open_nursery() as nursery:

        def everyone() -> list[CompanionNode]:
            return [*nodes, *([clients.node] if clients is not None else [])]

        reload = partial(_reload_tools, loaded, runtimes)
        # served from the start: a SIGTERM while the models are checked closes the nodes cleanly
        stop = Stop(nursery.cancel_scope)
        await nursery.start(_serve_signals, everyone, stop, reload, stopped_by)
        if metrics is not None and options.metrics is not None:  # an address in use stops it now
            from companion.app.metrics_http import serve_metrics

            await nursery.start(serve_metrics, *options.metrics, metrics)
        if options.bridge is not None:
            from companion.app.actions import serve_actions
            from companion.app.views import serve_views

            clients = await nursery.start(run_client_node, options.bridge, nodes, trust)
            serve_actions(clients.bridge, runtimes)
            serve_views(clients.bridge, loaded, stores)
            if metrics is not None:
                metrics.serve_on(clients.bridge, clients.node)
        pending: list[tuple[LoadedCard, CompanionNode, PendingHandler, trio.Nursery]] = []
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
            # present to others only once its engine is ready (become_present below): a
            # companion seen before could be chosen to lead a turn it cannot lead yet
            node = CompanionNode(metadata, config, trust=trust, present=False)
            waiting = PendingHandler()
            node_nursery: trio.Nursery = await nursery.start(_run_one, node, waiting)
            nodes.append(node)
            if metrics is not None:
                metrics.nodes.append(node)
            pending.append((card, node, waiting, node_nursery))
        # the nodes dial now; the models and engines are prepared meanwhile, after a head start
        from companion.app.actions import runtime_of
        from companion.app.status import track_status
        from companion.app.views import store_of

        await _first_connections(nodes, DIAL_HEAD_START)
        if handler_factory is None:
            models = await prepare_models(loaded, options.engine)
            handler_factory = engine_handlers(models, data_dir=options.data_dir, metrics=metrics)
        for card, node, waiting, node_nursery in pending:
            handler = await handler_factory(card, node, node_nursery)
            runtime = runtime_of(handler)
            if runtime is not None:
                runtimes[card.card.metadata.id] = runtime
            if isinstance(handler, CompanionHandler):
                companions.append(handler)
            if (store := store_of(handler)) is not None:
                stores[card.card.metadata.id] = store
            waiting.become(handler)
            node.become_present()
            print(peer_line(node.name, node.peer_id), flush=True)
            print_addresses(node.listen_addrs)
            announce_directory(node)
            track_status(node, options.data_dir)  # read by companion status
        collector.resume()  # start-up is over (see collector): everything it needs is loaded
        running = Running(nodes)
        if clients is not None and options.bridge is not None:
            clients_scope = trio.CancelScope()  # stopped before the nodes
            serving = partial(let_clients_in, options.bridge, clients, set(ids))
            port = await nursery.start(_within, clients_scope, serving)
            running = Running(nodes, clients.bridge, clients.node, port)
        if ready is not None:
            ready(running)
        await stop.wait()  # the first SIGINT or SIGTERM (before, it cancels the nursery)
        written = clients.bridge.written if clients is not None else None
        await stop_in_order(companions, everyone(), clients=clients_scope, written=written)
        nursery.cancel_scope.cancel()
    if stopped_by[:1] == [signal.SIGINT]:
        raise Interrupted


async def _within(
    scope: trio.CancelScope,
    run: Callable[..., Awaitable[None]],
    *,
    task_status: TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``run`` (started with what it reports) inside ``scope``, which the caller cancels on
    its own: the clients stop before the nodes."""
    with scope:
        await run(task_status=task_status)


def _metrics(companions: Sequence[str]) -> ProcessMetrics:
    """The process's metrics, ``/readyz`` waiting for these companions' engines (made only
    when something serves them: prometheus_client is not imported before the first dial
    otherwise)."""
    from companion.app.metrics import ProcessMetrics

    metrics = ProcessMetrics()
    metrics.expect(companions)
    return metrics


async def _first_connections(nodes: Sequence[CompanionNode], timeout: float) -> None:
    """Return once every node that has peers to dial is connected to one, or after ``timeout``."""
    with trio.move_on_after(timeout):
        for node in nodes:
            if node.config.peers or node.config.relays:
                await node.wait_for(partial(_connected, node), timeout)


def _connected(node: CompanionNode) -> bool:
    return bool(node.connected_peers)


async def _run_one(
    node: CompanionNode,
    handler: InboundHandler,
    *,
    task_status: TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``node`` in a nursery of its own, handed back once the node listens: its engine's
    tasks run there (started later, see :func:`run_nodes`) and stop with it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, handler)
        task_status.started(nursery)


def _reload_tools(cards: Sequence[LoadedCard], runtimes: Mapping[str, ActionRuntime]) -> None:
    """:func:`.actions.reload_tools`, imported on the first SIGHUP, not before the first dial."""
    from companion.app.actions import reload_tools

    reload_tools(cards, runtimes)


async def _serve_signals(
    nodes: Callable[[], Sequence[CompanionNode]],
    stop: Stop,
    reload: Callable[[], None],
    stopped_by: list[int],
    *,
    task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve SIGHUP (reload tools) and SIGUSR1 (stats of ``nodes()``). The first SIGINT or
    SIGTERM is noted in ``stopped_by`` and asks for the stop (:class:`~.stopping.Stop`); a
    second one ends the command at once, with 128 + its number."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                reload()
                continue
            if signum == signal.SIGUSR1:
                for node in nodes():
                    node.log_stats()
                continue
            stopped_by.append(signum)
            if len(stopped_by) == 1:
                note_stopping(logger, signum)
                stop.request()
                continue
            log_event(logger, "stopping_at_once", logging.WARNING, signal=signal.Signals(signum).name)
            stop.everything.cancel()
            raise Interrupted(128 + signum)
