"""The line protocol of the helper processes a test drives (``node_driver``, ``raw_publisher``):
JSON commands on standard input and JSON events on standard output, one a line, so a test can
wait for an event with a deadline (``support.network.Proc``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

ERROR_CHARS = 300
"""How much of a failed command's exception its ``error`` event carries (bounded: a report must
say what went wrong, not drown in it)."""


def emit(event: str, **fields: Any) -> None:
    """One event line on standard output."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def serve_commands(run: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Hand each command line on standard input to ``run``, in order, until the input closes; a
    command that fails is answered with an ``error`` event and the next one still runs."""
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    buffer = b""
    while True:
        chunk = await stdin.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            command = json.loads(line)
            try:
                await run(command)
            except Exception as exc:
                emit("error", op=command.get("op"), error=repr(exc)[:ERROR_CHARS])
