"""Routine scheduling, pure: events and a fake clock in, firings out, every bound kept."""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import pytest
from pydantic import BaseModel

from companion.actions import ActionContext, ActionDef, KnowledgeDef, action, knowledge
from companion.actions.builtins import speak
from companion.card.routines import (
    MAX_PENDING,
    CompanionJoined,
    CompanionLeft,
    CompiledRoutine,
    ConversationBusy,
    ConversationIdle,
    Firing,
    MessageSeen,
    Routine,
    RoutineError,
    RoutineFinished,
    RoutineScheduler,
    compile_routines,
    parse_duration,
)
from companion.protocol import Action, Message

ME = "companion_me"


class Empty(BaseModel):
    pass


@action(id="ping", description="Ping a client.", input=Empty, timeout=5)
def ping(ctx: ActionContext[Empty]) -> Action:
    return Action.create(ctx.companion_id, "ping", {})


@knowledge(id="look", description="Look around.", input=Empty, output=str, timeout=5)
def look(ctx: ActionContext[Empty]) -> str:
    return "nothing"


def compiled(*specs: dict[str, Any]) -> tuple[CompiledRoutine, ...]:
    tools: dict[str, ActionDef | KnowledgeDef] = {"speak": speak, "ping": ping, "look": look}
    routines = [Routine.model_validate(spec) for spec in specs]
    return compile_routines(routines, [tools[r.tool] for r in routines])


