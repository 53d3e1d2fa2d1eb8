"""One tool, run by a person or a program instead of a model: ``companion action run`` and the
bridge's ``POST /actions/TOOL``.

Both end in the companion's :class:`~companion.actions.ActionRuntime`, the path a model's call
takes. Live, the call runs *in the running companion* (``companion run --ws``), reached through
its bridge: that is the only process whose envelopes peers accept as that companion's (a second
node claiming the id would be refused as a forger), and it holds the companion's store, its
approval clients and its conversation. ``--dry-run`` builds the card's runtime here, offline: a
copy of the companion's stored values (in memory: nothing is written back), a publisher that
records instead of sending, and approvals answered by the ``--approve`` flag.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.parse
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.actions import ActionRuntime, KeyValueStore
from companion.actions.approval import APPROVAL_QUERY
from companion.bridge.httpclient import request
from companion.log import log_event
from companion.protocol import QUERIES, Envelope, Query, QueryResult, QueryResultBody, State, encode
from companion.store.history import InMemoryHistory
from companion.store.kv import KV_TABLE
from companion.store.layout import connect_read_only
from companion.store.sqlite import DB_FILENAME

if TYPE_CHECKING:
    from companion.card.model import LoadedCard

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "ActionRun",
    "Recording",
    "dry_run",
    "live_run",
    "parse_input",
    "reload_tools",
    "runtime_of",
    "serve_actions",
]

logger = logging.getLogger("companion.app.actions")

DEFAULT_CALL_TIMEOUT: Final = 180.0
"""How long a direct call may take: an approval (120 s) and the action after it."""
MAX_REPLY_BYTES: Final = 4 * 1024 * 1024
"""The most of a bridge's answer to ``POST /actions/TOOL`` that ``companion action run`` reads."""


@dataclass(frozen=True)
class ActionRun:
    """What ``companion action run`` prints (as JSON) and its exit status."""

    printed: dict[str, Any]
    exit_code: int


def parse_input(text: str) -> dict[str, Any] | str:
    """``--input`` as the tool's raw input, or why it is not one (a sentence)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"--input is not JSON: {exc}"
    if not isinstance(value, dict):
        return f"--input must be a JSON object (the tool's input), not {type(value).__name__}"
    return value


def exit_code(status: str) -> int:
    """0 ok, 2 for what the caller can fix (an unknown tool, an invalid input), 1 otherwise."""
    if status == "ok":
        return 0
    return 2 if status in ("not_found", "invalid_input") else 1


# --- offline ------------------------------------------------------------------------------------


@dataclass
class Recording:
    """A publisher that keeps what it is given; approval queries are answered at once."""

    approve: bool
    runtime: ActionRuntime | None = None
    sent: list[tuple[str, Envelope | list[State]]] = field(default_factory=list)

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        self.sent.append((topic, envelope))
        if topic == QUERIES and isinstance(envelope, Query) and envelope.params.type == APPROVAL_QUERY:
            reason = "approved with --approve" if self.approve else "dry run: pass --approve to approve it"
            body = QueryResultBody(success=True, body={"approved": self.approve, "reason": reason})
            assert self.runtime is not None
            self.runtime.deliver_query_result(QueryResult(id=envelope.id, result=body))

    def printed(self) -> list[dict[str, Any]]:
        return [
            {
                "topic": topic,
                "envelope": json.loads(encode(item) if not isinstance(item, list) else _states(item)),
            }
            for topic, item in self.sent
        ]


def _states(states: list[State]) -> bytes:
    return b"[" + b",".join(encode(s) for s in states) + b"]"


def _stored_copy(data_dir: Path | None, companion_id: str) -> KeyValueStore:
    """The companion's stored tool values, copied into memory (the file is only read)."""
    kv = KeyValueStore.in_memory()
    path = None if data_dir is None else data_dir / companion_id / DB_FILENAME
    if path is None or not path.is_file():
        return kv
    source = connect_read_only(path)
    try:
        rows = source.execute(
            f"SELECT namespace, key, value FROM {KV_TABLE} WHERE companion = ?", (companion_id,)
        ).fetchall()
    except sqlite3.Error:
        rows = []  # no tool has stored anything yet (no table)
    finally:
        source.close()
    for namespace, key, value in rows:
        kv.namespace(companion_id, namespace).set(key, json.loads(value))
    return kv


