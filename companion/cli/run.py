"""``companion run CARD...``: one libp2p node per card, each with its conversation engine.

Each card's model is ``--model`` (for every card), else the card's ``settings.model``, else the
offline scripted model; every distinct model is built and checked before any node starts, so a
missing key or an endpoint that is down is an error now (exit 2), not mid-conversation. History
and working memory live in ``--data-dir/<companion id>/``.

With ``--ws HOST:PORT`` the process also serves clients with the bridge of ``companion bridge``
(WebSocket, the page, WebRTC). Clients see the conversation as the first card's companion sees
it: that node's handler hands every payload to them, and its engine publishes through the
bridge, so they get its payloads as they go out. What clients send goes out through one more
node in this process that is not a companion (a companion's node may publish only as that
companion; clients speak as ``user_...``); the companions here dial it. The page lists every
companion they see.

Standard output is for people and scripts alike, one fact a line: ``<id> peer <peer id>``
followed by indented addresses, ``<id> sees <id>,<id>...`` whenever a node's directory changes,
and ``bridge ws://HOST:PORT/`` followed by the page and WebRTC URLs. Ctrl-C or SIGTERM closes
every host cleanly; SIGUSR1 logs a ``stats`` event per node.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from ..log import configure_logging, log_event
from ..protocol import Action, Envelope, Message, Metadata, Query, QueryResult, State
from ..transport import Inbound, Publisher
from .trust import TrustOptions, add_trust_arguments, open_trust, trust_options

if TYPE_CHECKING:
    from ..bridge import Bridge
    from ..card import LoadedCard
    from ..engine import ConversationEngine, EngineTimings, NodeLike
    from ..models.base import CompanionModel
    from ..node import CompanionNode, InboundHandler
    from ..trust import TrustStore
    from .bridge import BridgeOptions

__all__ = [
    "CardModel",
    "CompanionHandler",
    "EngineOptions",
    "HandlerFactory",
    "LoggingHandler",
    "RunOptions",
    "Running",
    "default_data_dir",
    "engine_handlers",
    "model_spec",
    "parse_sees",
    "prepare_models",
    "register",
    "run_nodes",
    "sees_line",
]

logger = logging.getLogger("companion.cli.run")

HandlerFactory = Callable[["LoadedCard", "CompanionNode", trio.Nursery], "InboundHandler"]
"""``(card, node, nursery) -> handler``: the nursery lives as long as the node runs."""

BRIDGE_LINE: Final = "bridge "
"""Standard output: ``bridge ws://HOST:PORT/`` once clients can connect."""
CLIENT_NODE_TIMEOUT: Final = 10.0
"""How long the clients' node may take to meet this process's companions before clients are
let in anyway (with a warning)."""
_SEES: Final = " sees "


# --- standard output ------------------------------------------------------------------------------


def sees_line(companion_id: str, ids: Iterable[str]) -> str:
    """``<id> sees <id>,<id>``: the companions a node's directory holds (itself included)."""
    return f"{companion_id}{_SEES}{','.join(sorted(ids))}"


def parse_sees(line: str) -> tuple[str, frozenset[str]] | None:
    """The ``(companion id, directory)`` of a :func:`sees_line`, else ``None``."""
    cid, sep, rest = line.strip().partition(_SEES)
    if not sep or not cid.startswith("companion_") or " " in cid:
        return None
    return cid, frozenset(filter(None, rest.split(",")))


def dialable(addr: str) -> list[str]:
    """A wildcard listen address spelled out with this machine's IPv4 addresses (for ``--peer``)."""
    from ..node.addresses import expand_wildcard

    return expand_wildcard(addr, loopback=False)


def _announce_directory(node: CompanionNode) -> None:
    """Print a :func:`sees_line` now and whenever the node's set of companions changes."""
    shown: set[str] | None = None

    def report(_event: object = None) -> None:
        nonlocal shown
        now = set(node.directory)
        if now != shown:
            shown = now
            try:
                print(sees_line(node.name, now), flush=True)
            except OSError as exc:  # nobody reads stdout any more: the node keeps running
                log_event(logger, "stdout_closed", logging.WARNING, node=node.name, error=repr(exc))

    node.add_membership_listener(report)
    report()


