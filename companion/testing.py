"""Test doubles for people who build on companion, as trio's ``trio.testing`` is for trio.

- :class:`MemoryHub` -- gossip in memory, with the echo rule of :mod:`companion.ports`; its
  ``fault`` hook (a :data:`Fault`) drops, delays, duplicates or rewrites each delivery, which
  is how the project's own fault suite drives a conversation through lost and late messages.
  A hub whose hook sleeps owns the tasks its delayed deliveries wait in: open it for the test,
  ``async with MemoryHub(fault=hook) as hub:``; without a hook, ``MemoryHub()`` is ready as made
- :class:`MemoryEndpoint` -- one companion's ``Publisher`` and inbound channel on the hub
- :class:`ScriptedModel` -- the offline model: deterministic lines from the card, no server
- :class:`InMemoryHistory` -- the conversation history without a data directory

A conversation of engines over a :class:`MemoryHub` with :class:`ScriptedModel` runs in a unit
test without sockets, model servers or files (``companion demo --in-memory`` does the same).
"""

from __future__ import annotations

from companion.memory import Fault, MemoryEndpoint, MemoryHub
from companion.models.scripted import ScriptedModel
from companion.store.history import InMemoryHistory

__all__ = ["Fault", "InMemoryHistory", "MemoryEndpoint", "MemoryHub", "ScriptedModel"]
