"""The ``companion`` command. Each subcommand lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

# Subcommand modules, each exposing ``register(subparsers) -> None``; the parser it adds
# sets ``func(args) -> int`` as its default.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "card",
    "run",
    "bridge",
    "listen",
    "demo",
    "relay",
    "trust",
    "action",
    "explain",
    "status",
)


class _PrintVersion(argparse.Action):
    """``-V``: the package's version and the data layout (imported when asked, not at start-up)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from companion.app.datadir import version_line

        print(version_line())  # on standard output, as argparse's own version action
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or, given the ``command`` about to run, of that one alone:
    each subcommand's module imports what it needs, and ``companion run`` need not pay for the
    bridge's (start-up time)."""
    parser = argparse.ArgumentParser(
        prog="companion",
        description="Run and inspect AI companions on a peer-to-peer network (aikyo-compatible).",
    )
    parser.add_argument(
        "-V",
        "--version",
        action=_PrintVersion,
        help="print the version and the data layout it writes, and exit",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        if command in SUBCOMMAND_MODULES and name != command:
            continue
        module = importlib.import_module(f"companion.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    from companion.app import collector

    if words[:1] == ["run"]:
        collector.pause()  # until its engines are ready (start-up time: see collector)
    try:
        parser = build_parser(words[0] if words else None)  # a subcommand comes first, or none runs
        args = parser.parse_args(words)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        return int(func(args))
    except BaseException as exc:  # Ctrl-C anywhere, also inside trio's exception groups
        from companion.app.stopping import is_interrupt

        if is_interrupt(exc):
            return 130
        raise
    finally:
        collector.resume()
