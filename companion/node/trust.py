"""Whom this node trusts, kept in the data directory: pinned companion ids and allowed answerers.

**Pins (trust on first use).** The first peer seen proving a companion id (over the metadata
protocol, or any other authenticated source such as a signed presence announcement) is pinned
to it; from then on another key claiming that id is refused (``id_pinned``), whether or not the
owner is online, and the owner is always let back in. An operator pins ids ahead of the first
meeting (``companion trust add``, ``--trust ID=PEER_ID``) and moves an id to a new key on purpose
(``companion trust rekey``). A peer holds one first-use pin: when it proves another id, its old
first-use pin is released (a card whose id changed), never an operator's.

**Answerers.** A query result is accepted only from a peer allowed to answer it: *approvers*
may answer every query, approvals included; *answerers* every query but approvals. The
clients' node of an in-process bridge is added at start (``allow``); others come from the file,
``--approver`` and ``--answerer``.

One JSON file (:data:`TRUST_FILENAME`), shared by every node and process that uses the same data
directory, like ssh's ``known_hosts``. Writes take an exclusive lock, re-read the file, change
it and replace it atomically, so processes never lose each other's pins; a running node re-reads
the file when it changed (cheaply, by ``stat``) before it decides a claim or refuses an answer,
so ``companion trust`` takes effect without a restart. Bounded: at most :data:`MAX_PINS` pins
and :data:`MAX_PEERS` peers per role; a full store refuses new pins rather than forget old ones.
Pins from flags and this process's own companions live in memory and take precedence.

Synchronous: lookups are dictionary reads; the file is touched only when a claim is new, when
the operator changes it, or to notice a change (claims are rare: one per connection).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from companion.log import log_event
from companion.protocol import APPROVAL_QUERY, COMPANION_ID_PREFIX

__all__ = [
    "MAX_PEERS",
    "MAX_PINS",
    "TRUST_FILENAME",
    "Pin",
    "PinRefused",
    "Role",
    "TrustError",
    "TrustStore",
    "is_companion_id",
    "parse_peer_id",
    "parse_trust_flag",
]

logger = logging.getLogger("companion.node.trust")

TRUST_FILENAME: Final = "trust.json"
FORMAT_VERSION: Final = 1
MAX_PINS: Final = 10_000
MAX_PEERS: Final = 1_000
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
LOCK_TIMEOUT: Final = 2.0
"""Seconds a writer waits for another process's write (each takes milliseconds)."""

StoredSource: TypeAlias = Literal["first_use", "operator"]
PinSource: TypeAlias = Literal["first_use", "operator", "flag", "local"]
"""``first_use`` and ``operator`` pins are stored; ``flag`` (``--trust``) and ``local`` (a
companion of this process) live in memory for the run."""
Role: TypeAlias = Literal["approver", "answerer"]
ROLES: Final[tuple[Role, ...]] = ("approver", "answerer")


class TrustError(ValueError):
    """A trust file, flag or operator request that cannot be used; says where and how to fix it."""


@dataclass(frozen=True, slots=True)
class Pin:
    """A companion id bound to the peer id that may speak as it."""

    companion_id: str
    peer_id: str
    source: PinSource
    since: str = ""
    """When it was pinned (ISO 8601, UTC); empty for pins held in memory."""


@dataclass(frozen=True, slots=True)
class PinRefused:
    """A claim that was not accepted: the id is pinned to ``owner``, or the store is full."""

    companion_id: str
    peer_id: str
    reason: Literal["id_pinned", "pin_store_full", "not_a_companion_id"]
    owner: str | None = None


# --- peer ids -------------------------------------------------------------------------------------

_B58: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX: Final = {c: i for i, c in enumerate(_B58)}


def _b58decode(text: str) -> bytes | None:
    number = 0
    for char in text:
        digit = _B58_INDEX.get(char)
        if digit is None:
            return None
        number = number * 58 + digit
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def parse_peer_id(text: str) -> str:
    """A libp2p peer id (base58: ``12D3KooW...`` or ``Qm...``), also taken from the end of a
    multiaddr (``/ip4/.../p2p/PEER_ID``); raises :class:`TrustError` saying why not."""
    value = text.strip()
    if "/p2p/" in value:
        value = value.rsplit("/p2p/", 1)[1].strip("/")
    raw = _b58decode(value) if 0 < len(value) <= 128 else None
    identity = raw is not None and len(raw) >= 2 and raw[0] == 0x00 and raw[1] == len(raw) - 2 <= 64
    sha256 = raw is not None and len(raw) == 34 and raw[:2] == b"\x12\x20"
    if not (identity or sha256):
        raise TrustError(
            f"{text!r} is not a libp2p peer id; a node prints its own as '<id> peer 12D3KooW...' "
            "(or give an address ending in /p2p/PEER_ID)"
        )
    return value