# --- handlers ---------------------------------------------------------------------------------------


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


class LoggingHandler:
    """Logs each received payload as an ``inbound`` event."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    async def handle(self, inbound: Inbound) -> None:
        log_event(logger, "inbound", node=self.node_name, **summarize(inbound))


class CompanionHandler:
    """What a companion's node feeds: an ``inbound`` log line, then the conversation engine."""

    def __init__(self, node_name: str, engine: ConversationEngine) -> None:
        self.log = LoggingHandler(node_name)
        self.engine = engine

    async def handle(self, inbound: Inbound) -> None:
        await self.log.handle(inbound)
        await self.engine.handle(inbound)


# --- models -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineOptions:
    """How the engines of ``companion run`` get their models."""

    model: str | None = None
    """A model spec for every card; ``None``: each card's ``settings.model``, else scripted."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint for ``openai:NAME`` models."""
    seed: int = 0
    """The scripted model's seed for the first card; the card at index ``i`` gets ``seed + i``."""
    pace: float = 0.0
    """Seconds a speaker pauses before replying (so a person can follow)."""
    check_timeout: float = 10.0
    """Deadline of each provider model's start-up check."""


@dataclass(frozen=True)
class CardModel:
    """The model one card's engine runs with, and the engine's deadlines for it."""

    spec: str
    model: CompanionModel
    timings: EngineTimings


def model_spec(loaded: LoadedCard, override: str | None) -> str:
    """``--model``, else the card's ``settings.model``, else the scripted model."""
    from ..models.factory import DEFAULT_MODEL_SPEC

    return override or loaded.card.settings.model or DEFAULT_MODEL_SPEC


def _offline(spec: str) -> bool:
    return spec.strip().partition(":")[0] == "scripted"


async def prepare_models(cards: Sequence[LoadedCard], options: EngineOptions) -> dict[str, CardModel]:
    """A model per card (by companion id). Each distinct model is built once and checked once;
    raises :class:`~companion.models.errors.ModelSetupError` when one cannot work. Scripted
    models get their own seed per card; provider models with the same spec are shared."""
    from ..engine import EngineTimings
    from ..models.factory import check_model, make_model

    built: dict[tuple[str, int | None], CompanionModel] = {}
    out: dict[str, CardModel] = {}
    for index, loaded in enumerate(cards):
        spec = model_spec(loaded, options.model)
        offline = _offline(spec)
        seed = options.seed + index
        key = (spec, seed if offline else None)
        model = built.get(key)
        if model is None:
            model = make_model(spec, base_url=None if offline else options.base_url, seed=seed)
            await check_model(model, timeout=options.check_timeout)
            built[key] = model
        timings = EngineTimings.offline(options.pace) if offline else EngineTimings(pace=options.pace)
        cid = loaded.card.metadata.id
        out[cid] = CardModel(spec, model, timings)
        log_event(logger, "model_ready", companion=cid, spec=spec, model=model.name)
    return out


def engine_handlers(
    models: Mapping[str, CardModel],
    *,
    data_dir: Path | None,
    bridges: Mapping[str, Bridge] | None = None,
) -> HandlerFactory:
    """The handler factory of ``companion run``: a :class:`CompanionHandler` with a conversation
    engine per card (its model from ``models``, its history and memory under
    ``data_dir/<companion id>/``, in memory when ``None``). The engine of a companion id in
    ``bridges`` publishes through that bridge, so its clients see what it says."""
    from ..engine import engine_handler_factory

    carried = bridges or {}

    def make(loaded: LoadedCard, node: CompanionNode, nursery: trio.Nursery) -> CompanionHandler:
        cid = loaded.card.metadata.id
        chosen = models[cid]
        factory = engine_handler_factory(
            lambda _card: chosen.model, data_dir=data_dir, timings=chosen.timings
        )
        bridge = carried.get(cid)
        seen_as: NodeLike = node if bridge is None else _BridgedNode(node, bridge.publisher(node))
        return CompanionHandler(node.name, factory(loaded, seen_as, nursery))

    return make


