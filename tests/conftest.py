"""The root of the test tree. pytest puts this directory on ``sys.path`` (``pythonpath`` in
pyproject.toml) for every test, here and in ``integration/`` and ``browser/``, and on every
helper process's ``PYTHONPATH`` (``support.network.Proc``), so shared helpers live in one
package and are imported from it: ``from support.cards import write_card``."""

import pytest
import trio.testing

pytest_plugins = ["support.cputime"]  # CPU seconds per test: --cpu-durations=N


@pytest.fixture
def disk_clock() -> trio.testing.MockClock:
    """A mock clock for an engine on a real :class:`~companion.store.sqlite.Store`: it jumps only after
    50 ms of real idleness. The engine waits for the store's worker thread to commit a reply's
    mark before publishing; ``autojump_clock`` (threshold 0) takes that wait for idleness and
    moves time past the turn's deadlines while the disk writes."""
    return trio.testing.MockClock(autojump_threshold=0.05)
