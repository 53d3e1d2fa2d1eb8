"""Turns as a person meets them in `companion demo` (real companion processes, the offline
model): the companion a message names answers it, every companion gets a turn, closing moves
one stage a reply, and a demo with one companion ends in `terminal` after its reply (it used to
wait its whole timeout, as no turn opens for a reply addressed only to the person, and exit 1)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from support.cli import run_demo

pytestmark = pytest.mark.integration
STAGES = ["none", "pre-closing", "closing", "terminal"]


def test_a_demo_with_one_companion_ends_in_terminal_after_its_reply(tmp_path: Path) -> None:
    done, events = run_demo(tmp_path, "--timeout", "45", "pim")
    assert done.returncode == 0, done.stderr[-2000:]
    replies = [e for e in events if e["event"] == "message" and e["speaker"] == "companion_pim"]
    assert len(replies) == 1 and replies[0]["recipients"] == ["user_demo"]
    end = events[-1]
    assert end["event"] == "end" and end["closing"] == "terminal", end


def test_the_named_companion_answers_and_every_companion_speaks_in_turn(tmp_path: Path) -> None:
    done, events = run_demo(tmp_path, "--say", "Juniper, roll the dice for us!")
    assert done.returncode == 0, done.stderr[-2000:]
    replies = [e for e in events if e["event"] == "message" and e["speaker"] != "user_demo"]
    assert replies[0]["speaker"] == "companion_juniper", replies[0]
    assert {r["speaker"] for r in replies} == {"companion_ostra", "companion_pim", "companion_juniper"}
    stages = [STAGES.index(r["closing"]) for r in replies]
    assert all(b - a in (0, 1) for a, b in pairwise(stages)), stages
    assert events[-1]["event"] == "end" and events[-1]["closing"] == "terminal"
