"""``companion card check PATH...`` and ``companion card schema``: card tooling for authors.

``check`` loads each card exactly as a node would and prints ``OK`` or every problem found
(exit status 1 if any card is broken; :mod:`companion.app.cards`). ``schema`` prints the JSON
Schema of the card format, for editors that validate YAML against a schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


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
    from companion.app.cards import check_paths  # here, not at import: the card model costs every command

    return check_paths(args.paths, sys.stdout)


def _schema(args: argparse.Namespace) -> int:
    from companion.card.model import card_json_schema  # here, not at import (see _check)

    sys.stdout.write(json.dumps(card_json_schema(), indent=2, ensure_ascii=False) + "\n")
    return 0
