"""``companion action run CARD TOOL --input JSON [--dry-run]``: run one tool, print its result.

Live (the default), the tool runs in the running companion, through the bridge of its
``companion run --ws`` (``POST /actions/TOOL``): its own runtime, store, approvals and
network identity. ``--dry-run`` runs it here, offline, and prints the envelopes it would have
published. Either way the typed result is printed as one JSON object on stdout; the exit status
is 0 when the call succeeded, 2 for what the caller can fix (an unknown tool: the message lists
the available ones; an invalid input: every field that is wrong; a bad ``--input``, a wrong
token), 1 when the tool failed (the result carries its status and code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from companion.cli.options import TOKEN_ENV, add_log_level_arguments, chosen_log_level

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "action",
        help="run a companion's tool from the command line",
        description="Run a companion's tools directly, through the same checks as a model's call.",
    )
    commands = parser.add_subparsers(dest="action_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run one tool and print its typed result as JSON",
        description="Run TOOL of the companion of CARD: in the running companion (through its "
        "bridge, see `companion run --ws`), or here offline with --dry-run.",
    )
    run.add_argument("card", metavar="CARD", help="the companion's card file (or, live, its companion id)")
    run.add_argument("tool", metavar="TOOL", help="the tool's id (as the model sees it)")
    run.add_argument("--input", default="{}", metavar="JSON", help="the tool's input, a JSON object")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="run here, offline: nothing is sent; prints what it would publish; stored values "
        "are read, never written",
    )
    run.add_argument(
        "--approve", action="store_true", help="with --dry-run: approve an action that asks for approval"
    )
    run.add_argument(
        "--bridge",
        default="http://127.0.0.1:8080/",
        metavar="URL",
        help="the running companion's bridge (default http://127.0.0.1:8080/)",
    )
    run.add_argument("--token", default=None, help=f"the bridge's token (default ${TOKEN_ENV})")
    run.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="with --dry-run: the data directory whose stored values the tool reads",
    )
    add_log_level_arguments(run, "ERROR", "the tool's own warnings (stderr)")
    run.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import trio

    from companion.app.actions import dry_run, live_run, parse_input
    from companion.app.paths import default_data_dir
    from companion.card.model import CardError, load_card
    from companion.log import configure_logging

    configure_logging(chosen_log_level(args))
    raw = parse_input(args.input)
    if isinstance(raw, str):
        print(f"companion action run: {raw}", file=sys.stderr)
        return 2
    try:
        if args.dry_run:
            data_dir = args.data_dir or default_data_dir()
            run = trio.run(
                lambda: dry_run(args.card, args.tool, raw, data_dir=data_dir, approve=args.approve)
            )
        else:
            companion_id = args.card
            if not (args.card.startswith("companion_") and not Path(args.card).exists()):
                companion_id = load_card(args.card).card.metadata.id
            token = args.token or os.environ.get(TOKEN_ENV) or None
            run = trio.run(lambda: live_run(args.bridge, companion_id, args.tool, raw, token=token))
    except CardError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"companion action run: cannot reach the bridge at {args.bridge}: {exc}", file=sys.stderr)
        print(
            "  fix: start the companion with `companion run CARD --ws 127.0.0.1:8080`, or use --dry-run",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(run.printed, ensure_ascii=False, indent=2))
    if run.exit_code and "message" in run.printed:
        print(f"companion action run: {run.printed['message']}", file=sys.stderr)
    return run.exit_code
