"""CPU seconds per test, beside pytest's wall-clock durations (a pytest plugin, registered in
``tests/conftest.py``; ``--cpu-durations=N`` lists the N costliest).

On a machine shared with other work the wall clock mostly says how busy the others were. The CPU
seconds a test burned (its process's, and those of the processes it started and reaped: nodes,
companions, JavaScript peers) say what it costs, and its wall time minus them roughly what it
waits for. ``scripts/test.sh`` prints both for each phase, so a slow run shows whether a test
needs a core or a deadline. The figure travels with the test's last report, so it also works
across pytest-xdist's workers.
"""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

__all__ = ["cpu_seconds"]

KEY = "cpu_seconds"
_started = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """User and system seconds of this process and of its children that were waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests that used the most CPU seconds (their own and their reaped processes')",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_started] = cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "teardown" and _started in item.stash:
        report.user_properties.append((KEY, round(cpu_seconds() - item.stash[_started], 2)))
    return report


def _measured(terminalreporter: pytest.TerminalReporter) -> list[tuple[float, float, str]]:
    """(CPU seconds, wall seconds, node id) of every test that reported its CPU seconds."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            wall[report.nodeid] = wall.get(report.nodeid, 0.0) + report.duration
            for key, value in report.user_properties:
                if key == KEY and isinstance(value, float | int):
                    cpu[report.nodeid] = float(value)
    return [(seconds, wall[nodeid], nodeid) for nodeid, seconds in cpu.items()]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    count = int(config.getoption("cpu_durations"))
    if count <= 0:
        return
    measured = sorted(_measured(terminalreporter), reverse=True)
    if not measured:
        return
    terminalreporter.write_sep("=", f"{min(count, len(measured))} most CPU seconds")
    for cpu, wall, nodeid in measured[:count]:
        terminalreporter.write_line(f"{cpu:7.2f} cpu s {wall:7.2f} wall s  {nodeid}")
    total_cpu = sum(cpu for cpu, _, _ in measured)
    total_wall = sum(wall for _, wall, _ in measured)
    terminalreporter.write_line(
        f"{len(measured)} tests: {total_cpu:.1f} cpu s in {total_wall:.1f} test-seconds of wall "
        f"({total_cpu / max(total_wall, 0.001):.0%} of one core while a test ran)"
    )
