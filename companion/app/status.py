"""``companion status``: the companions of this machine's data directories, running or not, the
companions each one sees, and the last turns they took part in.

A running ``companion run`` keeps a small snapshot per companion in
``<data dir>/<companion id>/status.json`` (:func:`track_status`): its process id, peer id,
addresses and the companions it sees, rewritten (atomically) at start and whenever its view
changes. It is a snapshot of a running process, not stored data: losing it loses nothing, and
a reader checks the process is still there. The file carries its layout version
(:data:`STATUS_VERSION`); a reader skips a version it does not know, naming it. The last turns
come from the companions' stores (:func:`.explain.summarize_turns`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from companion.app.explain import clock, companion_stores, summarize_turns
from companion.log import log_event

if TYPE_CHECKING:
    from companion.node import CompanionNode

__all__ = ["STATUS_FILE", "STATUS_VERSION", "CompanionStatus", "read_status", "status_lines", "track_status"]

logger = logging.getLogger("companion.app.status")

STATUS_FILE: Final = "status.json"
STATUS_VERSION: Final = 1


def track_status(node: CompanionNode, data_dir: Path) -> None:
    """Write ``node``'s :data:`STATUS_FILE` now and whenever its set of companions changes."""
    path = data_dir / node.name / STATUS_FILE
    started_at = time.time()

    def write(_event: object = None) -> None:
        snapshot = {
            "version": STATUS_VERSION,
            "companion": node.name,
            "pid": os.getpid(),
            "peer_id": node.peer_id,
            "addrs": list(node.listen_addrs),
            "sees": sorted(cid for cid in node.directory if cid != node.name),
            "started_at": started_at,
            "updated_at": time.time(),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".json.partial")
            partial.write_text(json.dumps(snapshot), encoding="utf-8")
            partial.replace(path)
        except OSError as exc:  # a status nobody can read is no reason to stop a companion
            log_event(logger, "status_not_written", logging.WARNING, path=str(path), error=repr(exc)[:300])

    node.add_membership_listener(write)
    write()


@dataclass
class CompanionStatus:
    """What ``companion status`` knows of one companion of a data directory."""

    companion: str
    data_dir: Path
    running: bool
    snapshot: dict[str, Any] | None
    problem: str | None = None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs a companion command (a reused pid running something else does not)."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] != "Z" and b"companion" in cmdline
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_status(data_dir: Path, companion: str) -> CompanionStatus:
    """The status of ``companion`` under ``data_dir`` (never raises: what is wrong is said)."""
    path = data_dir / companion / STATUS_FILE
    try:
        snapshot = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return CompanionStatus(companion, data_dir, False, None)
    except (OSError, ValueError) as exc:
        return CompanionStatus(companion, data_dir, False, None, f"{path}: unreadable ({exc})")
    if not isinstance(snapshot, dict) or snapshot.get("version") != STATUS_VERSION:
        version = snapshot.get("version") if isinstance(snapshot, dict) else None
        return CompanionStatus(
            companion, data_dir, False, None, f"{path}: layout version {version!r}, this release reads 1"
        )
    pid = snapshot.get("pid")
    running = isinstance(pid, int) and _alive(pid)
    return CompanionStatus(companion, data_dir, running, snapshot)


def status_lines(data_dirs: Sequence[Path], turns: int) -> list[str]:
    """What ``companion status`` prints: per data directory, each companion (running or not,
    its peer id and the companions it sees), then the last ``turns`` turns, merged."""
    lines: list[str] = []
    for data_dir in data_dirs:
        stores = companion_stores([data_dir])
        lines.append(f"data directory {data_dir}" + ("" if stores else ": no companions"))
        for companion in stores:
            status = read_status(data_dir, companion)
            lines.append(f"  {companion}: {_state(status)}")
            if status.problem:
                lines.append(f"    {status.problem}")
            if status.running and status.snapshot is not None:
                sees = status.snapshot.get("sees") or []
                lines.append(f"    peer {status.snapshot.get('peer_id')}")
                lines.append(f"    sees {', '.join(map(str, sees)) if sees else 'no other companion'}")
        summaries = summarize_turns(stores, turns) if stores else []
        if summaries:
            lines.append(f"  last {len(summaries)} turns:")
        for t in summaries:
            who = f"from {t.sender}, " if t.sender else ""
            led = f"led by {t.leader}, " if t.leader else ""
            lines.append(f"    {clock(t.at)}  {t.message_id}  {who}{led}{t.outcome}")
    return lines


def _state(status: CompanionStatus) -> str:
    snapshot = status.snapshot
    if snapshot is None:
        return "not running (no status: never run by this release)"
    since = clock(float(snapshot.get("started_at", 0)))
    if status.running:
        return f"running (pid {snapshot.get('pid')}, since {since})"
    return f"not running (last: pid {snapshot.get('pid')}, started {since})"
