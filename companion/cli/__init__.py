"""The ``companion`` command. Each subcommand lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommand modules, each exposing ``register(subparsers) -> None``; the parser it adds
# sets ``func(args) -> int`` as its default.
SUBCOMMAND_MODULES: tuple[str, ...] = ("card", "run", "bridge", "listen", "demo", "relay", "trust")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="companion",
        description="Run and inspect AI companions on a peer-to-peer network (aikyo-compatible).",
    )
    from companion import __version__

    parser.add_argument("-V", "--version", action="version", version=f"companion {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(f"companion.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except BaseException as exc:  # Ctrl-C anywhere, also inside trio's exception groups
        from ..app.stopping import is_interrupt

        if is_interrupt(exc):
            return 130
        raise
