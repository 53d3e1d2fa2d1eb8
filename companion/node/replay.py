"""Remember handled gossipsub message ids beyond gossipsub's own 120 s seen-cache, and across restarts.

A genuine signed message stays valid forever, so anyone who recorded it can publish it again
once the seen-cache has forgotten it, or once the node restarted with an empty memory. This
guard keeps the id of everything handled for ``window`` seconds, bounded by ``capacity`` (the
oldest are forgotten first), and with a ``path`` appends each id to a file in the node's data
directory, read back at start.

The file is one ``<unix time> <hex id>`` line per id, written through to the kernel at every
id (it survives the process being killed; not a power cut in the last moments) and rewritten
compactly at start and whenever it holds twice ``capacity`` lines. A file that cannot be read
or written costs a warning and leaves the guard in memory: it never refuses a message for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from companion.log import log_event

__all__ = ["ReplayGuard"]

logger = logging.getLogger("companion.node.replay")


class ReplayGuard:
    """A bounded, time-limited, optionally persistent set of message ids."""

    def __init__(
        self,
        capacity: int = 65536,
        *,
        window: float = 24 * 3600.0,
        path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1 or window <= 0:
            raise ValueError("capacity and window must be positive")
        self._capacity = capacity
        self._window = window
        self._clock = clock
        self._ids: OrderedDict[bytes, float] = OrderedDict()
        self._path = path
        self._file: IO[str] | None = None
        self._lines = 0
        if path is not None:
            self._load(path)

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return True  # an empty guard is still a guard (``replay or ReplayGuard()`` must keep it)

    def __contains__(self, msg_id: object) -> bool:
        seen = self._ids.get(msg_id) if isinstance(msg_id, bytes) else None
        return seen is not None and self._clock() - seen < self._window

    def remember(self, msg_id: bytes) -> bool:
        """Record ``msg_id``; ``False`` if it was already handled (a replay)."""
        if msg_id in self:
            return False
        now = self._clock()
        self._ids[msg_id] = now
        self._ids.move_to_end(msg_id)
        self._forget_old(now)
        if self._file is not None:
            self._append(msg_id, now)
        return True

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    # --- persistence ----------------------------------------------------------------------

    def _forget_old(self, now: float) -> None:
        while self._ids:
            oldest, seen = next(iter(self._ids.items()))
            if len(self._ids) <= self._capacity and now - seen < self._window:
                return
            del self._ids[oldest]

    def _load(self, path: Path) -> None:
        now = self._clock()
        kept: deque[tuple[bytes, float]] = deque(maxlen=self._capacity)
        unreadable = 0
        try:
            with path.open("r", encoding="ascii", errors="replace") as fh:
                for line in fh:
                    parsed = _parse(line)
                    if parsed is None:
                        unreadable += 1
                    elif now - parsed[1] < self._window:
                        kept.append(parsed)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._unusable("replay_store_unreadable", exc)
            return
        for msg_id, seen in sorted(kept, key=lambda item: item[1]):
            self._ids[msg_id] = seen
        if unreadable:
            log_event(logger, "replay_store_lines_skipped", logging.WARNING, path=str(path), lines=unreadable)
        self._rewrite()

    def _rewrite(self) -> None:
        assert self._path is not None
        self.close()
        tmp = self._path.with_suffix(self._path.suffix + ".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("w", encoding="ascii") as fh:
                fh.writelines(_lines(self._ids.items()))
            os.replace(tmp, self._path)
            self._file = self._path.open("a", encoding="ascii")
        except OSError as exc:
            self._unusable("replay_store_unwritable", exc)
            return
        self._lines = len(self._ids)

    def _append(self, msg_id: bytes, seen: float) -> None:
        assert self._file is not None
        try:
            self._file.writelines(_lines([(msg_id, seen)]))
            self._file.flush()
        except (OSError, ValueError) as exc:  # ValueError: the file was closed under us
            self._unusable("replay_store_unwritable", exc)
            return
        self._lines += 1
        if self._lines >= 2 * self._capacity:
            self._rewrite()

    def _unusable(self, event: str, exc: Exception) -> None:
        log_event(logger, event, logging.WARNING, path=str(self._path), error=repr(exc))
        self._file = None
        self._path = None


def _lines(items: Iterable[tuple[bytes, float]]) -> list[str]:
    return [f"{seen:.3f} {msg_id.hex()}\n" for msg_id, seen in items]


def _parse(line: str) -> tuple[bytes, float] | None:
    stamp, _, hexid = line.strip().partition(" ")
    try:
        msg_id, seen = bytes.fromhex(hexid), float(stamp)
    except ValueError:
        return None
    return (msg_id, seen) if msg_id and seen == seen else None
