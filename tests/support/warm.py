"""Warm starts: ``python -m companion...`` and ``python -m support...`` processes forked from a
process that has done their imports already (:mod:`support.zygote`), instead of a fresh
interpreter that does them again.

:func:`popen` is :class:`subprocess.Popen` for the argv it is given: the same pipes, a real child
process with its own PID, signalled and waited for by that PID. Only where the process could not
tell the difference does it start warm: a ``-m`` module of this checkout, the interpreter
environment (every ``PYTHON*`` and locale variable) that of the server. The child moves to the
working directory asked for (first on its module path, as ``python -m`` puts it) and into a new
session if asked (``start_new_session``). Anything else, or a server that failed to start,
starts cold, as before.

The worker becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) the first time it
starts a warm process: the server forks each child through a middle process that exits at once,
so the child is reparented to the worker and ``Popen.wait`` reaps it like any other child. (A
side effect: any orphaned descendant of the worker is reparented to it too, and stays a zombie
until the worker ends.)

``COMPANION_TEST_COLD=1`` starts every process cold, as a user's shell would.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

READY_TIMEOUT = 60.0
"""Seconds the server may take for its imports (about 4 s of CPU; minutes on a starved machine
would mean something else is wrong)."""
ANSWER_TIMEOUT = 30.0
WARM_MODULES = ("companion", "support.")
SERVED = frozenset(
    {"stdin", "stdout", "stderr", "text", "bufsize", "encoding", "errors", "start_new_session"}
)
"""The ``Popen`` options a warm start honours: the streams and how they are read, and a new
session (the child calls ``setsid``). Any other (``pass_fds``, ``preexec_fn``, ...) acts in the
forked child, which the server makes, so such a process starts cold."""
PR_SET_CHILD_SUBREAPER = 36


def _interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """What the interpreter reads from the environment when it starts (``sys.path``, the
    standard streams' buffering and encoding, the locale): a warm child keeps the server's, so
    these must be the same."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"}


class _Server:
    """One :mod:`support.zygote` process of this worker, started on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = _interpreter_env(env)
        self.lock = threading.Lock()
        self.broken = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.process = subprocess.Popen(
            [sys.executable, "-m", "support.zygote", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        ours.settimeout(READY_TIMEOUT)
        said = ours.recv(4096)
        if said != b"ready":
            self.close()
            raise RuntimeError(f"the warm-start server did not start: {said!r}")
        ours.settimeout(ANSWER_TIMEOUT)

    def fits(self, env: dict[str, str]) -> bool:
        return _interpreter_env(env) == self.env

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        fds: list[int],
        cwd: str | None = None,
        new_session: bool = False,
    ) -> int:
        """The PID of a child running ``python -m`` ``argv`` with ``fds`` as its standard streams,
        in ``cwd`` (else this process's working directory), in a session of its own if
        ``new_session``. A server that did not answer within :data:`ANSWER_TIMEOUT`, or
        answered nonsense, is not asked again (a late answer would be read as the next one's)."""
        where = os.path.abspath(cwd if cwd is not None else os.getcwd())
        request = json.dumps({"argv": argv, "env": env, "cwd": where, "new_session": new_session}).encode()
        with self.lock:
            if self.broken:
                raise RuntimeError("the warm-start server failed before")
            try:
                socket.send_fds(self.sock, [request], fds)
                answer = json.loads(self.sock.recv(4096))
            except (OSError, ValueError):
                self.broken = True
                raise
        if "pid" not in answer:
            raise RuntimeError(f"the warm-start server could not fork: {answer.get('error')}")
        return int(answer["pid"])

    def close(self) -> None:
        """Closes the socket (the server's loop ends there), then waits for it; SIGKILL by PID
        if it has not ended in 10 s."""
        self.sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


_server: _Server | None = None
_failed = False
_server_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> _Server | None:
    global _server, _failed
    with _server_lock:
        if _server is None and not _failed:
            try:
                _become_subreaper()
                _server = _Server(env)
            except (OSError, RuntimeError) as exc:
                _failed = True
                print(f"support.warm: starting every process cold ({exc})", file=sys.stderr)
                return None
            atexit.register(_server.close)
    if _server is not None and not _server.broken and _server.fits(env):
        return _server
    return None


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _warm_argv(argv: list[str]) -> list[str] | None:
    """``[MODULE, ARGS...]`` for ``[sys.executable, "-m", MODULE, ARGS...]`` of a module a warm
    start serves; ``None`` for any other command."""
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return None
    return argv[2:] if argv[2].startswith(WARM_MODULES) else None


class _WarmPopen(subprocess.Popen[str]):
    """A :class:`subprocess.Popen` whose child is forked by the server instead of executed."""

    def __init__(self, server: _Server, module_argv: list[str], *args: Any, **kwargs: Any) -> None:
        self._server = server
        self._module_argv = module_argv
        self._new_session = bool(kwargs.pop("start_new_session", False))  # the server's child does it
        super().__init__(*args, **kwargs)

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: dict[str, str],
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *rest: Any,
    ) -> None:
        streams = [p2cread, c2pwrite, errwrite]
        fds = [fd if fd != -1 else default for fd, default in zip(streams, (0, 1, 2), strict=True)]
        try:
            self.pid = self._server.spawn(self._module_argv, env, fds, cwd, self._new_session)
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]


def popen(
    argv: list[str], *, env: dict[str, str], cwd: str | None = None, **kwargs: Any
) -> subprocess.Popen[str]:
    """``subprocess.Popen(argv, env=env, cwd=cwd, **kwargs)``, forked warm where it can be."""
    module_argv = _warm_argv(argv)
    if module_argv is not None and SERVED.issuperset(kwargs) and os.environ.get("COMPANION_TEST_COLD") != "1":
        server = _server_for(env)
        if server is not None:
            try:
                return _WarmPopen(server, module_argv, argv, env=env, cwd=cwd, **kwargs)
            except (OSError, RuntimeError, ValueError) as exc:  # Popen closed its pipes
                print(f"support.warm: starting {argv[2]} cold ({exc})", file=sys.stderr)
    return subprocess.Popen(argv, env=env, cwd=cwd, **kwargs)
