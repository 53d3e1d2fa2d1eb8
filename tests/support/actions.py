"""Shared pieces for the action-runtime tests: a recording publisher, a runtime factory, a client."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from companion.actions import ActionRuntime, ToolDef
from companion.memory import MemoryEndpoint
from companion.protocol import (
    QUERIES,
    Envelope,
    Metadata,
    Query,
    QueryResult,
    QueryResultBody,
    State,
)
from companion.store.history import InMemoryHistory

ME = Metadata(id="companion_a", name="Aya", personality="calm", story="lives here", sample="hello")
OTHER = Metadata(id="companion_b", name="Ben", personality="loud", story="visits", sample="yo")


@dataclass
class Recorder:
    """A Publisher that records what it is given; ``sent`` is set after every publish."""

    published: list[tuple[str, Envelope | list[State]]] = field(default_factory=list)
    fail: BaseException | None = None
    hang: bool = False
    sent: trio.Event = field(default_factory=trio.Event)

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await trio.sleep_forever()
        self.published.append((topic, envelope))
        self.sent.set()
        self.sent = trio.Event()

    def on(self, topic: str) -> list[Any]:
        return [envelope for t, envelope in self.published if t == topic]

    def queries(self) -> list[Query]:
        return [q for q in self.on(QUERIES) if isinstance(q, Query)]

    async def next_query(self) -> Query:
        """Wait (bounded) until a query has been published and return the latest."""
        with trio.fail_after(5):
            while not self.queries():
                await self.sent.wait()
        return self.queries()[-1]


def make_runtime(
    *tools: ToolDef,
    publisher: Any = None,
    directory: Mapping[str, Metadata] | None = None,
    history: InMemoryHistory | None = None,
    **options: Any,
) -> tuple[ActionRuntime, Recorder]:
    recorder = publisher if publisher is not None else Recorder()
    runtime = ActionRuntime(
        metadata=ME,
        publisher=recorder,
        directory=directory if directory is not None else {ME.id: ME},
        history=history if history is not None else InMemoryHistory(),
        **options,
    )
    for tool in tools:
        runtime.register(tool)
    return runtime, recorder


def answer(query: Query, *, success: bool = True, body: dict[str, Any] | None = None) -> QueryResult:
    return QueryResult(id=query.id, result=QueryResultBody(success=success, body=body or {}))


Responder = Callable[[Query], QueryResult | None]


async def run_client(endpoint: MemoryEndpoint, respond: Responder, seen: list[Query]) -> None:
    """A client on the hub: answers each query it sees with ``respond`` (None: stay silent)."""
    async for inbound in endpoint.receive_channel:
        if isinstance(inbound.payload, Query):
            seen.append(inbound.payload)
            reply = respond(inbound.payload)
            if reply is not None:
                await endpoint.publish(QUERIES, reply)


async def pump_results(endpoint: MemoryEndpoint, runtime: ActionRuntime) -> None:
    """What the node does for the runtime: feed every QueryResult from ``queries`` to it."""
    async for inbound in endpoint.receive_channel:
        if isinstance(inbound.payload, QueryResult):
            runtime.deliver_query_result(inbound.payload)