MAX_ID_CHARS: Final = 256


def is_companion_id(text: str) -> bool:
    """Whether ``text`` can be a pinned companion id: ``companion_...``, at most
    :data:`MAX_ID_CHARS` long (a claim the trust file could not load back is never pinned)."""
    return text.startswith(COMPANION_ID_PREFIX) and len(text) <= MAX_ID_CHARS


def _check_companion_id(companion_id: str) -> str:
    if not is_companion_id(companion_id):
        raise TrustError(
            f"{companion_id[:80]!r} is not a companion id (they start with {COMPANION_ID_PREFIX!r}, "
            f"at most {MAX_ID_CHARS} characters)"
        )
    return companion_id


def parse_trust_flag(value: str) -> tuple[str, str]:
    """``--trust COMPANION_ID=PEER_ID`` as ``(companion id, peer id)``; raises :class:`TrustError`."""
    companion_id, sep, peer = value.partition("=")
    if not sep:
        raise TrustError(f"--trust {value!r}: expected COMPANION_ID=PEER_ID, e.g. companion_pim=12D3KooW...")
    try:
        return _check_companion_id(companion_id.strip()), parse_peer_id(peer)
    except TrustError as exc:
        raise TrustError(f"--trust {value!r}: {exc}") from None


# --- the file -----------------------------------------------------------------------------------


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    peer: str
    source: StoredSource
    since: str = ""


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Literal[1]
    companions: dict[str, _Entry] = Field(default_factory=dict)
    approvers: list[str] = Field(default_factory=list)
    answerers: list[str] = Field(default_factory=list)


@dataclass(slots=True)
class _Contents:
    pins: dict[str, Pin]
    peers: dict[Role, set[str]]


def _empty() -> _Contents:
    return _Contents({}, {role: set() for role in ROLES})


_FIX: Final = "fix it, or move the file away to start again (pins are then learned anew)"


def _load(path: Path) -> _Contents:
    """The file's contents (empty when it does not exist); raises :class:`TrustError`."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return _empty()
    except OSError as exc:
        raise TrustError(f"{path}: cannot read the trust file: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise TrustError(f"{path}: larger than {MAX_FILE_BYTES} bytes\n    fix: {_FIX}")
    _refuse_newer(path, data)
    try:
        parsed = _File.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the whole file)"
        raise TrustError(f"{path}: {where}: {first['msg']}\n    fix: {_FIX}") from None
    out = _empty()
    if len(parsed.companions) > MAX_PINS:
        raise TrustError(f"{path}: companions: more than {MAX_PINS} pins\n    fix: {_FIX}")
    for companion_id, entry in parsed.companions.items():
        try:
            _check_companion_id(companion_id)
            peer = parse_peer_id(entry.peer)
        except TrustError as exc:
            raise TrustError(f"{path}: companions.{companion_id}: {exc}\n    fix: {_FIX}") from None
        out.pins[companion_id] = Pin(companion_id, peer, entry.source, entry.since)
    for role in ROLES:
        listed: list[str] = getattr(parsed, f"{role}s")
        if len(listed) > MAX_PEERS:
            raise TrustError(f"{path}: {role}s: more than {MAX_PEERS} peers\n    fix: {_FIX}")
        for index, peer in enumerate(listed):
            try:
                out.peers[role].add(parse_peer_id(peer))
            except TrustError as exc:
                raise TrustError(f"{path}: {role}s.{index}: {exc}\n    fix: {_FIX}") from None
    return out


def _refuse_newer(path: Path, data: bytes) -> None:
    """A file of a later format is refused as such (not as a mistake to fix by hand): the
    release that wrote it knows what its fields mean; nothing is changed."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return  # the validation below says what is wrong with it
    version = body.get("version") if isinstance(body, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise TrustError(
            f"{path}: format version {version}, written by a later release of companion; this one "
            f"reads version {FORMAT_VERSION}; nothing was changed\n"
            "    fix: run the release that wrote it (or a newer one) on this data directory"
        )


def _dump(contents: _Contents) -> bytes:
    body: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "companions": {
            cid: {"peer": pin.peer_id, "source": pin.source, "since": pin.since}
            for cid, pin in sorted(contents.pins.items())
        },
        "approvers": sorted(contents.peers["approver"]),
        "answerers": sorted(contents.peers["answerer"]),
    }
    return (json.dumps(body, indent=2, ensure_ascii=True) + "\n").encode("ascii")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- the store ----------------------------------------------------------------------------------


