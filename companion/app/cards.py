"""Card files: ``companion card check`` (load each card exactly as a node would and report every
problem), and where a card named on the command line is found (the example cards ship inside the
package, so ``companion run pim`` works from any folder after ``pip install``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, TextIO

from companion.card.model import CardError, LoadedCard, load_card

__all__ = ["CARD_SUFFIXES", "card_files", "check_paths", "packaged_cards", "resolve_card"]

CARD_SUFFIXES: Final = (".yaml", ".yml", ".toml")
PACKAGED_FOLDER: Final = "cards"
"""The folder name a packaged card may be written under (``cards/pim.yaml``, as in the README)."""


def packaged_cards() -> Path:
    """The folder of the example cards installed with the package (``companion/cards``)."""
    return Path(__file__).resolve().parent.parent / PACKAGED_FOLDER


def resolve_card(arg: str | Path) -> Path:
    """The card file ``arg`` names: the path itself when it exists; else, for a bare name
    (``pim``, ``pim.yaml``) or ``cards/NAME`` that is not here, the packaged card of that name;
    else the path unchanged (:func:`companion.card.model.load_card` then says it cannot be read)."""
    path = Path(arg)
    if path.exists():
        return path
    if path.parent not in (Path(), Path(PACKAGED_FOLDER)) or (
        path.suffix and path.suffix not in CARD_SUFFIXES
    ):
        return path
    folder = packaged_cards()
    for suffix in (path.suffix,) if path.suffix else CARD_SUFFIXES:
        candidate = folder / f"{path.stem}{suffix}"
        if candidate.is_file():
            return candidate
    return path


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
            yield resolve_card(path)  # a missing file is reported by load_card


def _summary(loaded: LoadedCard) -> str:
    count = len(loaded.triggers)
    tools = ", ".join(loaded.tools) or "none"
    return f"{loaded.card.metadata.name}, {count} condition{'s' if count != 1 else ''}, tools: {tools}"
