"""The CPU-seconds plugin (``support.cputime``) tells a test that computes from one that waits:
what ``scripts/test.sh`` prints so that a slow run shows which tests need a core."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
TESTS = Path(__file__).resolve().parent

BUSY_AND_IDLE = """
import time

def test_busy():
    end = time.process_time() + 0.3  # CPU time, not the wall clock: the same on a busy machine
    while time.process_time() < end:
        pass

def test_idle():
    time.sleep(0.3)
"""
ROW = re.compile(r"\s*(?P<cpu>[\d.]+) cpu s\s+(?P<wall>[\d.]+) wall s\s+\S+::(?P<test>\w+)$")


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    """A busy and an idle test in a fresh pytest process that loads the plugin as the suite does."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_pair=BUSY_AND_IDLE)
    return pytester.runpytest_subprocess("-p", "support.cputime", "-p", "no:cacheprovider", *args)


def test_the_costliest_tests_are_listed_with_their_cpu_and_wall_seconds(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "--cpu-durations=5")
    result.assert_outcomes(passed=2)
    rows = {
        m["test"]: (float(m["cpu"]), float(m["wall"])) for line in result.outlines if (m := ROW.match(line))
    }
    assert list(rows) == ["test_busy", "test_idle"], result.outlines  # the costliest first
    busy_cpu, busy_wall = rows["test_busy"]
    idle_cpu, idle_wall = rows["test_idle"]
    assert busy_cpu >= 0.3 and busy_wall >= busy_cpu - 0.05
    assert idle_cpu < 0.1 and idle_wall >= 0.3
    assert any(line.startswith("2 tests: ") for line in result.outlines), result.outlines


def test_nothing_is_listed_unless_asked(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch)
    result.assert_outcomes(passed=2)
    assert not any("most CPU seconds" in line for line in result.outlines), result.outlines