class _BridgedNode:
    """A node as its engine sees it when the node carries the bridge: it publishes through the
    bridge, so local clients get the engine's payloads as they are published."""

    def __init__(self, node: CompanionNode, publisher: Publisher) -> None:
        self.membership = node.membership
        self._node = node
        self._publisher = publisher

    @property
    def directory(self) -> Mapping[str, Metadata]:
        return self._node.directory

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        await self._publisher.publish(topic, envelope)


# --- running nodes ------------------------------------------------------------------------------------


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
    ``options.bridge``, serve clients; run until SIGINT/SIGTERM or cancellation.

    With clients, the first card's node carries the bridge: its handler hands every payload to
    the clients, and its handler must publish through ``running.bridge.publisher(node)`` (the
    engines do), since the clients are not given what that node signed itself."""
    from ..card import load_card
    from ..node import CompanionNode, NodeConfig
    from ..node.discovery import parse_peer_addr

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
            clients = await _start_client_node(options.bridge, nodes, nursery, trust)
        bridges = {ids[0]: clients.bridge} if clients is not None else {}
        if handler_factory is None:
            handler_factory = engine_handlers(models, data_dir=options.data_dir, bridges=bridges)
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
                name=metadata.id,
                stats_interval=options.stats_interval,
                relays=tuple(options.relays),
                max_connections=options.max_connections,
            )
            node = CompanionNode(metadata, config, trust=trust)
            await nursery.start(_run_one, card, node, handler_factory, bridges.get(metadata.id))
            nodes.append(node)
            print(f"{metadata.id} peer {node.peer_id}", flush=True)
            for addr in node.listen_addrs:
                for shown in dialable(addr):
                    print(f"  {shown}", flush=True)
            _announce_directory(node)
        running = Running(nodes)
        if clients is not None and options.bridge is not None:
            port = await _serve_clients(options.bridge, clients, set(ids), nursery)
            running = Running(nodes, clients.bridge, clients.node, port)
        if ready is not None:
            ready(running)
        everyone = [*nodes, *([running.client_node] if running.client_node else [])]
        await _serve_signals(everyone, nursery.cancel_scope)


async def _run_one(
    card: LoadedCard,
    node: CompanionNode,
    handler_factory: HandlerFactory,
    bridge: Bridge | None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        handler = handler_factory(card, node, nursery)
        if bridge is not None:
            handler = _Delivering(bridge, handler, own_peer=node.peer_id)
        await nursery.start(node.run, handler)
        task_status.started()


# --- clients (``--ws``) ---------------------------------------------------------------------------


class _Delivering:
    """The handler of the node that carries the bridge: clients get every payload first (they
    see a message before anything the engine says about it), except the node's own, which they
    got when it was published (``bridge.publisher``)."""

    def __init__(self, bridge: Bridge, inner: InboundHandler, *, own_peer: str) -> None:
        self.bridge = bridge
        self.inner = inner
        self.own_peer = own_peer

    async def handle(self, inbound: Inbound) -> None:
        if inbound.sender_peer != self.own_peer:
            self.bridge.deliver(inbound)
        await self.inner.handle(inbound)


class _Ignoring:
    """The clients' node hands nothing to anyone: clients are served from a companion's view."""

    async def handle(self, inbound: Inbound) -> None:
        return None


class _Directories(Mapping[str, Metadata]):
    """Every companion the given nodes see (live: read on each access)."""

    def __init__(self, nodes: Sequence[CompanionNode]) -> None:
        self._nodes = nodes

    def __getitem__(self, key: str) -> Metadata:
        for node in self._nodes:
            found = node.directory.get(key)
            if found is not None:
                return found
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(cid for node in self._nodes for cid in node.directory))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class _ClientNode:
    node: CompanionNode
    bridge: Bridge
    address: str


async def _start_client_node(
    options: BridgeOptions, nodes: list[CompanionNode], nursery: trio.Nursery, trust: TrustStore
) -> _ClientNode:
    """The node clients publish through: not a companion (a companion's node may publish only as
    that companion, clients speak as ``user_...``). The companions dial it; the bridge lists
    every companion they see (``nodes`` fills up as they start). Its clients are this run's
    approvers: the companions accept their answers and approvals."""
    from ..node import CompanionNode, NodeConfig
    from .bridge import make_bridge

    node = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="clients"), trust=trust)
    trust.allow(node.peer_id, "approver")
    bridge = make_bridge(options, node, _Directories(nodes))
    await nursery.start(node.run, _Ignoring())
    return _ClientNode(node, bridge, node.listen_addrs[0])


async def _serve_clients(
    options: BridgeOptions, clients: _ClientNode, local: set[str], nursery: trio.Nursery
) -> int:
    """Let clients in once the clients' node has met this process's companions (``local``), or
    after :data:`CLIENT_NODE_TIMEOUT` with a warning; prints the ``bridge ws://...`` line."""
    from .bridge import client_urls, serve_clients

    node = clients.node
    if not await node.wait_for(lambda: local <= set(node.directory), CLIENT_NODE_TIMEOUT):
        log_event(
            logger,
            "clients_node_not_connected",
            logging.WARNING,
            missing=sorted(local - set(node.directory)),
            timeout=CLIENT_NODE_TIMEOUT,
        )
    publisher = clients.bridge.publisher(node)
    port: int = await nursery.start(serve_clients, options, clients.bridge, publisher)
    ws, *others = client_urls(options, port)
    print(f"{BRIDGE_LINE}{ws}", flush=True)
    for url in others:
        print(f"  {url}", flush=True)
    return port


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


