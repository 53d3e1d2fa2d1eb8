"""The demo's end of its spawner (companion/app/spawner.py) when the spawner fails it: a request
it never answers runs into its deadline, and one sent after it ended fails at once; both say
so as an error the demo prints in one line, instead of a wait without end."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from companion.app.spawner import Spawner


async def test_a_spawner_that_does_not_answer_or_has_ended_is_an_error() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spawner = Spawner(ours, pid=os.getpid())  # only named in the errors: never signalled here
    read_end, write_end = os.pipe()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(spawner.serve)
            with pytest.raises(RuntimeError, match=r"\(pid \d+\) did not answer within 0.5 s"):
                await spawner.spawn(["pim"], write_end, write_end, timeout=0.5)
            theirs.close()  # the spawner is gone: its end of the socket closed
            with trio.fail_after(5), pytest.raises(RuntimeError, match="has ended"):
                await spawner.spawn(["pim"], write_end, write_end)
            nursery.cancel_scope.cancel()
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        ours.close()
