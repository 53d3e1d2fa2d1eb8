"""The data directory, claimed before a companion starts: one process per companion, layouts current.

Why here, before any node starts: a second process for a companion that runs already must
leave the first untouched (no node bound, no key read, no file written), and a directory of a
newer release must be refused before anything in it changes; an older one is migrated while
nothing else has it open. The locks are held until every node and store of the process closed.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from companion.store.dirlock import DirectoryLock
from companion.store.layout import DATA_LAYOUT, LayoutError, migrate_sqlite, prepare_data_dir, refuse_newer
from companion.store.sqlite import DB_FILENAME

__all__ = ["hold_data_dirs", "hold_key", "version_line"]


@contextlib.asynccontextmanager
async def hold_data_dirs(data_dir: Path, companion_ids: Sequence[str]) -> AsyncIterator[None]:
    """Lock each companion's directory under ``data_dir`` (raising
    :class:`~companion.store.dirlock.DirectoryInUse`, exit 2, when another process holds one), then
    bring the data directory and each companion's store to the current layout (raising
    :class:`~companion.store.layout.LayoutError`, exit 2, for a newer one); released on exit. An
    async context manager so that ``run_nodes`` enters it with its nursery, in one statement."""
    with contextlib.ExitStack() as stack:
        for cid in companion_ids:
            stack.enter_context(DirectoryLock(data_dir / cid, what=cid))
        stores = [data_dir / cid / DB_FILENAME for cid in companion_ids]
        refuse_newer(data_dir, stores)  # everything is checked before anything is written
        prepare_data_dir(data_dir)
        for path in stores:
            try:
                migrate_sqlite(path)
            except sqlite3.Error as exc:
                raise LayoutError(f"{path}: cannot migrate it: {exc}; it was left as it was") from None
        yield


def version_line() -> str:
    """What ``companion -V`` prints: the package's version and the data layout it writes."""
    from companion import __version__

    return f"companion {__version__} (data layout {DATA_LAYOUT})"


def hold_key(key_path: Path | None, what: str) -> contextlib.AbstractContextManager[object]:
    """An OS lock beside a node's key file (``keys/bridge.key`` -> ``keys/bridge.lock``), held
    while the node runs: two processes with one key are one peer id twice on the network. No
    key file (an ephemeral key): nothing to hold."""
    if key_path is None:
        return contextlib.nullcontext()
    return DirectoryLock(key_path.parent, what=what, filename=key_path.stem + ".lock")
