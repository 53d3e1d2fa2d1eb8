"""Flags more than one command shares, and how their values are read."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = [
    "TOKEN_ENV",
    "add_log_level_arguments",
    "add_metrics_argument",
    "add_multiaddr_argument",
    "add_no_mdns_argument",
    "chosen_log_level",
    "log_level",
    "metrics_address",
    "parse_ws_address",
    "resolve_token",
    "standalone_args",
]

_LEVELS: Final = ("ERROR", "WARNING", "INFO", "DEBUG")


def add_log_level_arguments(parser: argparse.ArgumentParser, default: str, events: str) -> None:
    """``-v``/``--verbose`` (one level more each time) and ``--log-level NAME`` (overrides ``-v``),
    the same on every command; ``events`` says what ``-v`` shows there."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help=f"log more: -v {events}, -vv more still, up to DEBUG; default {default}",
    )
    parser.add_argument("--log-level", default=None, help="log level by name (overrides -v)")
    parser.set_defaults(log_level_default=default)


def log_level(name: str | None, verbose: int, default: str = "WARNING") -> str:
    """``--log-level NAME`` if given, else ``default`` raised one level per ``-v`` (up to DEBUG).
    A conversation logs hundreds of INFO events, which a person at a terminal does not want."""
    if name:
        return name.upper()
    start = _LEVELS.index(default)
    return _LEVELS[min(start + verbose, len(_LEVELS) - 1)]


def chosen_log_level(args: argparse.Namespace) -> str:
    """The level :func:`add_log_level_arguments`' flags chose."""
    return log_level(args.log_level, args.verbose, args.log_level_default)


TOKEN_ENV: Final = "COMPANION_BRIDGE_TOKEN"


def parse_ws_address(value: str, flag: str = "--ws") -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080``, ``localhost:0`` or just ``8080`` (on 127.0.0.1);
    a ``ValueError`` naming ``flag`` otherwise."""
    text = value.strip()
    if text.startswith("ws://"):
        text = text[len("ws://") :].rstrip("/")
    if text.isdigit():
        return "127.0.0.1", _port(text, value, flag)
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{flag} {value!r}: write an IPv6 address as [::1]:8080")
        return host, _port(port, value, flag)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{flag} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host, _port(port, value, flag)


def _port(text: str, value: str, flag: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"{flag} {value!r}: the port must be a number from 0 to 65535")
    return int(text)


def add_multiaddr_argument(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A libp2p address flag that may be given again and again (``--listen``, ``--peer``,
    ``--relay``): a list, empty when not given."""
    parser.add_argument(flag, action="append", default=[], metavar="MULTIADDR", help=help)


def add_no_mdns_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-mdns``, the same for every command that runs a node."""
    parser.add_argument("--no-mdns", action="store_true", help="do not discover peers on the LAN")


def standalone_args(
    command: str, register: Callable[[Any], None], argv: Sequence[str] | None
) -> argparse.Namespace:
    """``python -m companion.cli.COMMAND ...``: the arguments of one command parsed as
    ``companion COMMAND ...`` parses them (``argv`` defaults to the process's own)."""
    parser = argparse.ArgumentParser(prog="companion")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args([command, *(sys.argv[1:] if argv is None else argv)])


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    """``--metrics HOST:PORT``: Prometheus' ``/metrics`` and the health checks there."""
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics (/metrics) and health checks (/healthz, /readyz) here, "
        "e.g. 127.0.0.1:9464 (port 0 picks one); see docs/operations.md",
    )


def metrics_address(args: argparse.Namespace) -> tuple[str, int] | None:
    """The ``--metrics`` address (``None`` without it); ``ValueError`` for a bad one."""
    return None if args.metrics is None else parse_ws_address(args.metrics, "--metrics")


def resolve_token(arg: str | None) -> str | None:
    """``--token X`` -> X; ``--token`` -> $COMPANION_BRIDGE_TOKEN or a fresh random token; absent
    -> $COMPANION_BRIDGE_TOKEN or no token."""
    env = os.environ.get(TOKEN_ENV) or None
    if arg is None:
        return env
    if arg:
        return arg
    return env or secrets.token_urlsafe(18)
