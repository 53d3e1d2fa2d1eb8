"""The replay guard: handled message ids survive a restart for the replay window, bounded in count,
and a store that cannot be used never refuses a message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from companion.node.replay import ReplayGuard


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_ids_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "replay" / "a.ids"
    first = ReplayGuard(100, path=path)
    assert first.remember(b"one") and first.remember(b"two")
    assert not first.remember(b"one")
    first.close()
    again = ReplayGuard(100, path=path)
    assert b"one" in again and b"two" in again and b"three" not in again
    assert not again.remember(b"two")


def test_ids_written_before_a_kill_are_on_disk(tmp_path: Path) -> None:
    """Each id reaches the kernel when remembered: a killed process (no close) keeps them."""
    path = tmp_path / "a.ids"
    guard = ReplayGuard(100, path=path)
    guard.remember(b"\x00\x01")
    assert b"\x00\x01" in ReplayGuard(100, path=path)  # read while the first is still open


def test_ids_expire_after_the_window_also_across_restarts(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "a.ids"
    guard = ReplayGuard(100, window=60.0, path=path, clock=clock)
    guard.remember(b"old")
    clock.now += 30
    guard.remember(b"new")
    clock.now += 40  # old: 70 s, new: 40 s
    assert b"old" not in guard and b"new" in guard
    guard.close()
    again = ReplayGuard(100, window=60.0, path=path, clock=clock)
    assert len(again) == 1 and b"new" in again
    assert again.remember(b"old")  # a replay older than the window passes (documented)


def test_count_bound_in_memory_and_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    guard = ReplayGuard(10, path=path)
    for n in range(45):
        guard.remember(n.to_bytes(2, "big"))
    assert len(guard) == 10
    assert (0).to_bytes(2, "big") not in guard and (44).to_bytes(2, "big") in guard
    # rewritten compactly whenever it holds twice the bound
    assert len(path.read_text().splitlines()) < 2 * 10
    guard.close()
    again = ReplayGuard(10, path=path)
    assert len(again) == 10 and (44).to_bytes(2, "big") in again


def test_unreadable_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    guard = ReplayGuard(100, path=path)
    guard.remember(b"kept")
    guard.close()
    with path.open("a") as fh:
        fh.write("garbage\n12.5 zz\nnan 00ff\n\n")
    again = ReplayGuard(100, path=path)
    assert len(again) == 1 and b"kept" in again


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_store_keeps_the_guard_in_memory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    guard = ReplayGuard(100, path=locked / "sub" / "a.ids")
    assert guard.remember(b"x") and b"x" in guard and not guard.remember(b"x")


def test_a_store_that_fails_on_write_keeps_the_guard_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    guard = ReplayGuard(100, path=path)
    assert guard._file is not None
    guard._file.close()  # as if the disk went away: writes now raise
    assert guard.remember(b"x") and b"x" in guard and not guard.remember(b"x")


def test_an_empty_guard_is_still_a_guard() -> None:
    assert ReplayGuard(10)  # ``replay or ReplayGuard()`` must keep the one given
