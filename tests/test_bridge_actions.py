"""``POST /actions/TOOL`` on a real bridge socket (127.0.0.1): the token, every error a client can
cause (unknown tool, bad input, bad bytes), approval asked of the clients inside the call, the
rate limit, and the envelope reaching the network through the companion's runtime."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from pydantic import BaseModel, Field

from companion.actions import ActionContext, ActionRuntime, action
from companion.app.actions import serve_actions
from companion.bridge import Bridge, BridgeConfig
from companion.bridge.ratelimit import RateLimit
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import ACTIONS, Action, Query
from support.actions import ME, answer, make_runtime, pump_results, run_client
from support.bridges import http_exchange

TOKEN = "s3cret"


class Wave(BaseModel):
    times: int = Field(ge=1, le=5)
    hand: str = "right"


@action(id="wave", description="Wave.", input=Wave, timeout=5)
def wave(ctx: ActionContext[Wave]) -> Action:
    ctx.note("the person waved back")
    return Action.create(ctx.companion_id, "wave", {"times": ctx.input.times, "hand": ctx.input.hand})


@action(id="unlock", description="Unlock the door.", input=Wave, timeout=5, requires_approval=True)
def unlock(ctx: ActionContext[Wave]) -> Action:
    return Action.create(ctx.companion_id, "unlock", {})


@dataclass
class Env:
    port: int
    runtime: ActionRuntime
    network: MemoryEndpoint
    node: MemoryEndpoint


@asynccontextmanager
async def bridge_with_actions(**config: Any) -> AsyncIterator[Env]:
    async with trio.open_nursery() as nursery:
        hub = MemoryHub()
        node, network = hub.endpoint("node"), hub.endpoint("network")
        runtime, _ = make_runtime(wave, unlock, publisher=node, approval_timeout=5)
        bridge = Bridge(
            hub.endpoint("bridge"), config=BridgeConfig(host="127.0.0.1", port=0, token=TOKEN, **config)
        )
        serve_actions(bridge, {ME.id: runtime})
        port = await nursery.start(bridge.serve)
        yield Env(port, runtime, network, node)
        nursery.cancel_scope.cancel()


async def post(
    port: int, target: str, body: bytes | str, *, token: str | None = TOKEN, method: str = "POST"
) -> tuple[int, dict[str, Any] | str]:
    data = body.encode() if isinstance(body, str) else body
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    top, payload = await http_exchange(port, head.encode() + data, 15)
    status = int(top.split()[1])
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()


async def test_a_call_with_the_token_runs_through_the_runtime_and_reaches_the_network() -> None:
    async with bridge_with_actions() as env:
        status, body = await post(env.port, "/actions/wave", '{"times": 2}')
        assert status == 200 and isinstance(body, dict)
        result = body["result"]
        assert body["jsonrpc"] == "2.0" and body["id"] == result["call_id"]
        assert result["status"] == "ok" and result["notes"] == ["the person waved back"]
        assert result["published"] == [{"topic": "actions", "name": "wave"}]
        with trio.fail_after(5):
            inbound = await env.network.receive_channel.receive()
        assert inbound.topic == ACTIONS and isinstance(inbound.payload, Action)
        assert inbound.payload.params.params == {"times": 2, "hand": "right"}
        assert inbound.payload.params.from_ == ME.id


async def test_what_a_client_gets_wrong_is_answered_with_a_status_and_a_stable_code() -> None:
    async with bridge_with_actions() as env:
        status, body = await post(env.port, "/actions/wave", '{"times": 2}', token=None)
        assert status == 401
        status, body = await post(env.port, "/actions/wave", '{"times": 2}', token="wrong")
        assert status == 401
        status, body = await post(env.port, "/actions/whistle", "{}")
        assert status == 404 and isinstance(body, dict)
        assert body["error"]["code"] == -32003 and "available: unlock, wave" in body["error"]["message"]
        status, body = await post(env.port, "/actions/wave", '{"times": 9, "hand": 3}')
        assert status == 400 and isinstance(body, dict) and body["error"]["code"] == -32004
        assert sorted(i["path"] for i in body["error"]["data"]["issues"]) == ["hand", "times"]
        for bad in (b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"'):
            status, body = await post(env.port, "/actions/wave", bad)
            assert status == 400 and isinstance(body, dict) and body["error"]["code"] in (-32700, -32600), bad
        status, _ = await post(env.port, "/actions/wave", "{}", method="GET")
        assert status == 405
        status, body = await post(env.port, "/actions/wave?companion=companion_zed", '{"times": 1}')
        assert status == 404 and isinstance(body, dict) and ME.id in body["error"]["message"]
        # After all that, a good call still works: nothing was poisoned.
        status, body = await post(env.port, "/actions/wave", '{"times": 1}')
        assert status == 200


async def test_approval_is_asked_of_the_clients_inside_the_call() -> None:
    async with bridge_with_actions() as env, trio.open_nursery() as nursery:
        seen: list[Query] = []
        decisions = iter([True, False])
        nursery.start_soon(
            run_client, env.network, lambda q: answer(q, body={"approved": next(decisions)}), seen
        )
        nursery.start_soon(pump_results, env.node, env.runtime)
        approved = await post(env.port, "/actions/unlock", '{"times": 1}')
        denied = await post(env.port, "/actions/unlock", '{"times": 1}')
        nursery.cancel_scope.cancel()
    assert [q.params.type for q in seen] == ["approval", "approval"]
    assert approved[0] == 200
    assert denied[0] == 403 and isinstance(denied[1], dict) and denied[1]["error"]["code"] == -32005


async def test_calls_past_the_rate_are_refused_with_retry_after() -> None:
    async with bridge_with_actions(client_rate=RateLimit(rate=1.0, burst=3)) as env:
        statuses = [(await post(env.port, "/actions/wave", '{"times": 1}'))[0] for _ in range(5)]
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429]
