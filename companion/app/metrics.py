"""Prometheus metrics and health checks for operators: ``/metrics``, ``/healthz``, ``/readyz``.

One :class:`ProcessMetrics` per process, with a registry of its own (never
``prometheus_client``'s global one: two processes' worth of nodes in one test process must not
count into each other). What happens once is counted when it happens (a model call's duration,
a store commit, a turn led, a reply); what the nodes already count (payloads in and out by
topic, drops by reason, peers, companions present, queue depths, queries) is read from them at
each scrape by a collector, so the node keeps no second set of counters. The names follow
Prometheus' conventions (``companion_`` prefix, ``_total`` counters, ``_seconds``); the list
and what each one means is in ``docs/operations.md``.

:mod:`.metrics_http` serves them: on the bridge's port when there is one and on ``--metrics
HOST:PORT``, with ``/healthz`` and ``/readyz`` (:meth:`ProcessMetrics.readiness`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from companion import __version__
from companion.models.base import CompanionModel, ModelCall, ModelWrapper
from companion.models.errors import ModelError

if TYPE_CHECKING:
    from companion.bridge import Bridge
    from companion.engine.driver import ConversationEngine, EngineEvent
    from companion.protocol import Message

__all__ = ["MeteredModel", "MetricsNode", "ProcessMetrics"]

MODEL_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
"""A model call takes milliseconds (the scripted model) to minutes (a small CPU model's
``speak`` with tools): seconds, doubling, up to the longest deadline a local model gets."""
STORE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""A commit takes about a millisecond on a quiet disk, tens on a busy one; past a second the
disk is in trouble."""


class MetricsNode(Protocol):
    """What the collector reads from a node (a :class:`~companion.node.CompanionNode`; a relay
    has only ``name`` and ``stats``)."""

    name: str

    def stats(self) -> dict[str, Any]: ...


