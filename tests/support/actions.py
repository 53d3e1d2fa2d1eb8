"""Shared pieces for the action-runtime tests: two companions, a runtime factory, a client."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from companion.actions import (
    ActionContext,
    ActionRuntime,
    ToolDef,
    action,
)
from companion.memory import MemoryEndpoint
from companion.protocol import (
    QUERIES,
    Action,
    Metadata,
    Query,
    QueryResult,
    QueryResultBody,
)
from companion.store.history import InMemoryHistory, RecentMessages
from support.cards import metadata as md
from support.recorders import Sink

ME = md("a", name="Aya", personality="calm", story="lives here", sample="hello")
OTHER = md("b", name="Ben", personality="loud", story="visits", sample="yo")


def make_runtime(
    *tools: ToolDef,
    publisher: Any = None,
    directory: Mapping[str, Metadata] | None = None,
    history: RecentMessages | None = None,
    **options: Any,
) -> tuple[ActionRuntime, Sink]:
    recorder = publisher if publisher is not None else Sink()
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


class Put(BaseModel):
    key: str
    value: Any = None


@action(id="put", description="Keep a value.", input=Put, timeout=5)
def put(ctx: ActionContext[Put]) -> list[Action]:
    ctx.store.set(ctx.input.key, ctx.input.value)
    return []
