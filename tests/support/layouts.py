"""The fixture data directories of ``tests/layouts/`` (written by old releases, see its README):
unpacking one, and reading a store's rows and layout without changing the file."""

from __future__ import annotations

import hashlib
import sqlite3
import tarfile
from pathlib import Path
from typing import Final

LAYOUTS: Final = Path(__file__).resolve().parent.parent / "layouts"
FIXTURES: Final = sorted(p.name.removesuffix(".tar.gz") for p in LAYOUTS.glob("*.tar.gz"))
"""Each fixture's name: the date of the code that wrote it (and the release, for a release)."""
COMPANIONS: Final = ("companion_pim", "companion_ostra")
"""The companions each fixture ran (``cards/pim.yaml``, ``cards/ostra.yaml``)."""
TABLES: Final = ("messages", "memory", "seen", "companions", "action_store", "decisions")
"""The tables whose rows a migration must keep."""


def unpack(name: str, into: Path, as_name: str = "data") -> Path:
    """The fixture's data directory, unpacked as ``into/as_name``."""
    with tarfile.open(LAYOUTS / f"{name}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    target = into / as_name
    if as_name != "data":
        (into / "data").rename(target)
    return target


def rows(path: Path) -> dict[str, set[tuple[object, ...]]]:
    """Every row of each of :data:`TABLES` the file has (a file closed cleanly: opened as
    immutable, so that nothing, not even a ``-shm``, is written beside it)."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: set(db.execute(f"SELECT * FROM {n}")) for n in names if n in TABLES}
    finally:
        db.close()


def version(path: Path) -> int:
    """The file's ``PRAGMA user_version`` (its layout)."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def digest(directory: Path) -> dict[str, str]:
    """A hash of every file under ``directory``: to show nothing in it changed."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