class ProcessMetrics:
    """The metrics of one process: its registry, what is counted as it happens, and the nodes
    and engines read at each scrape."""

    def __init__(self, *, needs_peers: bool = True) -> None:
        """``needs_peers``: ``/readyz`` wants every node connected to a peer (a relay is ready
        once it listens: companions come to it)."""
        # no ``_created`` series: in Prometheus' text format each is one more gauge per counter
        # and histogram, which nothing here needs (a flag of the library, the same for all)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.model_seconds = Histogram(
            "companion_model_request_duration_seconds",
            "Model calls the engine made (call: states, params, speak), by how they ended "
            "(ok, error, cancelled: a deadline or a withdrawn turn, crashed)",
            ["companion", "call", "outcome"],
            buckets=MODEL_BUCKETS,
            registry=self.registry,
        )
        self.store_seconds = Histogram(
            "companion_store_commit_duration_seconds",
            "One committed batch of the companion's history store (SQLite, its writer thread)",
            ["companion"],
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self.turns_led = Counter(
            "companion_turns_led",
            "States arrays this companion published as a turn's leader, by where they came from "
            "(model, fallback_*, unanswered: the closing array of a turn nobody answered)",
            ["companion", "source"],
            registry=self.registry,
        )
        self.replies = Counter(
            "companion_replies", "Replies this companion published", ["companion"], registry=self.registry
        )
        self.speakers_failed = Counter(
            "companion_speaker_failures",
            "Speaking slots this companion gave up, by reason (timeout, model_error, no_reply...)",
            ["companion", "reason"],
            registry=self.registry,
        )
        self.unanswered = Counter(
            "companion_turns_unanswered",
            "Turns whose every speaking slot passed without a reply, as this companion saw them",
            ["companion"],
            registry=self.registry,
        )
        self.store_failures = Counter(
            "companion_store_failures",
            "Times the history store started failing (each followed by store_recovered in the log)",
            ["companion", "call"],
            registry=self.registry,
        )
        self.nodes: list[MetricsNode] = []
        self.engines: dict[str, ConversationEngine] = {}
        self.models: list[CompanionModel] = []
        self.bridges: list[Bridge] = []
        self.expected_engines: set[str] = set()
        """Companions whose engine ``/readyz`` waits for."""
        self.needs_peers = needs_peers
        self.registry.register(_Readings(self))

    # --- what the app hands over ---------------------------------------------------------------

    def expect(self, companions: Iterable[str]) -> None:
        """``/readyz`` is 503 until each of ``companions`` has an engine (:meth:`add_engine`)."""
        self.expected_engines.update(companions)

    def serve_on(self, bridge: Bridge, node: MetricsNode) -> None:
        """Serve the endpoints on ``bridge``'s port (:func:`add_metrics_routes`) and read its
        ``node`` (the one its clients publish through) at each scrape."""
        from companion.app.metrics_http import add_metrics_routes

        self.nodes.append(node)
        add_metrics_routes(bridge, self)

    def add_engine(self, companion: str, engine: ConversationEngine, store: Any = None) -> None:
        """Read ``engine`` at each scrape; time the commits of ``store`` (a
        :class:`~companion.store.sqlite.Store`, or ``None`` in memory)."""
        self.engines[companion] = engine
        if store is not None:
            store.observe_commits(self.store_seconds.labels(companion).observe)

    def observer(self, companion: str) -> Callable[[EngineEvent], None]:
        """The engine's ``observer``: counts the decisions that are metrics."""
        led, replied = self.turns_led, self.replies.labels(companion)
        failed, unanswered = self.speakers_failed, self.unanswered.labels(companion)
        store_failures = self.store_failures

        def observe(event: EngineEvent) -> None:
            kind, fields = event.kind, event.fields
            if kind == "states_published":
                led.labels(companion, str(fields.get("source", "model"))).inc()
            elif kind == "replied":
                replied.inc()
            elif kind == "speaker_failed":
                failed.labels(companion, str(fields.get("reason", "unknown"))).inc()
            elif kind == "turn_unanswered":
                unanswered.inc()
            elif kind == "store_failed":
                store_failures.labels(companion, str(fields.get("call", "unknown"))).inc()

        return observe

    def metered(self, companion: str, model: CompanionModel) -> CompanionModel:
        """``model`` with each call timed into ``companion_model_request_duration_seconds``;
        its tokens (a provider's ``tokens`` counter, and its ``requests_without_usage``: those
        its server reported no tokens for) are read at each scrape."""
        if all(m is not model for m in self.models):
            self.models.append(model)
        return MeteredModel(model, self.model_seconds, companion)

    # --- health -------------------------------------------------------------------------------

    def readiness(self) -> list[str]:
        """What keeps the process from being ready (empty: ready)."""
        missing = [f"no engine yet for {cid}" for cid in sorted(self.expected_engines - set(self.engines))]
        if not self.nodes:
            missing.append("no node running yet")
        if self.needs_peers:
            for node in self.nodes:
                if not node.stats().get("connected_peers"):
                    missing.append(f"node {node.name} has no connected peer")
        return missing

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry's text in the format ``accept`` asks for (OpenMetrics or Prometheus')."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class MeteredModel(ModelWrapper):
    """A :class:`~companion.models.base.CompanionModel` that times each call of the one it wraps."""

    def __init__(self, model: CompanionModel, seconds: Histogram, companion: str) -> None:
        super().__init__(model)
        self._seconds = seconds
        self._companion = companion

    def _around(self, call: ModelCall, message: Message) -> AbstractContextManager[object]:
        return _Timed(self._seconds, self._companion, _CALL_LABELS[call])


_CALL_LABELS: Final[dict[ModelCall, str]] = {
    "decide_states": "states",
    "fill_params": "params",
    "speak": "speak",
}
"""The ``call`` label of each model call."""


class _Timed:
    """Observes the seconds of a ``with`` block under the outcome it ended with."""

    def __init__(self, seconds: Histogram, companion: str, call: str) -> None:
        self._seconds, self._companion, self._call = seconds, companion, call
        self._began = 0.0

    def __enter__(self) -> None:
        self._began = time.monotonic()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.monotonic() - self._began
        self._seconds.labels(self._companion, self._call, _outcome(exc)).observe(elapsed)


