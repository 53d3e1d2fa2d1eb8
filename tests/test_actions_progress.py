"""Progress: clamped, never backwards, rate-limited, and it keeps a long call alive up to a cap."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from companion.actions import PROGRESS_ACTION, ActionContext, ActionDef, action
from companion.actions.progress import ProgressGate, ProgressUpdate, progress_action
from companion.protocol import ACTIONS, Action
from support.actions import ME, make_runtime


def test_first_report_goes_out_and_values_are_clamped() -> None:
    gate = ProgressGate(min_interval=1.0)
    assert gate.offer(-20, "start", now=0.0) == ProgressUpdate(0.0, "start")
    assert gate.offer(250, "done", now=0.1) == ProgressUpdate(100.0, "done")  # the end is never dropped


def test_never_backwards_and_nan_keeps_the_last_value() -> None:
    gate = ProgressGate(min_interval=0.0)
    assert gate.offer(40, "", now=0) == ProgressUpdate(40.0, "")
    assert gate.offer(10, "", now=1) == ProgressUpdate(40.0, "")
    assert gate.offer(float("nan"), "", now=2) == ProgressUpdate(40.0, "")
    assert gate.percent == 40.0


def test_rate_limit_drops_reports_between_intervals() -> None:
    gate = ProgressGate(min_interval=0.25)
    sent = [gate.offer(p, "", now=p / 100) for p in range(0, 60, 5)]  # every 0.05 s
    assert [u.percent for u in sent if u is not None] == [0.0, 25.0, 50.0]
    assert gate.percent == 55.0


def test_100_is_sent_once_even_inside_the_interval() -> None:
    gate = ProgressGate(min_interval=10)
    assert gate.offer(50, "", now=0) is not None
    assert gate.offer(100, "", now=0.01) is not None
    assert gate.offer(100, "", now=0.02) is None


def test_long_messages_are_cut() -> None:
    update = ProgressGate().offer(1, "x" * 1000, now=0)
    assert update is not None and len(update.message) == 200


def test_bad_interval() -> None:
    with pytest.raises(ValueError):
        ProgressGate(min_interval=-1)


@given(
    st.lists(
        st.tuples(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=2)),
        max_size=60,
    )
)
def test_sent_values_stay_in_range_rise_and_respect_the_interval(steps: list[tuple[float, float]]) -> None:
    gate = ProgressGate(min_interval=0.25)
    now = 0.0
    sent: list[tuple[float, float]] = []
    for percent, gap in steps:
        now += gap
        update = gate.offer(percent, "", now)
        if update is not None:
            sent.append((now, update.percent))
    values = [p for _, p in sent]
    assert all(0 <= p <= 100 for p in values)
    assert values == sorted(values)
    for (t0, _), (t1, p1) in itertools.pairwise(sent):
        assert t1 - t0 >= 0.25 or p1 == 100


def test_the_wire_shape() -> None:
    envelope = progress_action(ME.id, "render", "c1", ProgressUpdate(42.0, "half"))
    assert envelope.params.name == PROGRESS_ACTION == "progress"
    assert envelope.params.from_ == ME.id
    assert envelope.params.params == {"call_id": "c1", "action": "render", "percent": 42, "message": "half"}
    assert progress_action(ME.id, "r", "c", ProgressUpdate(12.3456, "")).params.params["percent"] == 12.35


class Steps(BaseModel):
    steps: int
    every: float
    report: bool = True


def _worker(timeout: float, max_duration: float | None = None) -> ActionDef:
    @action(id="work", description="Long work.", input=Steps, timeout=timeout, max_duration=max_duration)
    async def work(ctx: ActionContext[Steps]) -> Action:
        for i in range(ctx.input.steps):
            await trio.sleep(ctx.input.every)
            if ctx.input.report:
                await ctx.progress(100 * (i + 1) / ctx.input.steps, f"step {i + 1}")
        return Action.create(ctx.companion_id, "worked", {})

    return work


async def test_progress_reaches_clients_as_actions(autojump_clock: trio.testing.MockClock) -> None:
    runtime, recorder = make_runtime(_worker(timeout=5), progress_interval=0.25)
    result = await runtime.call("work", {"steps": 4, "every": 1}, call_id="c1")
    assert result.ok
    progress = [a for a in recorder.on(ACTIONS) if a.params.name == "progress"]
    assert [a.params.params["percent"] for a in progress] == [25, 50, 75, 100]
    assert progress[0].params.params == {
        "call_id": "c1",
        "action": "work",
        "percent": 25,
        "message": "step 1",
    }
    assert recorder.on(ACTIONS)[-1].params.name == "worked"


async def test_reporting_progress_keeps_a_long_call_alive(autojump_clock: trio.testing.MockClock) -> None:
    runtime, _ = make_runtime(_worker(timeout=5))
    start = trio.current_time()
    result = await runtime.call("work", {"steps": 8, "every": 3})  # 24 s of work, 5 s idle limit
    assert result.ok
    assert trio.current_time() - start == pytest.approx(24)


async def test_without_progress_the_same_call_times_out(autojump_clock: trio.testing.MockClock) -> None:
    runtime, _ = make_runtime(_worker(timeout=5))
    result = await runtime.call("work", {"steps": 8, "every": 3, "report": False})
    assert result.status == "timeout"


async def test_progress_cannot_stretch_a_call_past_its_cap(autojump_clock: trio.testing.MockClock) -> None:
    runtime, recorder = make_runtime(_worker(timeout=5, max_duration=12))
    start = trio.current_time()
    result = await runtime.call("work", {"steps": 100, "every": 1})
    assert result.status == "timeout"
    assert trio.current_time() - start == pytest.approx(12)
    assert not [a for a in recorder.on(ACTIONS) if a.params.name == "worked"]


async def test_rate_limit_uses_the_injected_clock() -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()

    @action(id="burst", description="Many reports.", input=Steps)
    async def burst(ctx: ActionContext[Steps]) -> list[Action]:
        for i in range(ctx.input.steps):
            await ctx.progress(i, "")
            clock.now += ctx.input.every
        return []

    runtime, recorder = make_runtime(burst, clock=clock, progress_interval=1.0)
    await runtime.call("burst", {"steps": 10, "every": 0.5})
    assert [a.params.params["percent"] for a in recorder.on(ACTIONS)] == [0, 2, 4, 6, 8]


async def test_progress_after_the_call_ended_goes_nowhere() -> None:
    leaked: list[ActionContext[Steps]] = []

    @action(id="leak", description="Keeps its context.", input=Steps)
    def leak(ctx: ActionContext[Steps]) -> list[Action]:
        leaked.append(ctx)
        return []

    runtime, recorder = make_runtime(leak)
    await runtime.call("leak", {"steps": 0, "every": 0})
    await leaked[0].progress(50, "too late")
    assert recorder.sent == []
