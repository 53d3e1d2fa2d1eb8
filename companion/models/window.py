"""What a real model's prompt quotes of the past: a window of earlier messages whose start moves
in steps, and how each of the speaker's own past turns was asked.

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
reuses the first's evaluated prefix.

The speaker's past turns are quoted as they were asked (:meth:`HistoryWindow.ask`): the others'
lines, then the task of that turn, then its own line. Quoted without the task, every prompt
differed from the request before it where that task began, so the server evaluated the
speaker's own last line again, though it had written it itself.

Pure and synchronous; the state is one anchor per key and a few past tasks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Final

from companion.conversation.state import latest
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
        self._asked: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()

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
            latest(self._anchors, key, ids[start], _KEYS)
        return earlier[start:]

    def ask(self, key: str, heard: str, prompt: str) -> None:
        """The speaker of ``key`` was asked ``prompt``, its last user turn, which opens with the
        others' lines ``heard``. At most :attr:`most` are kept a key: a window quotes no more."""
        if not heard:
            return
        asked = self._asked.get(key) or OrderedDict()
        latest(asked, heard, prompt, self.most)
        latest(self._asked, key, asked, _KEYS)

    def asked(self, key: str) -> Mapping[str, str]:
        """The speaker's past user turns as they were sent, by the others' lines that open them
        (for :func:`~.prompts.speaker_turns`)."""
        return self._asked.get(key, {})
