"""Framework overhead per turn and model calls per turn, for groups of 3, 6 and 12 companions,
and message -> reply latency over real nodes.

In memory: each run is a whole conversation on the in-memory transport with the scripted model
(which answers in microseconds), from the opening line to ``terminal``. For every reply, the time
from its message being delivered to the reply being delivered is measured on the bystander's
clock, and the time spent inside the model is subtracted: what is left is the engine, the
action runtime, parsing and the transport. Model calls are counted per answered message.

Real nodes: ``--real-nodes N`` ``companion run`` processes (scripted models) on 127.0.0.1 and a
libp2p node in this process that addresses one companion at a time and times, on its own clock,
publish -> the reply arriving (gossip both ways, the edge, the store's synchronous writes, the
engine, three model calls). Each message addresses one companion, so it gets exactly one reply.

    python scripts/bench_turns.py [--sizes 3 6 12] [--runs 5] [--real-nodes 3] [--real-messages 20]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from bench_support import percentile

from companion.app.demo import DemoOptions, _Child, _run_child, _stop_children, _wait_child, default_cards
from companion.app.group import MemoryGroup
from companion.card.model import CardSettings, LoadedCard, load_card
from companion.conversation.rules import turn_info
from companion.conversation.transcript import TranscriptEvent
from companion.engine.driver import EngineTimings
from companion.log import configure_logging
from companion.memory import Inbound
from companion.models.base import ParamsRequest, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from companion.models.scripted import ScriptedModel
from companion.protocol import MESSAGES, Message, Metadata

REPO = Path(__file__).resolve().parents[1]


class TimedModel:
    """The scripted model, with the seconds spent in it summed per answered message."""

    def __init__(self, inner: ScriptedModel, spent: defaultdict[str, float]) -> None:
        self.inner = inner
        self.spent = spent

    @property
    def name(self) -> str:
        return self.inner.name

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        started = time.perf_counter()
        try:
            return await self.inner.decide_states(request)
        finally:
            self.spent[request.message.params.id] += time.perf_counter() - started

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return await self.inner.fill_params(request)
        finally:
            self.spent[request.message.params.id] += time.perf_counter() - started

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        started = time.perf_counter()
        spent_in_tools = 0.0

        async def timed_call(tool_id: str, raw: Any) -> Any:
            nonlocal spent_in_tools
            tool_started = time.perf_counter()
            try:
                return await call_tool(tool_id, raw)
            finally:
                spent_in_tools += time.perf_counter() - tool_started

        try:
            await self.inner.speak(request, timed_call)
        finally:
            # Tool calls (the action runtime publishing the reply) are framework, not model.
            self.spent[request.message.params.id] += time.perf_counter() - started - spent_in_tools


@functools.cache
def group_cards(size: int) -> tuple[LoadedCard, ...]:
    """The example cards, cloned under new ids and names until there are ``size`` of them."""
    base = [load_card(path) for path in default_cards(REPO / "cards")]
    out = []
    for index in range(size):
        source = base[index % len(base)].card
        meta = source.metadata
        suffix = "" if index < len(base) else f"_{index}"
        card = source.model_copy(
            update={
                "metadata": Metadata(
                    id=meta.id + suffix,
                    name=meta.name + (f" {index}" if suffix else ""),
                    personality=meta.personality,
                    story=meta.story,
                    sample=meta.sample,
                ),
                "settings": CardSettings(max_turns=12, repetition_threshold=0.6),
            }
        )
        out.append(LoadedCard.from_card(card))
    return tuple(out)


async def one_conversation(size: int, seed: int) -> tuple[list[float], list[int], int]:
    """(overhead seconds per reply, model calls per answered message, replies)."""
    arrivals: dict[str, float] = {}
    latencies: list[tuple[str, float]] = []
    spent: defaultdict[str, float] = defaultdict(float)

    def on_event(event: TranscriptEvent) -> None:
        now = time.perf_counter()
        if event.kind != "message" or event.message_id is None:
            return
        arrivals[event.message_id] = now
        if event.in_reply_to in arrivals:
            latencies.append((event.in_reply_to, now - arrivals[event.in_reply_to]))

    async with MemoryGroup(timings=EngineTimings.offline(), on_event=on_event) as group:
        for index, loaded in enumerate(group_cards(size)):
            await group.add(loaded, TimedModel(ScriptedModel(seed * 100 + index), spent))
        await group.say("Hello everyone! What has been the best part of your day so far?")
        if not await group.wait_until(lambda t: t.over, 120):
            raise RuntimeError(f"the conversation of {size} did not reach terminal")
    overheads = [latency - spent[message_id] for message_id, latency in latencies]
    calls = list(group.calls_per_turn().values())
    return overheads, calls, len(latencies)


async def bench(sizes: Sequence[int], runs: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        overheads: list[float] = []
        calls: list[int] = []
        replies = 0
        for seed in range(runs):
            o, c, r = await one_conversation(size, seed)
            overheads += o
            calls += c
            replies += r
        rows.append(
            {
                "companions": size,
                "conversations": runs,
                "replies": replies,
                "overhead_ms_p50": round(statistics.median(overheads) * 1000, 2),
                "overhead_ms_p95": round(percentile(overheads, 0.95) * 1000, 2),
                "overhead_ms_max": round(max(overheads) * 1000, 2),
                "model_calls_per_turn_mean": round(statistics.mean(calls), 2),
                "model_calls_per_turn_max": max(calls),
            }
        )
    return rows


def real_cards(count: int, folder: Path) -> list[Path]:
    """``count`` card files: the example cards, then copies under new ids and names."""
    base = default_cards(REPO / "cards")
    out = []
    for index in range(count):
        source = base[index % len(base)]
        if index < len(base):
            out.append(source)
            continue
        card = load_card(source).card
        meta = card.metadata
        text = source.read_text(encoding="utf-8")
        text = text.replace(f"id: {meta.id}", f"id: {meta.id}_{index}", 1)
        text = text.replace(f"name: {meta.name}", f"name: {meta.name} {index}", 1)
        path = folder / f"{source.stem}_{index}.yaml"
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


class _Replies:
    """The timing node's handler: when each reply (by ``in_reply_to``) first arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.changed = trio.Event()

    async def handle(self, inbound: Inbound) -> None:
        payload = inbound.payload
        if isinstance(payload, Message):
            answered = turn_info(payload).in_reply_to
            if answered is not None and answered not in self.arrived:
                self.arrived[answered] = time.perf_counter()
                self.changed.set()
                self.changed = trio.Event()

    async def wait(self, message_id: str, timeout: float) -> float | None:
        with trio.move_on_after(timeout):
            while message_id not in self.arrived:
                await self.changed.wait()
            return self.arrived[message_id]
        return None


