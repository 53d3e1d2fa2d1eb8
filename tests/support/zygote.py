"""The server half of a warm start (:mod:`support.warm`): one process per pytest worker that
imports what a companion process imports, once, then forks a process for each ``python -m
MODULE ...`` the worker asks for, which runs the module as that command would.

Why: the suite starts hundreds of companion processes, and each spent 1.5-2 s of CPU importing
(3.5 s with a provider model: pydantic-ai and the OpenAI SDK) before doing what its test is
about; on two cores those imports were most of the suite's CPU seconds. A forked process runs
the same code on the same sockets; what it skips is the interpreter's start and the imports.
Tests about starting up (the imports a command loads, what runs before the model is ready) start
their process cold.

The protocol, on a ``SOCK_SEQPACKET`` socket inherited as fd ``argv[1]``: the server sends
``ready`` once its imports are done; each request is one JSON packet ``{"argv", "env", "cwd",
"new_session"}`` with
the child's stdin, stdout and stderr as ``SCM_RIGHTS`` fds, each answer ``{"pid"}`` or
``{"error"}``. The child is forked twice, so that it is orphaned at once and the worker (a
child subreaper, :mod:`support.warm`) becomes its parent: the worker waits for it, signals it
and reads its exit status as for any child of its own. The server ends when the worker's end of
the socket closes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

from companion.app.spawner import preload_for, run_as_main

PRELOAD = (
    *preload_for("openai:any"),  # what ``companion demo``'s spawner preloads for a provider model
    "support.raw_publisher",
    "support.node_driver",
)
"""What companion processes and the test helpers import: a fresh ``companion run`` with an
OpenAI-compatible model loads about 2,500 modules, all but about 40 of them among these and what
they import (Anthropic's SDK, 2.4 s more, and WebRTC's are left to the few that use them)."""

MAX_PACKET = 1 << 20


def _serve(sock: socket.socket) -> dict[str, Any] | None:
    """Answers requests until the worker closes its end (``None``); in a forked child, returns
    the request the child is to run."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, 3)
        except OSError:
            return None
        if not data:
            return None
        try:
            request = json.loads(data)
            pid = _fork(request, fds, sock)
        except _Child as child:  # in the forked child: its fds are already in place
            return child.request
        except Exception as exc:  # the worker is told, then starts it cold
            answer: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            answer = {"pid": pid}
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps(answer).encode())


class _Child(BaseException):
    """Unwinds the forked child out of the server loop, to run its request from the top."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request


def _fork(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """The grandchild's PID, once the middle process has exited (so it is the worker's child)."""
    if len(fds) != 3:
        raise ValueError(f"expected 3 fds, got {len(fds)}")
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: forks the child, says its PID, exits at once
        try:
            os.close(read_end)
            child = os.fork()
            if child == 0:
                os.close(write_end)
                sock.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                raise _Child(request)
            os.write(write_end, str(child).encode())
        except _Child:
            raise
        except BaseException:  # nothing of the server may run on here
            os._exit(1)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    os.waitpid(middle, 0)
    if not said:
        raise RuntimeError("the middle process said no PID")
    return int(said)


def _run(request: dict[str, Any]) -> None:
    """In the child: the environment and arguments of the request, then its module as
    ``__main__``, as ``python -m MODULE ARGS...`` runs it. What it raises (``SystemExit``
    included) ends the interpreter as it would have ended that command."""
    if request.get("new_session"):
        os.setsid()  # its own session and process group, as Popen(start_new_session=True) makes
    cwd = request.get("cwd")
    if cwd is not None:
        os.chdir(cwd)
        sys.path[0] = os.getcwd()  # ``python -m`` looks in the working directory first
    os.environ.clear()
    os.environ.update(request["env"])
    module, *args = request["argv"]
    sys.argv = [module, *args]  # run_module puts the module's file first
    run_as_main(module)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        __import__(name)
    if threading.active_count() != 1:  # a fork would copy a thread's locks, not the thread
        sock.send(json.dumps({"error": "a preloaded module started a thread"}).encode())
        return
    sock.send(b"ready")
    request = _serve(sock)
    if request is not None:
        _run(request)


if __name__ == "__main__":
    main()