async def dry_run(
    card_path: str,
    tool: str,
    raw: Mapping[str, Any],
    *,
    data_dir: Path | None,
    approve: bool,
    timeout: float = DEFAULT_CALL_TIMEOUT,
) -> ActionRun:
    """Run ``tool`` of the card at ``card_path`` here, offline: nothing leaves the process."""
    from companion.card.model import load_card

    loaded = load_card(card_path)
    me = loaded.card.metadata
    recording = Recording(approve)
    kv = _stored_copy(data_dir, me.id)
    runtime = ActionRuntime(
        metadata=me, publisher=recording, directory={me.id: me}, history=InMemoryHistory(), kv=kv
    )
    recording.runtime = runtime
    for defn in loaded.tools.values():
        runtime.register(defn)
    try:
        with trio.fail_after(timeout):
            result = await runtime.call(tool, raw)
    finally:
        kv.close()
    printed = {**result.for_caller(), "dry_run": True, "would_publish": recording.printed()}
    return ActionRun(printed, exit_code(result.status))


# --- live ---------------------------------------------------------------------------------------


async def live_run(
    url: str,
    companion_id: str,
    tool: str,
    raw: Mapping[str, Any],
    *,
    token: str | None,
    timeout: float = DEFAULT_CALL_TIMEOUT,
) -> ActionRun:
    """``POST /actions/TOOL?companion=ID`` to the bridge at ``url``; the call runs in the
    companion's own process. Raises ``OSError`` when the bridge cannot be reached."""
    base = url.rstrip("/")
    for scheme in ("ws://", "wss://"):
        if base.startswith(scheme):
            base = "http" + base[2:]
    query = urllib.parse.urlencode({"companion": companion_id})
    target = f"{base}/actions/{urllib.parse.quote(tool, safe='')}?{query}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = await request(
        "POST",
        target,
        body=json.dumps(raw).encode(),
        headers=headers,
        timeout=timeout + 10,
        limit=MAX_REPLY_BYTES,
    )
    status, body = reply.status, reply.body
    try:
        answer = json.loads(body.decode("utf-8"))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        text = body.decode("utf-8", "replace").strip()[:300]
        printed = {"status": "bridge_error", "http_status": status, "message": text}
        return ActionRun(printed, 2 if 400 <= status < 500 else 1)
    if "result" in answer and isinstance(answer["result"], dict):
        return ActionRun(answer["result"], 0)
    found = answer.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    data = error.get("data")
    if isinstance(data, dict) and "status" in data:
        return ActionRun(data, exit_code(str(data["status"])))
    message = str(error.get("message", ""))[:300]
    printed = {"status": "bridge_error", "http_status": status, "code": error.get("code"), "message": message}
    return ActionRun(printed, 2 if 400 <= status < 500 else 1)


# --- the bridge's side ------------------------------------------------------------------------------


def serve_actions(bridge: Any, runtimes: MutableMapping[str, ActionRuntime]) -> None:
    """Serve ``POST /actions/TOOL`` on ``bridge`` for the companions in ``runtimes`` (filled as
    they start), rate-limited at the bridge's per-client rate."""
    from companion.bridge.actions import ACTIONS_PREFIX, ActionEndpoint

    endpoint = ActionEndpoint(runtimes, rate=bridge.config.client_rate, call_timeout=DEFAULT_CALL_TIMEOUT)
    bridge.add_route(ACTIONS_PREFIX, endpoint.route())


def reload_tools(cards: Sequence[LoadedCard], runtimes: Mapping[str, ActionRuntime]) -> None:
    """Read each card's ``actions`` and ``knowledge`` again (SIGHUP): tools added, removed or
    pointing elsewhere take effect in its runtime at once, and the runtime announces the change.
    A card that no longer loads is logged with its problems and keeps its tools. The rest of
    the card (events, routines) and the code of modules already imported stay as they started."""
    from companion.card.model import CardError, load_card

    for card in cards:
        runtime = runtimes.get(card.card.metadata.id)
        if runtime is None or card.path is None:
            continue
        try:
            fresh = load_card(card.path)
        except CardError as exc:
            log_event(
                logger, "tools_reload_failed", logging.ERROR, card=str(card.path), problems=str(exc)[:2000]
            )
            continue
        for tool_id in [t for t in runtime.tools if t not in fresh.tools]:
            runtime.remove(tool_id)
        for defn in fresh.tools.values():
            runtime.register(defn, replace=True)  # the same definition again announces nothing
        log_event(logger, "tools_reloaded", card=str(card.path), tools=list(runtime.tools))


def runtime_of(handler: object) -> ActionRuntime | None:
    """The action runtime behind a node's handler (a conversation engine's), if it has one."""
    engine = getattr(handler, "engine", None)
    runtime = getattr(engine, "runtime", None)
    return runtime if isinstance(runtime, ActionRuntime) else None
