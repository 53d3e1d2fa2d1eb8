"""The node's directory, followed: who is present becomes the machine's join and leave events.

A companion seen for the first time is remembered in the store before the machine hears of it,
so it stays *known* across restarts (a store that fails leaves it unknown: tried again with the
next payload); its name goes to the machine (a message that names a companion prefers it as its
speaker); the routines and the tool announcer hear of every join, and a peer that leaves takes
its announced tool list along.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping

from companion.card.routines import CompanionJoined as RoutineJoined
from companion.card.routines import CompanionLeft as RoutineLeft
from companion.conversation.events import CompanionJoined, Event, present_diff
from companion.conversation.machine import Conversation
from companion.engine.routines import RoutineDriver
from companion.engine.tools import PeerTools, ToolsAnnouncer
from companion.engine.work import StoreHealth
from companion.ports import ConversationStore
from companion.protocol import Metadata

__all__ = ["DirectoryFollower"]


class DirectoryFollower:
    """Brings the machine's ``present`` up to the directory, one event per change."""

    def __init__(
        self,
        me: Metadata,
        directory: Mapping[str, Metadata],
        conversation: Conversation,
        store: ConversationStore,
        health: StoreHealth,
        feed: Callable[[Event], None],
    ) -> None:
        self._me, self._directory, self._conversation, self._store = me.id, directory, conversation, store
        self._health, self._feed = health, feed
        self._names: dict[str, str] = {}
        conversation.names = ChainMap(self._names, {me.id: me.name})  # this one's name included
        self._routines: RoutineDriver | None = None
        self._announcer: ToolsAnnouncer | None = None
        self._peer_tools: PeerTools | None = None

    def tell(self, routines: RoutineDriver, announcer: ToolsAnnouncer, peer_tools: PeerTools) -> None:
        """Who else hears of joins and leaves (made after the machine, which they read)."""
        self._routines, self._announcer, self._peer_tools = routines, announcer, peer_tools

    def sync(self) -> None:
        conversation = self._conversation
        if set(self._directory) == conversation.present:
            return
        for change in present_diff(conversation.present, self._directory):
            cid = change.companion_id
            joined = isinstance(change, CompanionJoined)
            if joined and (cid not in conversation.known or cid == self._me):  # (the machine knows itself)
                try:
                    self._store.remember_companion(cid)
                except Exception as exc:
                    self._health("remember_companion", exc, companion=cid)
                    continue  # not known yet: tried again with the next payload
            self._feed(change)
            if joined:
                meta = self._directory.get(cid)
                self._names[cid] = meta.name if meta is not None else cid
                if self._routines is not None:
                    self._routines.observe(RoutineJoined(cid, self._names[cid]))
                if self._announcer is not None:
                    self._announcer.refresh()
            else:
                if self._peer_tools is not None:
                    self._peer_tools.pop(cid, None)
                name = self._names.pop(cid, cid)
                if self._routines is not None:
                    self._routines.observe(RoutineLeft(cid, name))
