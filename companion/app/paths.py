"""Where the commands keep things by default: one data directory for keys, history and trust."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_data_dir"]


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/companion``, else ``~/.local/share/companion``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "companion"
