"""``companion status``: the companions of this machine's data directories, running or not,
the companions each one sees, and the last turns they took part in (see
:mod:`companion.app.status`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from companion.cli.explain import add_data_dirs_argument, data_dirs

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the companions of the data directories: running or not, whom they see, last turns",
        description="For each data directory: each companion (running or not, its peer id, the "
        "companions it sees) and the last turns they took part in, merged.",
    )
    add_data_dirs_argument(parser)
    parser.add_argument("--turns", type=int, default=5, metavar="N", help="last turns shown (default 5)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from companion.app.status import status_lines

    if args.turns < 0:
        print("companion status: --turns must not be negative", file=sys.stderr)
        return 2
    for line in status_lines(data_dirs(args), args.turns):
        print(line)
    return 0