class Clock:
    """The fake clock: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def scheduler(*specs: dict[str, Any], clock: Clock, companions: tuple[str, ...] = ()) -> RoutineScheduler:
    return RoutineScheduler(compiled(*specs), me=ME, now=clock.now, companions=companions)


def run_until(s: RoutineScheduler, clock: Clock, until: float) -> list[Firing]:
    """The shell's loop: take what is due now (as after an event), then sleep to each deadline
    until ``until``; report each firing finished at once."""
    fired: list[Firing] = []
    for firing in s.due(clock.now):
        fired.append(firing)
        s.observe(RoutineFinished(firing.routine), clock.now)
    for _ in range(10_000):
        deadline = s.deadline()
        if deadline > until:
            clock.now = until
            break
        clock.now = max(clock.now, deadline)
        for firing in s.due(clock.now):
            fired.append(firing)
            s.observe(RoutineFinished(firing.routine), clock.now)
    return fired


def said(sender: str, text: str = "hello", to: tuple[str, ...] = (ME,)) -> MessageSeen:
    return MessageSeen(Message.create(sender, list(to), text))


SPEAK_TO_ALL = {"emotion": "neutral"}
SPEAK_ARGS = {"to": "companions", "message": '"Anyone there?"'}


# --- every ----------------------------------------------------------------------------------------


def test_every_fires_once_per_interval_and_says_when_next() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": "1m"}, clock=clock)
    assert s.deadline() == clock.now + 60
    assert s.due(clock.advance(59.9)) == []
    [firing] = s.due(clock.advance(0.1))
    assert firing == Firing("ping#0", "ping", {}, "every", clock.now, speaks=False)
    assert s.due(clock.now) == []  # still running
    s.observe(RoutineFinished("ping#0"), clock.now)
    assert s.deadline() == clock.now + 60
    fired = run_until(s, clock, clock.now + 600)
    assert [f.at - 1000 for f in fired] == [120 + 60 * i for i in range(10)]


def test_a_longer_cooldown_spaces_an_every_routine() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": 10, "cooldown": 25}, clock=clock)
    fired = run_until(s, clock, clock.now + 100)
    assert [f.at - 1000 for f in fired] == [10, 35, 60, 85]


def test_a_running_firing_is_never_doubled_and_missed_ticks_do_not_pile_up() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": 10}, clock=clock)
    [first] = s.due(clock.advance(10))
    assert s.deadline() == math.inf  # nothing until it finishes
    assert s.due(clock.advance(95)) == []  # nine ticks passed while it ran
    s.observe(RoutineFinished(first.routine), clock.now)
    assert len(s.due(clock.now)) == 1  # one firing, not nine
    s.observe(RoutineFinished(first.routine), clock.now)
    assert s.deadline() == clock.now + 10


def test_a_speaking_routine_waits_for_the_conversation_to_go_quiet() -> None:
    clock = Clock()
    s = scheduler({"tool": "speak", "every": 30, "input": SPEAK_TO_ALL, "args": SPEAK_ARGS}, clock=clock)
    s.observe(ConversationBusy(), clock.advance(5))
    assert s.deadline() == math.inf
    assert s.due(clock.advance(100)) == []
    s.observe(ConversationIdle(), clock.advance(1))
    [firing] = s.due(clock.now)
    assert firing.speaks and firing.input == {"emotion": "neutral", "to": [], "message": "Anyone there?"}


def test_a_routine_that_does_not_speak_runs_during_a_conversation() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": 30}, clock=clock)
    s.observe(ConversationBusy(), clock.now)
    assert len(s.due(clock.advance(30))) == 1


def test_the_firing_count_is_bounded() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": 1, "max_fires": 5}, clock=clock)
    fired = run_until(s, clock, clock.now + 3600)
    assert len(fired) == 5 and s.fired("ping#0") == 5
    assert s.deadline() == math.inf


def test_a_guard_skips_a_tick_and_is_read_when_the_routine_is_due() -> None:
    clock = Clock()
    s = scheduler(
        {
            "tool": "speak",
            "every": 60,
            "when": "size(companions) > 0",
            "input": SPEAK_TO_ALL,
            "args": SPEAK_ARGS,
        },
        clock=clock,
    )
    assert s.due(clock.advance(60)) == []
    assert s.skipped[("speak#0", "guard")] == 1
    s.observe(CompanionJoined("companion_ben", "Ben"), clock.advance(10))
    assert s.due(clock.now) == []  # the next tick, not at once
    [firing] = s.due(clock.advance(50))
    assert firing.input["to"] == ["companion_ben"]


# --- idle -----------------------------------------------------------------------------------------


def test_idle_fires_once_per_silence_and_only_anothers_message_rearms_it() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "idle": "5m"}, clock=clock)
    s.observe(said("companion_ben"), clock.advance(100))
    assert s.deadline() == clock.now + 300
    assert s.due(clock.advance(299)) == []
    [firing] = s.due(clock.advance(1))
    assert firing.kind == "idle"
    s.observe(RoutineFinished(firing.routine), clock.now)
    assert s.deadline() == math.inf and s.due(clock.advance(3000)) == []
    s.observe(said(ME, "talking to myself"), clock.now)  # its own words end silence, do not rearm
    assert s.due(clock.advance(3000)) == []
    s.observe(said("companion_ben"), clock.now)
    assert s.due(clock.advance(299)) == []
    assert len(s.due(clock.advance(1))) == 1


def test_idle_counts_from_the_last_message_of_anyone() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "idle": 60}, clock=clock)
    for _ in range(5):
        s.observe(said("companion_ben"), clock.advance(30))
    s.observe(said(ME), clock.advance(30))
    assert s.deadline() == clock.now + 60
    assert s.due(clock.advance(59)) == [] and len(s.due(clock.advance(1))) == 1


def test_the_guard_sees_the_silence() -> None:
    clock = Clock()
    s = scheduler(
        {"tool": "ping", "idle": 10, "when": "idle_seconds >= 10.0 && !busy && fired == 0"}, clock=clock
    )
    assert len(s.due(clock.advance(10))) == 1


# --- on: joined / left ------------------------------------------------------------------------------

GREET = {
    "tool": "speak",
    "on": "joined",
    "input": {"emotion": "happy"},
    "args": {"to": "[companion_id]", "message": '"Welcome, " + companion_name + "!"'},
}


def test_a_newcomer_is_greeted_by_name_once() -> None:
    clock = Clock()
    s = scheduler(GREET, clock=clock, companions=("companion_old",))
    s.observe(CompanionJoined("companion_old", "Old"), clock.now)  # already here: not new
    s.observe(CompanionJoined(ME, "Me"), clock.now)  # itself
    assert s.deadline() == math.inf
    s.observe(CompanionJoined("companion_ben", "Ben"), clock.advance(1))
    assert s.deadline() == clock.now
    [firing] = s.due(clock.now)
    assert firing.input == {"emotion": "happy", "to": ["companion_ben"], "message": "Welcome, Ben!"}
    assert firing.kind == "joined" and firing.speaks


def test_several_newcomers_are_greeted_one_cooldown_apart() -> None:
    clock = Clock()
    s = scheduler({**GREET, "cooldown": "5s"}, clock=clock)
    for name in ("Ben", "Cai", "Dov"):
        s.observe(CompanionJoined(f"companion_{name.lower()}", name), clock.now)
    fired = run_until(s, clock, clock.now + 60)
    assert [(f.input["message"], f.at - 1000) for f in fired] == [
        ("Welcome, Ben!", 0),
        ("Welcome, Cai!", 5),
        ("Welcome, Dov!", 10),
    ]


def test_a_join_flood_is_bounded_by_the_queue_and_the_count() -> None:
    clock = Clock()
    s = scheduler({**GREET, "cooldown": 1, "max_fires": 20}, clock=clock)
    for i in range(1000):  # e.g. forged or flapping memberships, all at once
        s.observe(CompanionJoined(f"companion_{i}", str(i)), clock.now)
    assert s.skipped[("speak#0", "pending_full")] == 1000 - MAX_PENDING
    fired = run_until(s, clock, clock.now + 3600)
    assert len(fired) == MAX_PENDING
    for i in range(1000, 1100):
        s.observe(CompanionJoined(f"companion_{i}", str(i)), clock.advance(1))
        fired += run_until(s, clock, clock.now)
    assert len(fired) == 20 and s.deadline() == math.inf


def test_a_greeting_waits_for_a_busy_conversation_but_not_forever() -> None:
    clock = Clock()
    s = scheduler({**GREET, "max_wait": "1m"}, clock=clock)
    s.observe(ConversationBusy(), clock.now)
    s.observe(CompanionJoined("companion_ben", "Ben"), clock.now)
    s.observe(ConversationIdle(), clock.advance(30))
    assert len(s.due(clock.now)) == 1  # waited 30 s: still welcome
    s.observe(RoutineFinished("speak#0"), clock.now)
    s.observe(ConversationBusy(), clock.now)
    s.observe(CompanionJoined("companion_cai", "Cai"), clock.advance(20))
    s.observe(ConversationIdle(), clock.advance(61))
    assert s.due(clock.now) == []  # a minute too late: dropped, not said
    assert s.skipped[("speak#0", "expired")] == 1


@pytest.mark.parametrize(
    "spec",
    [
        {"tool": "ping", "every": 30, "max_fires": 1},
        {"tool": "ping", "idle": 30, "max_fires": 1},
        {"tool": "ping", "on": "joined", "max_fires": 1, "max_wait": 60},
    ],
    ids=["every", "idle", "joined"],
)
def test_a_firing_given_back_comes_again_and_does_not_count(spec: dict[str, Any]) -> None:
    clock = Clock()
    s = scheduler(spec, clock=clock)
    s.observe(CompanionJoined("companion_ben", "Ben"), clock.advance(30))
    [firing] = s.due(clock.now)
    assert s.give_back(firing, clock.advance(1)) and not s.give_back(firing, clock.now)
    assert s.fired(firing.routine) == 0 and s.deadline() <= clock.now
    [again] = s.due(clock.now)
    assert again.input == firing.input
    s.observe(RoutineFinished(again.routine), clock.now)
    assert not s.give_back(again, clock.now)  # finished: nothing to undo
    assert s.fired(again.routine) == 1 and s.deadline() == math.inf  # max_fires: 1


def test_a_leaving_companion_fires_the_left_routine() -> None:
    clock = Clock()
    s = scheduler(
        {"tool": "ping", "on": "left", "when": 'companion_id.startsWith("companion_")'}, clock=clock
    )
    s.observe(CompanionLeft("companion_ben"), clock.now)  # never joined: nothing to leave
    assert s.due(clock.now) == []
    s.observe(CompanionJoined("companion_ben", "Ben"), clock.now)
    s.observe(CompanionLeft("companion_ben", "Ben"), clock.advance(1))
    [firing] = s.due(clock.now)
    assert firing.kind == "left"


# --- on: message ------------------------------------------------------------------------------------


def test_a_message_matching_the_guard_fires_and_others_do_not() -> None:
    clock = Clock()
    s = scheduler(
        {
            "tool": "speak",
            "on": "message",
            "when": 'addressed && text.lowerAscii().contains("comet") && sender != "companion_bot"',
            "input": {"emotion": "happy"},
            "args": {"to": "[sender]", "message": '"Comets! " + text'},
            "cooldown": 1,
        },
        clock=clock,
    )
    s.observe(said("companion_ben", "Nice weather"), clock.now)
    s.observe(said("companion_ben", "A COMET!", to=("companion_cai",)), clock.now)  # not to me
    s.observe(said("companion_bot", "comet comet"), clock.now)
    s.observe(said(ME, "a comet, I said"), clock.now)  # its own words never trigger it
    assert s.due(clock.now) == [] and s.skipped[("speak#0", "guard")] == 3
    s.observe(said("companion_ben", "Look, a Comet"), clock.now)
    [firing] = s.due(clock.now)
    assert firing.input == {"emotion": "happy", "to": ["companion_ben"], "message": "Comets! Look, a Comet"}


def test_a_message_flood_fires_at_most_once_per_cooldown() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "on": "message", "cooldown": "2s", "max_fires": 10_000}, clock=clock)
    fired: list[Firing] = []
    for _ in range(1500):  # 150 messages a second for 10 s
        s.observe(said("companion_ben"), clock.advance(1 / 150))
        fired += run_until(s, clock, clock.now)
    gaps = [b.at - a.at for a, b in itertools.pairwise(fired)]
    assert 5 <= len(fired) <= 6 and all(gap >= 2 - 1e-9 for gap in gaps)


def test_hostile_metadata_is_an_error_value_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "on": "message", "when": "metadata.mood == 1"}, clock=clock)
    for metadata in ({"mood": 2**80}, {"mood": float("nan")}, {}, {"mood": [None, {"x": True}]}):
        message = Message.create("companion_ben", [ME], "hi", metadata=metadata)
        with caplog.at_level(logging.WARNING, logger="companion.card.routines"):
            s.observe(MessageSeen(message), clock.now)
    assert s.due(clock.now) == []
    assert s.skipped[("ping#0", "guard")] == 4
    s.observe(MessageSeen(Message.create("companion_ben", [ME], "hi", metadata={"mood": 1})), clock.now)
    assert len(s.due(clock.now)) == 1


def test_an_args_error_at_fire_time_skips_the_firing() -> None:
    clock = Clock()
    s = scheduler(
        {
            "tool": "speak",
            "on": "message",
            "input": {"emotion": "sad", "to": []},
            "args": {"message": "metadata.note"},
        },
        clock=clock,
    )
    s.observe(said("companion_ben"), clock.now)
    assert s.due(clock.now) == [] and s.skipped[("speak#0", "args_error")] == 1
    s.observe(
        MessageSeen(Message.create("companion_ben", [ME], "x", metadata={"note": "kept"})), clock.advance(60)
    )
    assert s.due(clock.now)[0].input["message"] == "kept"


# --- several routines, and compiling ----------------------------------------------------------------


def test_routines_are_independent_and_due_in_card_order() -> None:
    clock = Clock()
    s = scheduler({"tool": "ping", "every": 10}, {"tool": "look", "every": 10}, clock=clock)
    assert [f.tool for f in s.due(clock.advance(10))] == ["ping", "look"]
    s.observe(RoutineFinished("look#1"), clock.now)
    assert [f.tool for f in s.due(clock.advance(10))] == ["look"]  # ping is still running


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(300, 300.0), ("300", 300.0), ("45s", 45.0), ("5m", 300.0), ("1h30m", 5400.0), (" 2h ", 7200.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "", "m", True, None, [5], float("inf"), "1m 5h"])
def test_not_durations(text: object) -> None:
    assert parse_duration(text) is None


def test_compile_reports_every_problem_with_its_path() -> None:
    with pytest.raises(RoutineError) as info:
        compiled(
            {"tool": "ping"},
            {"tool": "ping", "every": "0.5s"},
            {"tool": "ping", "idle": 5, "on": "joined"},
            {"tool": "ping", "on": "message", "when": "txt == 1"},
            {"tool": "ping", "every": 10, "cooldown": 5},
            {"tool": "ping", "every": 10, "name": "same"},
            {"tool": "ping", "every": 20, "name": "same"},
        )
    paths = {p.path: p for p in info.value.problems}
    assert set(paths) == {
        (0,),
        (1, "every"),
        (2, "on"),
        (3, "when"),
        (4, "cooldown"),
        (6, "name"),
    }
    assert "no trigger" in paths[(0,)].message and "every: 10m" in paths[(0,)].fix
    assert "between 1 s" in paths[(1, "every")].message
    assert "did you mean 'text'?" in paths[(3, "when")].fix
    assert paths[(3, "when")].excerpt.endswith("^")


def test_quiet_start_and_rejoin_grace() -> None:
    """Companions found in the quiet start are no newcomers; a flapping one is neither greeted
    again nor seen off; one gone longer than the grace is both."""
    clock = Clock()
    s = RoutineScheduler(
        compiled(
            {"tool": "ping", "on": "joined", "cooldown": 1}, {"tool": "ping", "on": "left", "cooldown": 1}
        ),
        me=ME,
        now=clock.now,
        quiet_until=clock.now + 5,
        rejoin_grace=30,
    )
    s.observe(CompanionJoined("companion_old", "Old"), clock.advance(1))
    assert s.deadline() >= clock.now + 4 and s.due(clock.advance(10)) == []
    s.observe(CompanionLeft("companion_old", "Old"), clock.advance(1))
    assert s.due(clock.advance(10)) == []  # the goodbye waits out the grace
    s.observe(CompanionJoined("companion_old", "Old"), clock.advance(1))
    assert s.due(clock.advance(60)) == []  # back within it: no hello, no goodbye
    assert s.skipped[("ping#0", "rejoined")] == 1 and s.skipped[("ping#1", "rejoined")] == 1
    s.observe(CompanionLeft("companion_old", "Old"), clock.now)
    assert s.deadline() == clock.now + 30
    [left] = s.due(clock.advance(31))
    assert left.kind == "left" and left.input == {}
    s.observe(RoutineFinished(left.routine), clock.now)
    s.observe(CompanionJoined("companion_old", "Old"), clock.advance(1))
    [joined] = s.due(clock.now)
    assert joined.kind == "joined"
