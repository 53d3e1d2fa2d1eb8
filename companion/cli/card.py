"""``companion card check PATH...`` and ``companion card schema``: card tooling for authors.

``check`` loads each card exactly as a node would and prints ``OK`` or every problem found
(exit status 1 if any card is broken). ``schema`` prints the JSON Schema of the card format, for
editors that validate YAML against a schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..card import CardError, LoadedCard, card_json_schema, load_card

__all__ = ["CARD_SUFFIXES", "check_paths", "register"]

CARD_SUFFIXES = (".yaml", ".yml", ".toml")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("card", help="check companion cards, print the card schema")
    actions = parser.add_subparsers(dest="card_command", metavar="ACTION", required=True)

    check = actions.add_parser(
        "check",
        help="load cards as a node would; print OK or every problem (exit 1 if any is broken)",
    )
    check.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="card files or directories")
    check.set_defaults(func=_check)

    schema = actions.add_parser("schema", help="print the JSON Schema of the card format")
    schema.set_defaults(func=_schema)


def _check(args: argparse.Namespace) -> int:
    return check_paths(args.paths, sys.stdout)


def _schema(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(card_json_schema(), indent=2, ensure_ascii=False) + "\n")
    return 0


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
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in CARD_SUFFIXES and p.is_file())
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