class TrustStore:
    """Pins and allowed answerers: the file (when ``path`` is given) plus what this run holds in
    memory. ``path=None`` keeps everything in memory (tests, nodes without a data directory)."""

    def __init__(self, path: Path | None = None, *, capacity: int = MAX_PINS) -> None:
        self.path = path
        self.capacity = capacity
        self._file = _load(path) if path is not None else _empty()
        self._stamp = self._stat()
        self._held: dict[str, Pin] = {}
        """Memory-only pins (``--trust``, this process's companions, unsaved first uses): they
        take precedence over the file."""
        self._allowed: dict[Role, set[str]] = {role: set() for role in ROLES}
        self._ids_of: dict[str, frozenset[str]] = {}
        self._full_logged_at = -60.0
        self._reindex()

    @classmethod
    def in_directory(cls, data_dir: Path) -> TrustStore:
        """The store of a data directory (its :data:`TRUST_FILENAME`); raises :class:`TrustError`,
        also for a directory of a newer layout (``companion run``, ``bridge`` and ``trust`` all
        open it: none of them changes a directory a later release wrote)."""
        from companion.store.layout import (  # SQLite's module once a directory is used
            LayoutError,
            refuse_newer,
        )

        try:
            refuse_newer(data_dir)
        except LayoutError as exc:
            raise TrustError(str(exc)) from None
        return cls(data_dir / TRUST_FILENAME)

    # --- reading ----------------------------------------------------------------------------

    def pin_of(self, companion_id: str) -> Pin | None:
        """Who ``companion_id`` is pinned to, if anyone (memory first, then the file)."""
        return self._held.get(companion_id) or self._file.pins.get(companion_id)

    def ids_of(self, peer_id: str) -> frozenset[str]:
        """The companion ids pinned to ``peer_id`` (usually none or one)."""
        return self._ids_of.get(peer_id, frozenset())

    def pins(self) -> list[Pin]:
        """Every effective pin, by companion id."""
        merged = {**self._file.pins, **self._held}
        return [merged[cid] for cid in sorted(merged)]

    def peers(self, role: Role) -> frozenset[str]:
        """The peers allowed in ``role``, from the file and from this run."""
        return frozenset(self._file.peers[role] | self._allowed[role])

    def stored_peers(self, role: Role) -> frozenset[str]:
        """The peers the file allows in ``role`` (what ``companion trust`` manages)."""
        return frozenset(self._file.peers[role])

    def may_answer(self, peer_id: str, query_type: str) -> bool:
        """Whether a result from ``peer_id`` may settle a query of ``query_type``: approvers
        answer anything, answerers anything but approvals. Re-reads a changed file before
        saying no, so an operator's ``companion trust add`` counts at once."""
        if self._allowed_now(peer_id, query_type):
            return True
        return self.refresh() and self._allowed_now(peer_id, query_type)

    def _allowed_now(self, peer_id: str, query_type: str) -> bool:
        if peer_id in self._allowed["approver"] or peer_id in self._file.peers["approver"]:
            return True
        if query_type == APPROVAL_QUERY:
            return False
        return peer_id in self._allowed["answerer"] or peer_id in self._file.peers["answerer"]

    # --- what a node does ---------------------------------------------------------------------

    def hold(self, companion_id: str, peer_id: str, source: Literal["flag", "local"]) -> None:
        """Pin in memory for this run, over whatever the file says (``--trust``, or a companion
        running in this process)."""
        self._held[companion_id] = Pin(companion_id, peer_id, source)
        self._reindex()

    def allow(self, peer_id: str, role: Role) -> None:
        """Let ``peer_id`` answer in ``role`` for this run (the in-process bridge, ``--approver``)."""
        self._allowed[role].add(peer_id)

    def claim(self, companion_id: str, peer_id: str) -> Pin | PinRefused:
        """``peer_id`` proved ``companion_id`` (an authenticated source): the pin it now holds,
        or why not. A new first-use pin is written to the file before it counts (another
        process may have pinned the id since this one last looked)."""
        if not is_companion_id(companion_id):
            return PinRefused(companion_id, peer_id, "not_a_companion_id")
        pin = self.pin_of(companion_id)
        if pin is None or pin.peer_id != peer_id:
            self.refresh()
            pin = self.pin_of(companion_id)
        if pin is not None:
            if pin.peer_id == peer_id:
                return pin
            return PinRefused(companion_id, peer_id, "id_pinned", pin.peer_id)
        if len(self._file.pins) + len(self._held) >= self.capacity:
            now = time.monotonic()
            if now - self._full_logged_at >= 60.0:  # one line a minute, however many claims
                self._full_logged_at = now
                log_event(
                    logger, "pin_store_full", logging.ERROR, path=str(self.path), capacity=self.capacity
                )
            return PinRefused(companion_id, peer_id, "pin_store_full")
        new = Pin(companion_id, peer_id, "first_use", _now())
        if self.path is None:
            self._file.pins[companion_id] = new
            self._release_old(self._file, new)
            self._reindex()
            return new
        try:
            parse_peer_id(peer_id)  # what the file could not load back is kept in memory only
            with self._writing() as contents:
                taken = contents.pins.get(companion_id)
                if taken is not None and taken.peer_id != peer_id:
                    return PinRefused(companion_id, peer_id, "id_pinned", taken.peer_id)
                if taken is None:
                    contents.pins[companion_id] = new
                    self._release_old(contents, new)
                return contents.pins[companion_id]
        except (OSError, TrustError) as exc:
            log_event(logger, "trust_write_failed", logging.ERROR, path=str(self.path), error=str(exc)[:300])
            self._held[companion_id] = new  # it still protects this run
            self._reindex()
            return new

    @staticmethod
    def _release_old(contents: _Contents, new: Pin) -> None:
        """A peer holds one first-use pin: the one it proved before this is let go."""
        for cid, pin in list(contents.pins.items()):
            if cid != new.companion_id and pin.peer_id == new.peer_id and pin.source == "first_use":
                del contents.pins[cid]

    def refresh(self) -> bool:
        """Re-read the file if it changed since this store last read or wrote it; ``True`` if it
        did. A file made unreadable by hand keeps the last good contents (logged)."""
        if self.path is None:
            return False
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        try:
            contents = _load(self.path)
        except TrustError as exc:
            log_event(logger, "trust_file_unreadable", logging.ERROR, error=str(exc)[:300])
            self._stamp = stamp
            return False
        self._file, self._stamp = contents, stamp
        self._reindex()
        return True

    # --- what an operator does (``companion trust``) ------------------------------------------

    def add(self, companion_id: str, peer_id: str) -> Pin:
        """Pin ``companion_id`` to ``peer_id`` ahead of meeting it; refused when it is pinned to
        another peer (replace that on purpose with :meth:`rekey`)."""
        _check_companion_id(companion_id)
        with self._writing() as contents:
            pin = contents.pins.get(companion_id)
            if pin is not None and pin.peer_id != peer_id:
                raise TrustError(
                    f"{companion_id} is pinned to {pin.peer_id} ({pin.source}, since {pin.since or '?'}); "
                    f"to move it to {peer_id} on purpose: companion trust rekey {companion_id} {peer_id}"
                )
            contents.pins[companion_id] = Pin(companion_id, peer_id, "operator", _now())
            return contents.pins[companion_id]

    def rekey(self, companion_id: str, peer_id: str) -> Pin | None:
        """Move ``companion_id`` to a new key on purpose; returns the pin it replaced."""
        _check_companion_id(companion_id)
        with self._writing() as contents:
            old = contents.pins.get(companion_id)
            contents.pins[companion_id] = Pin(companion_id, peer_id, "operator", _now())
            return old

    def remove(self, companion_id: str) -> Pin | None:
        """Forget a pin (the next peer to prove the id is pinned anew); returns it."""
        with self._writing() as contents:
            return contents.pins.pop(companion_id, None)

    def set_role(self, peer_id: str, role: Role, allowed: bool) -> bool:
        """Allow (or stop allowing) ``peer_id`` in ``role`` in the file; ``False`` if nothing changed."""
        with self._writing() as contents:
            present = peer_id in contents.peers[role]
            if allowed == present:
                return False
            if allowed and len(contents.peers[role]) >= MAX_PEERS:
                raise TrustError(f"{self.path}: {role}s: already {MAX_PEERS} peers; remove some first")
            (contents.peers[role].add if allowed else contents.peers[role].discard)(peer_id)
            return True

    # --- internals --------------------------------------------------------------------------------

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _reindex(self) -> None:
        index: dict[str, set[str]] = {}
        for pin in self.pins():
            index.setdefault(pin.peer_id, set()).add(pin.companion_id)
        self._ids_of = {peer: frozenset(ids) for peer, ids in index.items()}

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Contents]:
        """Lock, re-read, let the caller change the contents, write them atomically, unlock.
        In memory (no path) the caller changes this store's contents directly."""
        if self.path is None:
            yield self._file
            self._reindex()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path.with_name(self.path.name + ".lock")):
            contents = _load(self.path)
            before = _dump(contents)
            yield contents
            after = _dump(contents)
            if after != before:
                _write_atomically(self.path, after)
            self._file, self._stamp = contents, self._stat()
            self._reindex()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise OSError(exc.errno, f"cannot lock {path}: {exc.strerror}") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