# --- the command ----------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    from .bridge import TOKEN_ENV

    parser = subparsers.add_parser(
        "run",
        help="run companions (one libp2p node and conversation engine per card)",
        description="Run one libp2p node per card, each with its conversation engine, until Ctrl-C or "
        "SIGTERM; SIGUSR1 logs drop counters. With --ws, also serve clients (WebSocket, page, WebRTC).",
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
        "--relay",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="circuit relay (companion relay) to be reachable through from behind NAT, "
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
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--stats-interval", type=float, default=None, metavar="SECONDS", help="log a stats event this often"
    )
    parser.set_defaults(func=main)


def _bridge_options(args: argparse.Namespace) -> BridgeOptions | None:
    """The client side of ``--ws`` (``None`` without it); raises ``ValueError`` for a bad address."""
    from .bridge import BridgeOptions, parse_ws_address, resolve_token

    if args.ws is None:
        if args.token is not None or args.no_webrtc or args.no_voice:
            raise ValueError("--token, --no-webrtc and --no-voice need --ws")
        return None
    host, port = parse_ws_address(args.ws)
    return BridgeOptions(
        host=host,
        port=port,
        token=resolve_token(args.token),
        webrtc=not args.no_webrtc,
        voice=not args.no_voice,
    )


def main(args: argparse.Namespace) -> int:
    import companion.node  # noqa: F401  (py-libp2p resets its loggers on import: import it first)

    try:
        bridge = _bridge_options(args)
        trust = trust_options(args)
        if args.pace < 0:
            raise ValueError("--pace must not be negative")
        if args.max_connections < 1:
            raise ValueError("--max-connections must be at least 1")
    except ValueError as exc:
        print(f"companion run: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level.upper(), args.log_format)
    options = RunOptions(
        cards=args.cards,
        listen=args.listen,
        peers=args.peer,
        mdns=not args.no_mdns,
        data_dir=args.data_dir or default_data_dir(),
        stats_interval=args.stats_interval,
        engine=EngineOptions(model=args.model, base_url=args.base_url, seed=args.seed, pace=args.pace),
        bridge=bridge,
        relays=args.relay,
        max_connections=args.max_connections,
        trust=trust,
    )
    try:
        trio.run(run_nodes, options)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _report_failure(exc)
    return 0


def _report_failure(exc: BaseException) -> int:
    """A refusal the user can fix (card, address, model, port) is one line and exit 2; anything
    else is a bug or an infrastructure failure, logged with its traceback, exit 1."""
    from ..card import CardError
    from ..models.errors import ModelSetupError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, CardError | ModelSetupError | ValueError | OSError):
        if isinstance(exc, ModelSetupError):
            log_event(logger, "model_unusable", logging.ERROR, error=str(exc))
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
