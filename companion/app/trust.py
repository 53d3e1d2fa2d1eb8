"""The trust a run starts with, and what ``companion trust`` does to a data directory's file.

Every node that uses a data directory reads ``trust.json`` there (see :mod:`companion.node.trust`):
companion ids pinned to peer ids, and the peers allowed to answer queries. A run adds the
command line's pins and allowed peers over the file, for that run only (:func:`open_trust`);
``companion trust`` lists and changes the file itself (:func:`list_trust` and the others,
each returning the line to print or raising :class:`TrustError`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from companion.log import log_event
from companion.node.trust import (
    ROLES,
    TRUST_FILENAME,
    Role,
    TrustError,
    TrustStore,
    parse_peer_id,
    parse_trust_flag,
)

__all__ = [
    "TRUST_FILENAME",
    "TrustError",
    "TrustOptions",
    "add_trust",
    "list_trust",
    "open_trust",
    "rekey_trust",
    "remove_trust",
    "trust_store",
]

logger = logging.getLogger("companion.app.trust")


@dataclass(frozen=True)
class TrustOptions:
    """Trust given on the command line, for one run (nothing of it is written)."""

    pins: tuple[tuple[str, str], ...] = ()
    """``--trust COMPANION_ID=PEER_ID``."""
    approvers: tuple[str, ...] = ()
    answerers: tuple[str, ...] = ()

    @classmethod
    def from_flags(
        cls, pins: Iterable[str], approvers: Iterable[str] = (), answerers: Iterable[str] = ()
    ) -> TrustOptions:
        """The flags as given; raises :class:`TrustError` (a ``ValueError``) naming the flag."""

        def peers(flag: str, values: Iterable[str]) -> tuple[str, ...]:
            try:
                return tuple(parse_peer_id(v) for v in values)
            except TrustError as exc:
                raise TrustError(f"{flag}: {exc}") from None

        return cls(
            pins=tuple(parse_trust_flag(v) for v in pins),
            approvers=peers("--approver", approvers),
            answerers=peers("--answerer", answerers),
        )


def open_trust(data_dir: Path | None, options: TrustOptions) -> TrustStore:
    """The store a run's nodes share: the data directory's file plus the command line's flags.
    Raises :class:`~companion.node.trust.TrustError` for a file that cannot be used."""
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


def trust_store(data_dir: Path) -> TrustStore:
    """The trust file of ``data_dir``, as ``companion trust`` edits it."""
    return TrustStore.in_directory(data_dir)


def _role(what: str) -> Role | None:
    return next((role for role in ROLES if role == what), None)


def list_trust(store: TrustStore, *, as_json: bool = False) -> str:
    """Every pin and allowed peer: one line each, or one JSON object."""
    pins = store.pins()
    if as_json:
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


def add_trust(store: TrustStore, what: str, peer_arg: str) -> str:
    """Pin a companion id to a peer id, or allow a peer a role (``what`` is the role)."""
    peer = parse_peer_id(peer_arg)
    role = _role(what)
    if role is not None:
        changed = store.set_role(peer, role, True)
        return f"{role} {peer}" + ("" if changed else " (already allowed)")
    pin = store.add(what, peer)
    return f"{pin.companion_id} pinned to {pin.peer_id}"


def remove_trust(store: TrustStore, what: str, peer_arg: str | None) -> str:
    """Forget a pin, or a peer's role (then ``peer_arg`` names the peer)."""
    role = _role(what)
    if role is not None:
        if peer_arg is None:
            raise TrustError(f"give the peer id: companion trust remove {role} PEER_ID")
        peer = parse_peer_id(peer_arg)
        if not store.set_role(peer, role, False):
            raise TrustError(f"{peer} is not an allowed {role} in {store.path}")
        return f"{role} {peer} removed"
    if peer_arg is not None:
        raise TrustError(f"companion trust remove {what} takes no peer id")
    pin = store.remove(what)
    if pin is None:
        raise TrustError(f"{what} is not pinned in {store.path}")
    return f"{pin.companion_id} unpinned (was {pin.peer_id})"


def rekey_trust(store: TrustStore, what: str, peer_arg: str) -> str:
    """Move a companion id to a new peer id on purpose."""
    peer = parse_peer_id(peer_arg)
    old = store.rekey(what, peer)
    was = f" (was {old.peer_id})" if old is not None and old.peer_id != peer else ""
    return f"{what} pinned to {peer}{was}"
