"""Which earlier messages a real model's prompt quotes: a window whose start moves in steps.

A prompt quotes at most :data:`~.prompts.HISTORY_LIMIT` messages (the one answered included).
Cut from the end each time, the window slid by two messages a turn (a question and its answer),
so from the seventh exchange on every prompt began differently just after the instructions, and
a server's prompt cache (llama.cpp, llama-cpp-python, vLLM's prefix caching) kept nothing of the
conversation. Measured with SmolLM2-135M behind llama-cpp-python on 2 cores: the prompt
evaluated per turn went from about 95 tokens to 320-385, and the first words from about 0.5 s
to 1.0-1.6 s, once the conversation was longer than the window (``bench_latency --rounds 11``).

So the window keeps its first message (its *anchor*) while it can: it grows at its end from turn
to turn, and only when it would quote more than the limit does it start again, from the most
recent half. Each companion's prompts and the leader's each have their window (the ``key``):
a speaker's parameters and speak calls of one turn quote the same messages, so the second
reuses the first's evaluated prefix. Pure and synchronous; the state is one anchor per key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from companion.protocol import Message

__all__ = ["HistoryWindow"]

_KEYS: Final = 64
"""Anchors kept (least recently used dropped): a model serves its node's companion and leader,
or the demo's few companions; a forgotten anchor only costs one prompt evaluated anew."""


class HistoryWindow:
    """The earlier messages each prompt quotes (see the module's docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 2:
            raise ValueError("a history window quotes at least one earlier message (limit >= 2)")
        self.most = limit - 1
        """Earlier messages quoted at most (the message answered is the limit's last)."""
        self.restart = (self.most + 1) // 2
        """Earlier messages quoted when the window starts again."""
        self._anchors: OrderedDict[str, str] = OrderedDict()

    def quoted(self, key: str, history: Sequence[Message], message: Message) -> list[Message]:
        """The messages of ``history`` before ``message`` that the prompt of ``key`` quotes,
        oldest first, at most :attr:`most` of them: from the anchor on while they fit, else the
        most recent :attr:`restart` (the new anchor is the first of them)."""
        earlier = [m for m in history if m.params.id != message.params.id]
        ids = [m.params.id for m in earlier]
        anchor = self._anchors.get(key)
        start = ids.index(anchor) if anchor is not None and anchor in ids else max(0, len(ids) - self.most)
        if len(ids) - start > self.most:
            start = len(ids) - self.restart
        if start < len(ids):
            self._anchors[key] = ids[start]
            self._anchors.move_to_end(key)
            while len(self._anchors) > _KEYS:
                self._anchors.popitem(last=False)
        return earlier[start:]
