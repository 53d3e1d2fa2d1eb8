"""What llama-cpp-python's server says of each completion on its stderr, read while it runs.

Its streamed answers carry no usage (it ignores ``stream_options.include_usage``; docs/models.md),
so the tokens a streamed request took are known only from what llama.cpp prints after every
completion (llama-cpp-python 0.3.36, measured)::

    llama_perf_context_print: prompt eval time =      68.55 ms /    26 tokens (...)
    llama_perf_context_print:        eval time =     170.38 ms /    24 runs   (...)
    llama_perf_context_print:       total time =     267.20 ms /    50 tokens

one block per completion, streamed or not, in the order the server finished them (it answers one
request at a time). ``prompt eval`` counts the prompt tokens it evaluated (with ``--cache true``
only those not reused from a cached prefix), ``eval`` the single-token evaluations, which are the
tokens it generated give or take one (the last one generated at the token limit is never
evaluated; a prompt served whole from the cache has its last token evaluated alone); llama.cpp
prints at least 1 of each. A streamed request whose client went away mid-answer prints no block.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Final

__all__ = ["Completion", "ServerPerf", "completions_of"]

_PROMPT: Final = re.compile(r"llama_perf_context_print: prompt eval time =\s*([\d.]+) ms\s*/\s*(\d+) tokens")
_EVAL: Final = re.compile(r"llama_perf_context_print:\s+eval time =\s*([\d.]+) ms\s*/\s*(\d+) runs")
_TOTAL: Final = re.compile(r"llama_perf_context_print:\s+total time =")
MAX_LINE: Final = 4096
"""Bytes read at most as one line: a longer one (the server logs whole prompts at times) comes in
pieces, so no line of the server's costs more memory than this."""
MAX_COMPLETIONS: Final = 100_000
"""Completions kept at most (the oldest go first): a bench's run has a few hundred."""


@dataclass(frozen=True)
class Completion:
    """One completion as the server's perf lines tell it."""

    evaluated: int
    """Prompt tokens evaluated (not reused from a cached prefix)."""
    generated: int
    """Tokens generated, give or take one (single-token evaluations)."""
    prompt_ms: float = 0.0
    """Milliseconds the prompt's evaluation took (before the first token could be written)."""
    eval_ms: float = 0.0
    """Milliseconds the generation took."""


def completions_of(lines: Iterator[str]) -> Iterator[Completion]:
    """The completions told by ``lines`` (a block counts once its ``total time`` line came)."""
    evaluated = generated = None
    prompt_ms = eval_ms = 0.0
    for line in lines:
        if "llama_perf_context_print" not in line:
            continue
        if found := _PROMPT.search(line):
            prompt_ms, evaluated, generated = float(found.group(1)), int(found.group(2)), None
        elif found := _EVAL.search(line):
            eval_ms, generated = float(found.group(1)), int(found.group(2))
        elif _TOTAL.search(line):
            if evaluated is not None and generated is not None:
                yield Completion(evaluated, generated, prompt_ms, eval_ms)
            evaluated = generated = None


class ServerPerf:
    """The server's stderr read to its end in a thread of its own, keeping only its completions.

    Reading every line as it comes keeps the pipe from filling: a full pipe would block the
    server at its next write to stderr, mid-request. Only the parsed completions stay in memory,
    at most ``keep`` of them. :meth:`count` marks a moment; :meth:`since` gives the completions
    told after it, in order.
    """

    def __init__(self, stream: IO[bytes], keep: int = MAX_COMPLETIONS) -> None:
        self._kept: deque[Completion] = deque(maxlen=keep)
        self._told = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        def lines() -> Iterator[str]:
            with contextlib.suppress(OSError, ValueError):  # the pipe closed under the reader
                for raw in iter(lambda: stream.readline(MAX_LINE), b""):
                    yield raw.decode(errors="replace")

        for completion in completions_of(lines()):
            with self._lock:
                self._kept.append(completion)
                self._told += 1

    def count(self) -> int:
        """Completions told so far."""
        with self._lock:
            return self._told

    def since(self, mark: int) -> list[Completion]:
        """The completions told after the first ``mark`` (those still kept), oldest first."""
        with self._lock:
            first = self._told - len(self._kept)
            return list(self._kept)[max(mark - first, 0) :]

    def join(self, timeout: float) -> bool:
        """Wait until the stream ended (its process exited) and everything was read; whether it had."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
