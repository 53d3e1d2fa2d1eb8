"""The collector pause of ``companion run``'s start-up (companion/app/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from companion.app import collector


@pytest.fixture(autouse=True)
def collecting() -> Iterator[None]:
    """Each test starts with collection on and nothing frozen, and leaves it so."""
    gc.enable()
    gc.unfreeze()
    yield
    collector.resume()
    gc.unfreeze()
    gc.enable()


def test_a_pause_stops_collection_and_its_resume_freezes_what_start_up_built() -> None:
    collector.pause()
    assert not gc.isenabled()
    built = [[i] for i in range(1000)]  # what start-up loads, living as long as the process
    collector.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built), "start-up's objects were not frozen"
    frozen = gc.get_freeze_count()
    late = [[i] for i in range(1000)]  # built after start-up: a second resume must not freeze it
    collector.resume()
    assert gc.get_freeze_count() < frozen + len(late), "a second resume froze again"


def test_resume_without_a_pause_leaves_the_process_as_it_was() -> None:
    """run_nodes resumes at the end of start-up; a test calling it in its own process never
    paused, and must not have its objects frozen."""
    collector.resume()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_someone_else_disabled_stays_disabled() -> None:
    gc.disable()
    collector.pause()
    collector.resume()
    assert not gc.isenabled() and gc.get_freeze_count() == 0
