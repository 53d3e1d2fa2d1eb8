"""The root of the test tree. pytest puts this directory on ``sys.path`` (``pythonpath`` in
pyproject.toml) for every test, here and in ``integration/`` and ``browser/``, and on every
helper process's ``PYTHONPATH`` (``support.network.Proc``), so shared helpers live in one
package and are imported from it: ``from support.cards import write_card``."""

import logging
from collections.abc import Iterator

import pytest
import trio.testing
from hypothesis import HealthCheck, settings

pytest_plugins = ["support.cputime"]  # CPU seconds per test: --cpu-durations=N

# Hypothesis times each example (a 200 ms deadline) and each draw of inputs (the too_slow health
# check) by the wall clock: on a busy machine with three workers one example of
# test_paramfit.py waited 2.9 s for a core and failed without any code being wrong. Properties are
# checked here, speed in scripts/bench_*; this profile is loaded before any test module, so every
# @settings(...) inherits it unless it says otherwise.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture
def disk_clock() -> trio.testing.MockClock:
    """A mock clock for an engine on a real :class:`~companion.store.sqlite.Store`: it jumps only after
    50 ms of real idleness. The engine waits for the store's worker thread to commit a reply's
    mark before publishing; ``autojump_clock`` (threshold 0) takes that wait for idleness and
    moves time past the turn's deadlines while the disk writes."""
    return trio.testing.MockClock(autojump_threshold=0.05)


@pytest.fixture(autouse=True)
def _loggers_as_they_were() -> Iterator[None]:
    """The ``companion`` and ``libp2p`` loggers put back after every test: a command's ``main``
    run in the test process configures them as a run does (its own handler, no propagation),
    and the next test in that worker then read no record through ``caplog`` (a streaming test
    failed so whenever it ran after ``test_bridge_cli.py``, in one order of the suite)."""
    saved = [
        (logger, logger.handlers[:], logger.level, logger.propagate)
        for logger in (logging.getLogger("companion"), logging.getLogger("libp2p"))
    ]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
