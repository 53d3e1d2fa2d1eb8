"""The conversation engines of ``companion run``: a model per card, an engine per node.

Each card's model is ``--model`` (for every card), else the card's ``settings.model``, else the
offline scripted model; every distinct model is built and checked at start-up
(:func:`prepare_models`), so a missing key or an endpoint that is down is an error at start-up,
not mid-conversation. The nodes do not wait for it: each runs with a :class:`PendingHandler`
and dials its peers while the models and engines are prepared, and gets its engine once that
is done. History and working memory live in ``<data dir>/<companion id>/``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from companion.log import log_event
from companion.memory import Inbound
from companion.models.specs import is_offline
from companion.protocol import Action, Message, Query, QueryResult

if TYPE_CHECKING:
    from companion.actions import KeyValueStore
    from companion.app.metrics import ProcessMetrics
    from companion.card.model import LoadedCard
    from companion.engine.driver import ConversationEngine, EngineEvent, EngineTimings
    from companion.models.base import CompanionModel
    from companion.node import CompanionNode, InboundHandler
    from companion.store.sqlite import Store

__all__ = [
    "CardModel",
    "CompanionHandler",
    "DecisionRecorder",
    "EngineOptions",
    "HandlerFactory",
    "LoggingHandler",
    "PendingHandler",
    "engine_handlers",
    "model_spec",
    "prepare_models",
    "summarize",
]

logger = logging.getLogger("companion.app.engines")

HandlerFactory = Callable[["LoadedCard", "CompanionNode", trio.Nursery], Awaitable["InboundHandler"]]
"""``async (card, node, nursery) -> handler``: the nursery lives as long as the node runs (the
handler's engine is started in it before the factory returns)."""


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
    """What a companion's node feeds: an ``inbound`` log line, then the conversation engine.

    It owns the companion's files (``store``, ``kv``): a stop in order (:mod:`.stopping`)
    stops the engine's turns (:meth:`stop`), then the node, then closes them (:meth:`close`),
    so every message the node handed over is recorded. :meth:`keep_open` closes them when it is
    cancelled, for any other way out (a second signal, a crash)."""

    def __init__(
        self,
        node_name: str,
        engine: ConversationEngine,
        *,
        store: Store | None = None,
        kv: KeyValueStore | None = None,
    ) -> None:
        self.log = LoggingHandler(node_name)
        self.engine = engine
        self.store, self.kv = store, kv
        self._closed = False

    async def handle(self, inbound: Inbound) -> None:
        await self.log.handle(inbound)
        await self.engine.handle(inbound)

    async def stop(self, grace: float) -> None:
        """No new turn; the one in flight finishes or is withdrawn within ``grace`` seconds
        (:meth:`ConversationEngine.stop <companion.engine.driver.ConversationEngine.stop>`)."""
        await self.engine.stop(grace)

    async def close(self) -> None:
        """Flush and close the history and the tools' store (once), off the loop; shielded, so a
        second signal that cancels everything meanwhile cannot leave one of them unflushed."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            if self.store is not None:
                await self.store.aclose()
            if self.kv is not None:
                await trio.to_thread.run_sync(self.kv.close)

    async def keep_open(self, node: CompanionNode) -> None:
        """Keep the files open until cancelled, then :meth:`close` them once ``node`` stopped
        (within its close deadline: a second signal cancels everything at once, and the node
        still hands over what arrived while it closes)."""
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await node.stop()
            await self.close()


class PendingHandler:
    """A node's handler until its engine is ready, so the node can dial before the engine exists.

    Payloads that arrive before wait, in arrival order, in the node's bounded inbound buffer
    (past it the node drops and counts them, as for any slow handler), and reach the engine
    once :meth:`become` gave it: the engine takes them as it takes payloads that arrive late.
    Until then nothing answers or leads a turn for this companion."""

    def __init__(self) -> None:
        self._ready = trio.Event()
        self._handler: InboundHandler | None = None

    @property
    def handler(self) -> InboundHandler | None:
        """The handler given by :meth:`become`; ``None`` while pending."""
        return self._handler

    def become(self, handler: InboundHandler) -> None:
        """From now on every payload (the waiting ones first) goes to ``handler``."""
        if self._handler is not None:
            raise RuntimeError("the handler is already given")
        self._handler = handler
        self._ready.set()

    async def handle(self, inbound: Inbound) -> None:
        await self._ready.wait()
        assert self._handler is not None
        await self._handler.handle(inbound)


def _observers(
    *observers: Callable[[EngineEvent], None] | None,
) -> Callable[[EngineEvent], None] | None:
    """One engine ``observer`` that hands each event to every one of ``observers`` given (the
    decisions kept for ``companion explain``, the metrics), in order."""
    given = [o for o in observers if o is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def observe(event: EngineEvent) -> None:
        for observer in given:
            observer(event)

    return observe


class DecisionRecorder:
    """An engine's observer that keeps each decision about a message in the companion's store
    (:meth:`Store.record_decision <companion.store.sqlite.Store.record_decision>`): every event at INFO
    or above that names a ``message_id``, as logged (``companion explain`` reads them back).
    A store that fails is said once (a warning) and the engine goes on: the record is an aid,
    the conversation does not depend on it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._failing = False

    def __call__(self, event: EngineEvent) -> None:
        message_id = event.fields.get("message_id")
        if event.level < logging.INFO or not isinstance(message_id, str):
            return
        try:
            self.store.record_decision(
                message_id, event.kind, dict(event.fields), level=logging.getLevelName(event.level)
            )
        except Exception as exc:
            if not self._failing:
                log_event(
                    logger,
                    "decision_not_kept",
                    logging.WARNING,
                    companion=event.companion,
                    error=repr(exc)[:300],
                )
            self._failing = True
        else:
            self._failing = False


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
    pipeline: bool = True
    """The next turn's model work starts while a line is voiced (``EngineTimings.pipeline``)."""
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
    from companion.models.factory import DEFAULT_MODEL_SPEC

    return override or loaded.card.settings.model or DEFAULT_MODEL_SPEC


def _import_engine_modules(specs: Sequence[str]) -> None:
    """Import the modules the engines and these models need (in a worker thread, see
    :func:`prepare_models`). An import that fails is left for :func:`make_model` to report."""
    from importlib import import_module

    import_module("companion.engine.driver")
    import_module("companion.models.scripted")
    if not all(is_offline(spec) for spec in specs):
        with contextlib.suppress(ImportError):
            import_module("companion.models.providers")


async def prepare_models(cards: Sequence[LoadedCard], options: EngineOptions) -> dict[str, CardModel]:
    """A model per card (by companion id). Each distinct model is built once and checked once
    (each check within ``options.check_timeout``); raises
    :class:`~companion.models.errors.ModelSetupError` when one cannot work, naming the card file
    and its ``settings.model`` when the spec came from there. Scripted models get their own seed
    per card; provider models with the same spec are shared.

    The engines' and models' modules are imported first in a worker thread: the trio loop keeps
    turning meanwhile (the GIL changes hands every few milliseconds), so the nodes that already
    dial finish their handshakes instead of waiting for a few hundred milliseconds of imports."""
    from companion.models.errors import ModelSetupError
    from companion.models.factory import check_model, engine_timings, make_model

    specs = [model_spec(loaded, options.model) for loaded in cards]
    await trio.to_thread.run_sync(_import_engine_modules, specs)
    built: dict[tuple[str, int | None], CompanionModel] = {}
    out: dict[str, CardModel] = {}
    for index, (loaded, spec) in enumerate(zip(cards, specs, strict=True)):
        offline = is_offline(spec)
        seed = options.seed + index
        key = (spec, seed if offline else None)
        model = built.get(key)
        if model is None:
            try:
                model = make_model(spec, base_url=None if offline else options.base_url, seed=seed)
                await check_model(model, timeout=options.check_timeout)
            except ModelSetupError as exc:
                if options.model is not None or not loaded.card.settings.model or loaded.path is None:
                    raise
                where = f"{loaded.path}: settings.model: {exc}"
                raise ModelSetupError(where, reason=exc.reason, status=exc.status) from exc
            built[key] = model
        timings = replace(engine_timings([model], options.pace), pipeline=options.pipeline)
        cid = loaded.card.metadata.id
        out[cid] = CardModel(spec, model, timings)
        log_event(logger, "model_ready", companion=cid, spec=spec, model=model.name)
    return out


def engine_handlers(
    models: Mapping[str, CardModel], *, data_dir: Path | None, metrics: ProcessMetrics | None = None
) -> HandlerFactory:
    """The handler factory of ``companion run``: a :class:`CompanionHandler` with a conversation
    engine per card (its model from ``models``, its history and memory under
    ``data_dir/<companion id>/``, in memory when ``None``), publishing through the card's node;
    counted into ``metrics`` (model calls, decisions, store commits) when given."""
    from companion.actions import KeyValueStore
    from companion.engine.driver import ConversationEngine
    from companion.store.sqlite import Store

    async def make(loaded: LoadedCard, node: CompanionNode, nursery: trio.Nursery) -> CompanionHandler:
        chosen = models[loaded.card.metadata.id]
        cid = loaded.card.metadata.id
        model = chosen.model if metrics is None else metrics.metered(cid, chosen.model)
        store = None if data_dir is None else Store.in_directory(data_dir / loaded.card.metadata.id)
        kv = None if store is None else KeyValueStore.open(store.path)  # the tools' values, same file
        engine = ConversationEngine(
            loaded,
            model,
            node,
            node.directory,
            store=store,
            timings=chosen.timings,
            companion_of=node.membership.companion_of,
            kv=kv,
            observer=_observers(
                None if store is None else DecisionRecorder(store),
                None if metrics is None else metrics.observer(cid),
            ),
        )
        if metrics is not None:
            metrics.add_engine(cid, engine, store)
        await nursery.start(engine.run)
        node.add_membership_listener(engine.directory_changed)
        engine.directory_changed()  # the node may have met companions before its engine existed
        handler = CompanionHandler(node.name, engine, store=store, kv=kv)
        nursery.start_soon(handler.keep_open, node)  # writes behind; flushed and closed at the end
        return handler

    return make
