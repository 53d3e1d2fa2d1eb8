"""Framework overhead per turn and model calls per turn, for groups of 3, 6 and 12 companions.

Each run is a whole conversation on the in-memory transport with the scripted model (which
answers in microseconds), from the opening line to ``terminal``. For every reply, the time
from its message being delivered to the reply being delivered is measured on the bystander's
clock, and the time spent inside the model is subtracted: what is left is the engine, the
action runtime, parsing and the transport. Model calls are counted per answered message.

    python scripts/bench_turns.py [--sizes 3 6 12] [--runs 5]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from bench_support import percentile

from companion.card import CardSettings, LoadedCard, load_card
from companion.demo import MemoryGroup, TranscriptEvent, default_cards
from companion.engine import EngineTimings
from companion.log import configure_logging
from companion.models.base import ParamsRequest, SpeakRequest, StateDecision, StatesRequest, ToolCaller
from companion.models.scripted import ScriptedModel
from companion.protocol import Metadata

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

    async with trio.open_nursery() as nursery:
        group = MemoryGroup(nursery, timings=EngineTimings.offline(), on_event=on_event)
        for index, loaded in enumerate(group_cards(size)):
            await group.add(loaded, TimedModel(ScriptedModel(seed * 100 + index), spent))
        await group.say("Hello everyone! What has been the best part of your day so far?")
        if not await group.wait_until(lambda t: t.over, 120):
            raise RuntimeError(f"the conversation of {size} did not reach terminal")
        nursery.cancel_scope.cancel()
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 6, 12])
    parser.add_argument("--runs", type=int, default=5, help="conversations per group size")
    parser.add_argument("--json", action="store_true", help="one JSON object per group size")
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    rows = trio.run(bench, args.sizes, args.runs)
    if args.json:
        for row in rows:
            print(json.dumps(row))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
