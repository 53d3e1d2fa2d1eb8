"""The views the bridge of ``companion run --ws`` serves from this process's companions: their
recent conversation, read from their stores, and their faces, from their cards
(:mod:`companion.bridge.views` serves them).

The history is the union of every companion's store (each records the messages of its own
conversations once, with the time it arrived), one entry per message id at the earliest
time, oldest first. A store is flushed before it is read, so a message that reached a client a
moment ago is in it; the file is read off the loop with a read-only connection of its own.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import trio

from companion.bridge.views import Face, TimedMessage, serve_faces, serve_history
from companion.card.model import image_path, image_type
from companion.log import log_event
from companion.ports import ConversationStore
from companion.store.sqlite import Store, read_history

if TYPE_CHECKING:
    from companion.card.model import LoadedCard

__all__ = ["faces_of", "gather_history", "serve_views", "store_of"]

logger = logging.getLogger("companion.app.views")

FLUSH_TIMEOUT: Final = 1.0


def store_of(handler: object) -> ConversationStore | None:
    """The store behind a node's handler (a conversation engine's), if it has one."""
    engine = getattr(handler, "engine", None)
    store = getattr(engine, "store", None)
    return cast("ConversationStore", store) if callable(getattr(store, "recent", None)) else None


def faces_of(cards: Sequence[LoadedCard]) -> dict[str, Face]:
    """Each card's appearance as clients get it (a card without one is left out: initials)."""
    faces: dict[str, Face] = {}
    for loaded in cards:
        appearance = loaded.card.appearance
        if appearance is None:
            continue
        face = Face(color=appearance.color, image_url=appearance.image_url())
        path = image_path(appearance, loaded.path) if loaded.path is not None else None
        if path is not None:
            try:
                data = path.read_bytes()  # checked when the card loaded: small, an image
            except OSError as exc:
                log_event(logger, "face_unreadable", logging.WARNING, path=str(path), error=str(exc))
            else:
                face = Face(appearance.color, None, data, image_type(data[:12]))
        faces[loaded.card.metadata.id] = face
    return faces


async def gather_history(stores: Mapping[str, ConversationStore], limit: int) -> list[TimedMessage]:
    """The last ``limit`` messages across ``stores``, each once (at its earliest time), oldest
    first. A store that cannot be read is logged and left out; one without times (in memory)
    gives its messages without a time, ordered after the timed ones."""
    seen: dict[str, TimedMessage] = {}
    for cid, store in list(stores.items()):
        rows: list[TimedMessage]
        if isinstance(store, Store):
            await store.flush(FLUSH_TIMEOUT)
            try:
                timed = await trio.to_thread.run_sync(read_history, store.path, limit)
            except (sqlite3.Error, OSError) as exc:
                log_event(logger, "history_unreadable", logging.WARNING, companion=cid, error=str(exc))
                continue
            rows = list(timed)
        else:
            rows = [(None, m) for m in store.recent(limit)]
        for at, message in rows:
            known = seen.get(message.params.id)
            if known is None or (at is not None and (known[0] is None or at < known[0])):
                seen[message.params.id] = (at, message)
    ordered = sorted(seen.values(), key=lambda item: (item[0] is None, item[0] or 0.0))
    return ordered[-limit:] if limit > 0 else []


def serve_views(
    bridge: Any, cards: Sequence[LoadedCard], stores: MutableMapping[str, ConversationStore]
) -> None:
    """Serve ``/history`` (from ``stores``, filled as the companions start) and the faces of
    ``cards`` on ``bridge``."""

    async def source(limit: int) -> list[TimedMessage]:
        return await gather_history(stores, limit)

    serve_history(bridge, source)
    serve_faces(bridge, faces_of(cards))
