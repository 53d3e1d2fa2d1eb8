"""What ``companion relay`` starts: a public relay and bootstrap node, no companion.

Companions behind NAT reserve a slot on it (``companion run --relay ADDR``) and are reached
through it; DCUtR then tries to replace each relayed connection with a direct one. Its DHT lets
any companion that knows this one address find the others. It prints ``relay peer <peer id>``
then one indented address a line (:mod:`.lines`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from companion.app.datadir import hold_key
from companion.app.lines import RELAY_LINE, print_addresses
from companion.app.stopping import Interrupted, note_stopping

if TYPE_CHECKING:
    from companion.node.relay_node import RelayNode, RelayOptions

__all__ = ["DEFAULT_LISTEN", "KEY_NAME", "Interrupted", "relay_options", "run_relay"]

logger = logging.getLogger("companion.app.relay")

DEFAULT_LISTEN: Final = "/ip4/0.0.0.0/tcp/4001"
KEY_NAME: Final = "relay.key"
"""The relay's key file under ``<data dir>/keys/``."""


def relay_options(max_reservations: int) -> RelayOptions:
    """The relay's limits: ``max_reservations`` companions reachable through it at once."""
    from companion.node.relay_node import RelayOptions

    return RelayOptions(max_reservations=max_reservations)


async def run_relay(
    listen: Sequence[str],
    peers: Sequence[str],
    data_dir: Path | None,
    options: RelayOptions,
    *,
    ready: Callable[[RelayNode], None] | None = None,
    metrics: tuple[str, int] | None = None,
) -> None:
    """Start the relay, print its peer id and addresses, serve until SIGINT (raises
    :class:`Interrupted`), SIGTERM or cancellation; with ``metrics`` (``--metrics HOST:PORT``)
    serve ``/metrics``, ``/healthz`` and ``/readyz`` there (ready once it listens)."""
    from companion.node import NodeConfig
    from companion.node.discovery import parse_peer_addr
    from companion.node.relay_node import RelayNode

    for addr in peers:
        parse_peer_addr(addr)
    config = NodeConfig(
        listen=tuple(listen) or (DEFAULT_LISTEN,),
        peers=tuple(peers),
        key_path=data_dir / "keys" / KEY_NAME if data_dir is not None else None,
        name="relay",
        max_connections=options.max_reservations * 2,
    )
    with hold_key(config.key_path, "companion relay"):
        await _serve_relay(RelayNode(config, options), ready=ready, metrics=metrics)


async def _serve_relay(
    relay: RelayNode,
    *,
    ready: Callable[[RelayNode], None] | None,
    metrics: tuple[str, int] | None,
) -> None:
    interrupted = False
    # signals are caught from before the first line is printed: a SIGUSR1 right after it is stats
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:
            if metrics is not None:  # first: an address in use stops the command now
                from companion.app.metrics import ProcessMetrics
                from companion.app.metrics_http import serve_metrics

                served = ProcessMetrics(needs_peers=False)
                await nursery.start(serve_metrics, *metrics, served)
            await nursery.start(relay.run)
            if metrics is not None:
                served.nodes.append(relay)
            print(f"{RELAY_LINE}{relay.peer_id}", flush=True)
            print_addresses(relay.listen_addrs)
            if ready is not None:
                ready(relay)
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    relay.log_stats()
                    continue
                note_stopping(logger, signum)
                interrupted = signum == signal.SIGINT
                break
            nursery.cancel_scope.cancel()
    if interrupted:
        raise Interrupted