def _outcome(exc: BaseException | None) -> str:
    """``ok``, ``cancelled`` (a deadline or the turn moving on: trio's ``Cancelled``, or a group
    of nothing else, as the trio-asyncio bridge of provider models raises it), ``error`` (a
    :class:`~companion.models.errors.ModelError`) or ``crashed``."""
    if exc is None:
        return "ok"
    if isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None:
        return "cancelled"
    if isinstance(exc, trio.Cancelled):
        return "cancelled"
    return "error" if isinstance(exc, ModelError) else "crashed"


class _Readings(Collector):
    """What the nodes, engines, models and bridges count themselves, read at each scrape (in
    the trio thread: the HTTP handlers run on the loop)."""

    def __init__(self, metrics: ProcessMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []  # the families depend on what runs; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        m = self._m
        info = GaugeMetricFamily("companion_build_info", "The running package", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        received = CounterMetricFamily(
            "companion_messages_received", "Payloads that passed the edge, by topic", labels=["node", "topic"]
        )
        published = CounterMetricFamily(
            "companion_messages_published", "Payloads this node published, by topic", labels=["node", "topic"]
        )
        dropped = CounterMetricFamily(
            "companion_payloads_dropped",
            "Payloads the edge refused, by reason (docs/network.md lists them)",
            labels=["node", "reason"],
        )
        peers = GaugeMetricFamily("companion_peers_connected", "Peers connected now", labels=["node"])
        present = GaugeMetricFamily(
            "companion_companions_present", "Companions this node sees now, itself included", labels=["node"]
        )
        queues = GaugeMetricFamily(
            "companion_queue_depth",
            "What waits now: inbound payloads for the engine, outbound RPCs in the fullest send queue",
            labels=["node", "queue"],
        )
        for node in m.nodes:
            stats = node.stats()
            name = node.name
            peers.add_metric([name], stats.get("connected_peers", 0))
            if "companions" in stats:
                present.add_metric([name], len(stats["companions"]))
            for reason, count in sorted((stats.get("drops") or {}).items()):
                dropped.add_metric([name, reason], count)
            for topic, count in sorted(getattr(node, "delivered_by_topic", {}).items()):
                received.add_metric([name, topic], count)
            for topic, count in sorted(getattr(node, "published_by_topic", {}).items()):
                published.add_metric([name, topic], count)
            for queue, depth in sorted(getattr(node, "queue_depths", {}).items()):
                queues.add_metric([name, queue], depth)
        yield from (received, published, dropped, peers, present, queues)
        yield from self._engines(m.engines)
        tokens = CounterMetricFamily(
            "companion_model_tokens",
            "Tokens the model server reported (direction: input, output)",
            labels=["model", "direction"],
        )
        unmeasured = CounterMetricFamily(
            "companion_model_requests_without_usage",
            "Model requests answered without token usage (companion_model_tokens leaves them out)",
            labels=["model"],
        )
        for model in m.models:
            counted: Mapping[str, int] = getattr(model, "tokens", {})
            for direction, count in sorted(counted.items()):
                tokens.add_metric([model.name, direction], count)
            without: int | None = getattr(model, "requests_without_usage", None)
            if without is not None:
                unmeasured.add_metric([model.name], without)
        yield from (tokens, unmeasured)
        clients = GaugeMetricFamily("companion_bridge_clients", "Clients connected to the bridge now")
        refused = CounterMetricFamily(
            "companion_bridge_frames_refused",
            "Client frames the bridge refused, by error code",
            labels=["code"],
        )
        for bridge in m.bridges:
            clients.add_metric([], bridge.client_count)
            for code, count in sorted(bridge.refused.items()):
                refused.add_metric([code], count)
        if m.bridges:
            yield from (clients, refused)

    @staticmethod
    def _engines(engines: Mapping[str, ConversationEngine]) -> Iterable[Metric]:
        pending = GaugeMetricFamily(
            "companion_queries_pending", "Client queries waiting for a result now", labels=["companion"]
        )
        queries = CounterMetricFamily(
            "companion_queries",
            "Client queries by how they ended (answered, failed, timeout) and results nobody "
            "waited for (dropped)",
            labels=["companion", "outcome"],
        )
        for cid, engine in engines.items():
            pending.add_metric([cid], engine.runtime.pending_queries)
            for outcome, count in sorted(engine.runtime.query_outcomes.items()):
                queries.add_metric([cid, outcome], count)
        yield from (pending, queries)
