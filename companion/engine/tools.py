"""Telling the network what tools a companion has: ``companion.tools`` on ``actions``.

An announcement goes out after every change to the runtime's tool table (the change and the
full list, as Tesseron's ``actions/list_changed``), and the plain list once the node has
settled and when a companion joins, so a peer or client that arrives later learns it too.
Announcements are coalesced: at most one per ``min_interval`` seconds, the latest winning (its
list is whole; a gap in ``revision`` says changes were folded together); a join makes the list
go out again only ``refresh_gap`` seconds after the last one. Every companion's list reaches
every node, so a list sent on every join made N companions starting together send about N²
(each node heard 265 lists in its first 68 s with 30 companions, as many messages as presence),
while one sent per ``refresh_gap`` still reaches a newcomer within that gap. aikyo companions do not
subscribe to ``actions``; aikyo clients ignore an action they do not know. The metadata over
``/aikyo/metadata/1.0.0`` stays aikyo's five fields.

:func:`read_tools` is the receiving side: the list a peer announced, checked and bounded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

from companion.actions import TOOLS_ACTION, ActionRuntime, ToolsChanged, tools_action, tools_json
from companion.actions.catalog import MAX_ANNOUNCED_TOOLS
from companion.ports import Publisher
from companion.protocol import ACTIONS, Action

__all__ = ["DEFAULT_ANNOUNCE_INTERVAL", "DEFAULT_REFRESH_GAP", "PeerTools", "ToolsAnnouncer", "read_tools"]

DEFAULT_ANNOUNCE_INTERVAL: Final = 2.0
DEFAULT_REFRESH_GAP: Final = 30.0
"""Seconds from one announcement to a list sent again only because companions joined."""
_MAX_ID_CHARS: Final = 128

Emit = Callable[..., None]


class ToolsAnnouncer:
    """Publishes one companion's tool list while :meth:`run` runs."""

    def __init__(
        self,
        runtime: ActionRuntime,
        publisher: Publisher,
        *,
        emit: Emit,
        publish_timeout: float,
        min_interval: float = DEFAULT_ANNOUNCE_INTERVAL,
        refresh_gap: float = DEFAULT_REFRESH_GAP,
    ) -> None:
        if not 0 <= min_interval <= refresh_gap:
            raise ValueError(f"need 0 <= min_interval <= refresh_gap, not {min_interval} and {refresh_gap}")
        self._runtime = runtime
        self._publisher = publisher
        self._emit = emit
        self._publish_timeout = publish_timeout
        self._min_interval = min_interval
        self._refresh_gap = refresh_gap
        self._last_sent = -math.inf
        self._change: ToolsChanged | None = None
        self._wanted = False
        self._wake = trio.Event()
        self.sent = 0
        runtime.on_tools_changed(self._changed)

    def _changed(self, event: ToolsChanged) -> None:
        self._change = event
        self._wake.set()

    def refresh(self) -> None:
        """Someone new may not know the list: announce it (``refresh_gap`` after the last one)."""
        self._wanted = True
        self._wake.set()

    def envelope(self) -> Action:
        """What goes out now: the latest change, else the plain list."""
        if self._change is not None:
            return tools_action(self._runtime.companion_id, self._change)
        params = tools_json(self._runtime.tool_list(), self._runtime.tools_revision)
        return Action.create(self._runtime.companion_id, TOOLS_ACTION, params)

    async def run(self, first_after: float) -> None:
        """Announce the list ``first_after`` seconds from now, then each change (and a refresh
        when asked), until cancelled. Changes are noted from the announcer's making on."""
        with trio.move_on_after(first_after):
            await trio.sleep_forever()
        self._wanted = True
        while True:
            if self._change is None:
                due = self._last_sent + self._refresh_gap if self._wanted else math.inf
                if trio.current_time() < due:  # nothing to say, or only a refresh not due yet
                    wake = self._wake = trio.Event()
                    with trio.move_on_at(due):
                        await wake.wait()
                    continue
            envelope = self.envelope()
            self._change, self._wanted = None, False
            self._last_sent = trio.current_time()  # a change carries the whole list: a refresh too
            try:
                with trio.fail_after(self._publish_timeout):
                    await self._publisher.publish(ACTIONS, envelope)
                self.sent += 1
                self._emit("tools_announced", logging.INFO, revision=envelope.params.params.get("revision"))
            except Exception as exc:  # trio.TooSlowError included
                self._emit("tools_announce_failed", logging.WARNING, error=repr(exc)[:300])
            await trio.sleep(self._min_interval)


def read_tools(action: Action) -> dict[str, Any] | None:
    """A peer's ``companion.tools`` announcement as ``{revision, tools: [ids]}``, or None if it
    is not one or is malformed (hostile input: never raises)."""
    if action.params.name != TOOLS_ACTION:
        return None
    params = action.params.params
    revision, tools = params.get("revision"), params.get("tools")
    if not isinstance(revision, int) or isinstance(revision, bool) or not isinstance(tools, list):
        return None
    if not 0 <= revision < math.inf:
        return None
    ids: list[str] = []
    for tool in tools[:MAX_ANNOUNCED_TOOLS]:
        tool_id = tool.get("id") if isinstance(tool, dict) else None
        if not isinstance(tool_id, str) or not tool_id or len(tool_id) > _MAX_ID_CHARS:
            return None
        ids.append(tool_id)
    return {"revision": revision, "tools": ids}


class PeerTools(dict[str, dict[str, Any]]):
    """What each peer announced (:attr:`ConversationEngine.peer_tools
    <companion.engine.driver.ConversationEngine.peer_tools>`): companion id -> ``{revision,
    tools: [ids]}``. A list counts only
    from a companion of the directory, as its own (the authenticated publisher), and an older
    change replayed (a lower ``revision`` that is not the whole list sent after a restart) never
    replaces a newer list. A peer that announces tools follows speaking slots (aikyo companions
    announce none): ``follows`` hears of it."""

    def __init__(
        self, me: str, directory: Mapping[str, Any], *, follows: Callable[[str], None], emit: Emit
    ) -> None:
        super().__init__()
        self._me, self._directory, self._follows, self._emit = me, directory, follows, emit

    def note(self, action: Action, publisher: str | None) -> None:
        """Keep the list ``action`` announces, if it is one and news."""
        sender = action.params.from_
        if publisher != sender or sender == self._me or sender not in self._directory:
            return
        tools = read_tools(action)
        if tools is None:
            return
        self._follows(sender)
        known = self.get(sender)
        if known is not None:
            plain = "change" not in action.params.params  # the whole list, sent after a (re)start
            if known == tools or (tools["revision"] <= known["revision"] and not plain):
                return  # nothing new, or an older change replayed
        self[sender] = tools
        self._emit("peer_tools", logging.INFO, peer=sender, revision=tools["revision"], tools=tools["tools"])