async def bench_real(nodes: int, messages: int) -> dict[str, Any]:
    """Message -> reply latency over ``nodes`` real ``companion run`` processes."""
    from companion.node import CompanionNode, NodeConfig

    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        workdir = Path(tmp)
        cards = real_cards(nodes, workdir)
        ids = [load_card(path).card.metadata.id for path in cards]
        options = DemoOptions(cards=cards, model="scripted", pace=0.0)
        replies = _Replies()
        timer = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="bench"))
        latencies: list[float] = []
        lost = 0
        async with trio.open_nursery() as nursery:
            await nursery.start(timer.run, replies)
            children: list[_Child] = []
            try:
                timer_addr = f"{timer.listen_addrs[0]}/p2p/{timer.peer_id}"
                for index, card in enumerate(cards):
                    peers = [timer_addr, *(c.addrs[0] for c in children)]
                    run_child = functools.partial(_run_child, card, index, peers, options, workdir)
                    child: _Child = await nursery.start(run_child)
                    children.append(child)
                    await _wait_child(child, lambda c: bool(c.addrs), 60, "start listening")
                for child in children:
                    await _wait_child(child, lambda c: set(ids) <= c.directory, 60, "meet the others")
                if not await timer.wait_for(lambda: set(ids) <= set(timer.directory), 60):
                    raise RuntimeError("the timing node did not meet every companion")
                warm = Message.create("user_bench", [ids[0]], "Warming up: are you there?")
                for _ in range(20):  # the mesh forms on a heartbeat
                    await timer.publish(MESSAGES, warm)
                    if await replies.wait(warm.params.id, 3) is not None:
                        break
                for n in range(messages):
                    message = Message.create("user_bench", [ids[n % len(ids)]], f"Question {n}: how are you?")
                    sent = time.perf_counter()
                    await timer.publish(MESSAGES, message)
                    arrived = await replies.wait(message.params.id, 30)
                    if arrived is None:
                        lost += 1
                    else:
                        latencies.append(arrived - sent)
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_children(children)
                nursery.cancel_scope.cancel()
    return {
        "nodes": nodes,
        "messages": messages,
        "unanswered": lost,
        "latency_ms_p50": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "latency_ms_p95": round(percentile(latencies, 0.95) * 1000, 1) if latencies else None,
        "latency_ms_max": round(max(latencies) * 1000, 1) if latencies else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 6, 12])
    parser.add_argument("--runs", type=int, default=5, help="conversations per group size")
    parser.add_argument("--json", action="store_true", help="one JSON object per group size")
    parser.add_argument("--real-nodes", type=int, default=3, help="companion run processes (0: skip)")
    parser.add_argument("--real-messages", type=int, default=20, help="messages timed over real nodes")
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    rows = trio.run(bench, args.sizes, args.runs) if args.sizes else []
    real = trio.run(bench_real, args.real_nodes, args.real_messages) if args.real_nodes else None
    if args.json:
        for row in rows:
            print(json.dumps(row))
        if real is not None:
            print(json.dumps(real))
        return 0
    print("message in -> reply published, scripted model time subtracted (in-memory transport;")
    print("every companion runs in this one process, so the overhead grows with the group size)")
    print(
        f"{'group':>5} {'replies':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'calls/turn':>10} {'max':>4}"
    )
    for row in rows:
        print(
            f"{row['companions']:>5} {row['replies']:>7} {row['overhead_ms_p50']:>8} "
            f"{row['overhead_ms_p95']:>8} {row['overhead_ms_max']:>8} "
            f"{row['model_calls_per_turn_mean']:>10} {row['model_calls_per_turn_max']:>4}"
        )
    if real is not None:
        print()
        print(f"message published -> its reply arriving, over {real['nodes']} companion run processes")
        print(
            "(real libp2p gossip on 127.0.0.1, scripted models, one reply per message; model time included)"
        )
        print(f"{'messages':>8} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'unanswered':>10}")
        print(
            f"{real['messages']:>8} {real['latency_ms_p50']!s:>8} {real['latency_ms_p95']!s:>8} "
            f"{real['latency_ms_max']!s:>8} {real['unanswered']:>10}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
