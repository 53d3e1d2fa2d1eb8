"""``companion explain MESSAGE_ID``: why each local companion did (or did not) answer it.

Reads the decisions every companion under the data directories kept about the message (see
:mod:`companion.app.explain`), merged across them by time, one line per decision: the leader
and why, the states, the speaker and why, yields and model failures, the reply. Exit 0 when a
companion kept a decision about it, 1 when none did.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from companion.app.paths import default_data_dir

__all__ = ["add_data_dirs_argument", "data_dirs", "register"]


def add_data_dirs_argument(parser: argparse.ArgumentParser) -> None:
    """``--data-dir DIR`` (repeatable; default: the default data directory)."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help=f"a data directory of 'companion run' (repeatable; default: {default_data_dir()})",
    )


def data_dirs(args: argparse.Namespace) -> list[Path]:
    return list(dict.fromkeys(args.data_dir)) or [default_data_dir()]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why the local companions did or did not answer a message",
        description="Print every decision the companions under the data directories kept about "
        "MESSAGE_ID (leader, states, speaker and why, yields, model failures, the reply), merged "
        "across them in time order. Exit 1 when none kept one.",
    )
    parser.add_argument("message_id", metavar="MESSAGE_ID")
    add_data_dirs_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per decision")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from companion.app.explain import explain, explain_lines

    message, merged = explain(args.message_id, data_dirs(args))
    if args.json:
        print(json.dumps({"message": message}, ensure_ascii=False))
        for m in merged:
            row = {"at": m.at, "kind": m.kind, "level": m.level, "companions": m.companions}
            print(json.dumps({**row, "message_id": m.message_id, "fields": m.fields}, ensure_ascii=False))
    else:
        for line in explain_lines(args.message_id, message, merged):
            print(line)
    return 0 if merged else 1
