"""``companion card check``: load each card exactly as a node would and report every problem."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, TextIO

from ..card import CardError, LoadedCard, load_card

__all__ = ["CARD_SUFFIXES", "card_files", "check_paths"]

CARD_SUFFIXES: Final = (".yaml", ".yml", ".toml")


def card_files(folder: Path) -> list[Path]:
    """The card files in ``folder``, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in CARD_SUFFIXES and p.is_file())


def check_paths(paths: Sequence[Path], out: TextIO) -> int:
    """Check every card under ``paths``; write one report per card; 0 if all are good, else 1."""
    broken = 0
    for path in _card_files(paths, out):
        try:
            loaded = load_card(path)
        except CardError as err:
            broken += 1
            out.write(f"{err}\n")
        else:
            out.write(f"OK {path} ({_summary(loaded)})\n")
    return 1 if broken else 0


def _card_files(paths: Sequence[Path], out: TextIO) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            found = card_files(path)
            if not found:
                out.write(f"note: {path} holds no .yaml, .yml or .toml cards\n")
            yield from found
        elif path.exists() and path.suffix.lower() not in CARD_SUFFIXES:
            out.write(f"skipped {path} (not a .yaml, .yml or .toml file)\n")
        else:
            yield path  # a missing file is reported by load_card


def _summary(loaded: LoadedCard) -> str:
    count = len(loaded.triggers)
    tools = ", ".join(loaded.tools) or "none"
    return f"{loaded.card.metadata.name}, {count} condition{'s' if count != 1 else ''}, tools: {tools}"
