"""``companion trust list|add|remove|rekey``: the pins and answerers in a data directory.

Every node that uses a data directory reads ``trust.json`` there (see :mod:`companion.node.trust`):
companion ids pinned to peer ids (learned on first meeting, or added here), and the peers allowed
to answer queries (``approver``: every query, approvals included; ``answerer``: every query but
approvals). Running nodes re-read the file when it changed: an allowed peer counts at its next
answer, a changed pin when the peer next proves its id. What each action does is
:mod:`companion.app.trust`; this module parses the arguments.

Also the flags that ``companion run`` and ``companion bridge`` share: ``--trust ID=PEER_ID``
(pins for this run, over the file) and, for ``run``, ``--approver`` and ``--answerer``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from companion.app.paths import default_data_dir
from companion.app.trust import (
    TRUST_FILENAME,
    TrustError,
    TrustOptions,
    add_trust,
    list_trust,
    rekey_trust,
    remove_trust,
    trust_store,
)

__all__ = ["add_trust_arguments", "register", "trust_options"]


# --- the flags of ``companion run`` and ``companion bridge`` ----------------------------------------


def add_trust_arguments(parser: argparse.ArgumentParser, *, answers: bool = True) -> None:
    """``--trust`` (and with ``answers``, ``--approver`` and ``--answerer``) on ``parser``."""
    group = parser.add_argument_group("trust (see 'companion trust --help')")
    group.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="ID=PEER_ID",
        help="pin a companion id to a peer id for this run, before meeting it (repeatable)",
    )
    if answers:
        group.add_argument(
            "--approver",
            action="append",
            default=[],
            metavar="PEER_ID",
            help="a peer (e.g. a separate 'companion bridge') whose clients may approve actions and "
            "answer every query (repeatable; the bridge of --ws is one already)",
        )
        group.add_argument(
            "--answerer",
            action="append",
            default=[],
            metavar="PEER_ID",
            help="a peer whose clients may answer queries (e.g. voice a line) but not approve (repeatable)",
        )


def trust_options(args: argparse.Namespace) -> TrustOptions:
    """The parsed flags; raises :class:`~companion.node.trust.TrustError` (a ``ValueError``)."""
    return TrustOptions.from_flags(args.trust, getattr(args, "approver", []), getattr(args, "answerer", []))


# --- ``companion trust`` ------------------------------------------------------------------------------

_ROLE_HELP = "'approver' or 'answerer' instead of a companion id: allow a peer to answer queries"


def register(subparsers: Any) -> None:
    where = argparse.ArgumentParser(add_help=False)  # --data-dir before or after the action
    where.add_argument(
        "--data-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"the data directory of the nodes (default: {default_data_dir()})",
    )
    parser = subparsers.add_parser(
        "trust",
        parents=[where],
        help="list and change pinned companion ids and allowed answerers",
        description="Pinned companion ids (trust on first use) and the peers allowed to answer queries, "
        f"kept in DATA_DIR/{TRUST_FILENAME}. Running nodes need no restart: an allowed peer counts "
        "at its next answer, a changed pin when the peer next proves its id.",
    )
    actions = parser.add_subparsers(dest="trust_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", parents=[where], help="print every pin and allowed peer")
    listing.add_argument("--json", action="store_true", help="one JSON object")
    listing.set_defaults(func=_command(_list))

    add = actions.add_parser(
        "add",
        parents=[where],
        help="pin a companion id to a peer id before meeting it (or allow a peer to answer)",
        description="Pin COMPANION_ID to PEER_ID, so any other key claiming it is refused even before "
        "the first meeting; refused if it is pinned to another peer (use rekey). "
        f"Or, with {_ROLE_HELP}.",
    )
    add.add_argument("what", metavar="COMPANION_ID|approver|answerer")
    add.add_argument("peer", metavar="PEER_ID", help="a peer id, or an address ending in /p2p/PEER_ID")
    add.set_defaults(func=_command(_add))

    remove = actions.add_parser(
        "remove", parents=[where], help="forget a pin (the next peer to prove the id is pinned)"
    )
    remove.add_argument("what", metavar="COMPANION_ID|approver|answerer")
    remove.add_argument("peer", nargs="?", metavar="PEER_ID", help="for approver and answerer")
    remove.set_defaults(func=_command(_remove))

    rekey = actions.add_parser(
        "rekey",
        parents=[where],
        help="move a companion id to a new peer id on purpose (its key was replaced)",
    )
    rekey.add_argument("what", metavar="COMPANION_ID")
    rekey.add_argument("peer", metavar="NEW_PEER_ID")
    rekey.set_defaults(func=_command(_rekey))


Command = Callable[[argparse.Namespace], str]


def _command(body: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``body``, print what it says; a refusal is one line, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            said = body(args)
        except (TrustError, OSError) as exc:
            print(f"companion trust: {exc}", file=sys.stderr)
            return 2
        print(said)
        return 0

    return run


def _data_dir(args: argparse.Namespace) -> Path:
    return getattr(args, "data_dir", None) or default_data_dir()


def _list(args: argparse.Namespace) -> str:
    return list_trust(trust_store(_data_dir(args)), as_json=args.json)


def _add(args: argparse.Namespace) -> str:
    return add_trust(trust_store(_data_dir(args)), args.what, args.peer)


def _remove(args: argparse.Namespace) -> str:
    return remove_trust(trust_store(_data_dir(args)), args.what, args.peer)


def _rekey(args: argparse.Namespace) -> str:
    return rekey_trust(trust_store(_data_dir(args)), args.what, args.peer)
