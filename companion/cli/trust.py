"""``companion trust list|add|remove|rekey``: the pins and answerers in a data directory.

Every node that uses a data directory reads ``trust.json`` there (see :mod:`companion.trust`):
companion ids pinned to peer ids (learned on first meeting, or added here), and the peers allowed
to answer queries (``approver``: every query, approvals included; ``answerer``: every query but
approvals). Running nodes re-read the file when it changed: an allowed peer counts at its next
answer, a changed pin when the peer next proves its id.

Also the flags that ``companion run`` and ``companion bridge`` share: ``--trust ID=PEER_ID``
(pins for this run, over the file) and, for ``run``, ``--approver`` and ``--answerer``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..log import log_event
from ..trust import ROLES, TRUST_FILENAME, Role, TrustError, TrustStore, parse_peer_id, parse_trust_flag

__all__ = ["TrustOptions", "add_trust_arguments", "open_trust", "register", "trust_options"]

logger = logging.getLogger("companion.cli.trust")


# --- the flags of ``companion run`` and ``companion bridge`` ----------------------------------------


@dataclass(frozen=True)
class TrustOptions:
    """Trust given on the command line, for one run (nothing of it is written)."""

    pins: tuple[tuple[str, str], ...] = ()
    """``--trust COMPANION_ID=PEER_ID``."""
    approvers: tuple[str, ...] = ()
    answerers: tuple[str, ...] = ()


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
    """The parsed flags; raises :class:`~companion.trust.TrustError` (a ``ValueError``)."""

    def peers(flag: str, values: list[str]) -> tuple[str, ...]:
        try:
            return tuple(parse_peer_id(v) for v in values)
        except TrustError as exc:
            raise TrustError(f"{flag}: {exc}") from None

    return TrustOptions(
        pins=tuple(parse_trust_flag(v) for v in args.trust),
        approvers=peers("--approver", getattr(args, "approver", [])),
        answerers=peers("--answerer", getattr(args, "answerer", [])),
    )


def open_trust(data_dir: Path | None, options: TrustOptions) -> TrustStore:
    """The store a run's nodes share: the data directory's file plus the command line's flags.
    Raises :class:`~companion.trust.TrustError` for a file that cannot be used."""
    store = TrustStore.in_directory(data_dir) if data_dir is not None else TrustStore()
    for companion_id, peer in options.pins:
        store.hold(companion_id, peer, "flag")
    for peer in options.approvers:
        store.allow(peer, "approver")
    for peer in options.answerers:
        store.allow(peer, "answerer")
    log_event(
        logger,
        "trust_loaded",
        path=str(store.path) if store.path else None,
        pins=len(store.pins()),
        approvers=len(store.peers("approver")),
        answerers=len(store.peers("answerer")),
    )
    return store


# --- ``companion trust`` ------------------------------------------------------------------------------

_ROLE_HELP = "'approver' or 'answerer' instead of a companion id: allow a peer to answer queries"


def register(subparsers: Any) -> None:
    from .run import default_data_dir

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


def _store(args: argparse.Namespace) -> TrustStore:
    from .run import default_data_dir

    return TrustStore.in_directory(getattr(args, "data_dir", None) or default_data_dir())


def _role(what: str) -> Role | None:
    return next((role for role in ROLES if role == what), None)


Command = Callable[[TrustStore, argparse.Namespace], str]


def _command(body: Command) -> Callable[[argparse.Namespace], int]:
    """Open the store, run ``body``, print what it says; a refusal is one line, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            said = body(_store(args), args)
        except (TrustError, OSError) as exc:
            print(f"companion trust: {exc}", file=sys.stderr)
            return 2
        print(said)
        return 0

    return run


def _list(store: TrustStore, args: argparse.Namespace) -> str:
    pins = store.pins()
    if args.json:
        body = {
            "path": str(store.path),
            "companions": {
                p.companion_id: {"peer": p.peer_id, "source": p.source, "since": p.since} for p in pins
            },
            **{f"{role}s": sorted(store.stored_peers(role)) for role in ROLES},
        }
        return json.dumps(body, indent=2)
    lines = [f"# {store.path}"]
    lines += [f"{pin.companion_id}  {pin.peer_id}  {pin.source}  {pin.since}".rstrip() for pin in pins]
    lines += [f"{role}  {peer}" for role in ROLES for peer in sorted(store.stored_peers(role))]
    return "\n".join(lines)


def _add(store: TrustStore, args: argparse.Namespace) -> str:
    peer = parse_peer_id(args.peer)
    role = _role(args.what)
    if role is not None:
        changed = store.set_role(peer, role, True)
        return f"{role} {peer}" + ("" if changed else " (already allowed)")
    pin = store.add(args.what, peer)
    return f"{pin.companion_id} pinned to {pin.peer_id}"


def _remove(store: TrustStore, args: argparse.Namespace) -> str:
    role = _role(args.what)
    if role is not None:
        if args.peer is None:
            raise TrustError(f"give the peer id: companion trust remove {role} PEER_ID")
        peer = parse_peer_id(args.peer)
        if not store.set_role(peer, role, False):
            raise TrustError(f"{peer} is not an allowed {role} in {store.path}")
        return f"{role} {peer} removed"
    if args.peer is not None:
        raise TrustError(f"companion trust remove {args.what} takes no peer id")
    pin = store.remove(args.what)
    if pin is None:
        raise TrustError(f"{args.what} is not pinned in {store.path}")
    return f"{pin.companion_id} unpinned (was {pin.peer_id})"


def _rekey(store: TrustStore, args: argparse.Namespace) -> str:
    peer = parse_peer_id(args.peer)
    old = store.rekey(args.what, peer)
    was = f" (was {old.peer_id})" if old is not None and old.peer_id != peer else ""
    return f"{args.what} pinned to {peer}{was}"
