"""Companion processes forked from one process that has done their imports already.

Why: ``companion demo`` starts a ``companion run`` process per card, all at once, and each spent
about 1.3 s of CPU importing (py-libp2p, the engine, the store; 3.5 s with a provider model:
pydantic-ai and the OpenAI SDK) before it listened: on two cores, about half of a scripted
demo's CPU seconds (``scripts/bench_demo.py`` measures both ways; docs/figures.md). The demo
forks a spawner before its event loop starts (:meth:`Spawner.fork`: one process, no thread yet,
nothing buffered); the spawner imports what a companion process imports, once, while the demo
starts its bridge, then forks each companion from itself. A forked companion runs
``companion.cli.run`` as ``python -m`` would, in the same working directory and environment,
its stdout a pipe to the demo and its stderr its log file.

Each companion has its own PID, which the demo signals (:class:`SpawnedProcess`). It is the
spawner's child, not the demo's: the spawner reaps it and tells the demo its exit status, as
``trio.Process`` gives it (negative: the signal that ended it). The spawner ignores SIGINT and
SIGTERM (a Ctrl-C reaches the demo and its companions, which stop by themselves), and ends when
the demo closes its end of the socket, once its companions have ended: any still running then
gets SIGTERM, and SIGKILL after :data:`GRACE` seconds. On Linux a companion also gets SIGTERM if
the spawner itself is killed.

The protocol, on an ``AF_UNIX`` ``SOCK_SEQPACKET`` pair: a request is a JSON list, the arguments
of ``python -m companion.cli.run``, with the child's stdout and stderr as ``SCM_RIGHTS`` fds; the
answer is ``{"pid": N}`` or ``{"error": TEXT}``, and later ``{"exited": N, "returncode": C}``.
Where there is no ``fork``, no such socket, or a thread already runs, :meth:`Spawner.fork`
returns ``None`` and the demo starts its companions as fresh interpreters.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.log import log_event
from companion.models.specs import spec_kind

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["GRACE", "RUN_MODULE", "SPAWN_TIMEOUT", "SpawnedProcess", "Spawner", "preload_for", "run_as_main"]

logger = logging.getLogger("companion.app.spawner")


RUN_MODULE: Final = "companion.cli.run"
GRACE: Final = 10.0
"""Seconds the spawner gives companions still running when the demo closed its end (the demo
stops them itself first; this is for a demo that died) before SIGKILL."""
SPAWN_TIMEOUT: Final = 60.0
"""Seconds the spawner may take to answer a request: its imports come first (2-4 s of CPU; a
minute means something else is wrong)."""
CLOSE_TIMEOUT: Final = GRACE + 5.0
"""Seconds :meth:`Spawner.close` waits for the spawner to end before it kills it."""
MAX_PACKET: Final = 1 << 16
_POLL: Final = 1.0
"""Seconds between the spawner's looks at its clock while it waits (it wakes on a request or a
child's exit at once)."""

_COMPANION_MODULES: Final = (
    "companion.cli",
    RUN_MODULE,
    "companion.app.run",
    "companion.app.engines",
    "companion.node.node",
    "companion.engine.driver",
    "companion.models.scripted",
    "companion.models.providers",
    "companion.models.factory",
    "companion.store.sqlite",
    "companion.bridge.server",
    "companion.app.bridge",
    "companion.app.clients",
    "companion.app.metrics_http",
)
_PROVIDER_MODULES: Final = {  # imported when a provider model is built (sdks.py), by its kind
    "openai": ("pydantic_ai.models.openai", "pydantic_ai.providers.openai"),  # the OpenAI SDK, 1.2 s
    "anthropic": ("pydantic_ai.models.anthropic", "pydantic_ai.providers.anthropic"),
}
PR_SET_PDEATHSIG: Final = 1


def preload_for(model: str) -> tuple[str, ...]:
    """What a ``companion run`` process with ``model`` imports before it listens (all but a few
    dozen of the 2,500 modules; WebRTC's are left to the few that use them), its provider's SDK
    included: only that one (``scripted`` has none)."""
    return _COMPANION_MODULES + _PROVIDER_MODULES.get(spec_kind(model), ())


class SpawnedProcess:
    """A companion forked by the spawner: what the demo does with a ``trio.Process`` (its PID,
    signals, its exit status) for a process that is not its own child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = trio.Event()
        # A pidfd names this process and no other, even after the spawner reaped it and before the
        # demo heard so, when its PID may be another process's already. Linux only; elsewhere the
        # PID is signalled, with that small window.
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)

    def send_signal(self, sig: signal.Signals) -> None:
        if self._ended.is_set():  # reaped: its PID may be another process's by now
            return
        with contextlib.suppress(ProcessLookupError):  # exited, its status on the way
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int | None:
        """Its exit status once the spawner reaped it; ``None`` if the spawner was lost first."""
        await self._ended.wait()
        return self.returncode

    def _exited(self, returncode: int | None) -> None:
        self.returncode = returncode
        self._ended.set()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Spawner:
    """The demo's end: :meth:`spawn` forks a companion, :meth:`serve` follows their exits."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.pid = pid
        self._stdlib_sock = sock
        self._sock = trio.socket.from_stdlib_socket(sock)
        self._lock = trio.Lock()
        # the spawner's answers, a process forked or why not, from serve() to spawn()
        self._answers = trio.open_memory_channel[SpawnedProcess | str](1)
        self._processes: dict[int, SpawnedProcess] = {}
        self._closed = False
        self._asked = False
        self._what = f"the process that starts the companions (pid {pid})"

    @classmethod
    def fork(cls, preload: Sequence[str]) -> Spawner | None:
        """Fork the spawner from this process (before any event loop or thread starts), which
        imports ``preload`` then serves; ``None`` where this cannot be done."""
        if not hasattr(os, "fork") or threading.active_count() != 1:
            return None  # a fork copies a running thread's locks, not the thread
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except (OSError, AttributeError):
            return None
        sys.stdout.flush()  # else the spawner and every companion would print it again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _spawner_main(theirs, preload)  # never returns
        theirs.close()
        return cls(ours, pid)

    async def serve(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the spawner's answers and its companions' exits until it is lost or this task is
        cancelled. Runs as long as any :class:`SpawnedProcess` may be waited for."""
        task_status.started()
        send, _ = self._answers
        lost = False
        try:
            while True:
                try:
                    data = await self._sock.recv(MAX_PACKET)
                except OSError:  # reset: it ended with a request of ours unread
                    data = b""
                if not data:  # its end closed
                    lost = True
                    break
                message = json.loads(data)
                if "exited" in message:
                    process = self._processes.pop(int(message["exited"]), None)
                    if process is not None:
                        process._exited(int(message["returncode"]))
                elif "pid" in message:  # known here before any exit of it is read
                    process = SpawnedProcess(int(message["pid"]))
                    self._processes[process.pid] = process
                    await send.send(process)
                else:
                    await send.send(str(message.get("error")))
        finally:
            send.close()  # a spawn waiting for its answer hears that none will come
            if lost and self._processes and not self._closed:  # (not when this task is cancelled)
                log_event(
                    logger,
                    "companion_spawner_lost",
                    logging.ERROR,
                    pid=self.pid,
                    companions=sorted(self._processes),
                )
            for process in self._processes.values():
                process._exited(None)
            self._processes.clear()

    async def spawn(
        self, args: Sequence[str], stdout: int, stderr: int, *, timeout: float = SPAWN_TIMEOUT
    ) -> SpawnedProcess:
        """Fork ``python -m companion.cli.run ARGS`` with these fds as its stdout and stderr
        (this process keeps its own copies; close them after). Needs :meth:`serve` running.
        Raises :class:`RuntimeError` if the spawner does not answer within ``timeout`` seconds
        or has ended."""
        _, answers = self._answers
        async with self._lock:
            fds = array.array("i", [stdout, stderr]).tobytes()
            self._asked = True
            try:
                with trio.fail_after(timeout):
                    await self._sock.sendmsg(
                        [json.dumps(list(args)).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                    )
                    answer = await answers.receive()
            except trio.TooSlowError as exc:
                raise RuntimeError(f"{self._what} did not answer within {timeout:g} s") from exc
            except (OSError, trio.EndOfChannel, trio.ClosedResourceError) as exc:
                raise RuntimeError(f"{self._what} has ended") from exc
            if isinstance(answer, str):
                raise RuntimeError(f"the companion process could not be started: {answer}")
            return answer

    def close(self) -> int | None:
        """Close our end (the spawner then ends once its companions have) and reap it within
        :data:`CLOSE_TIMEOUT` seconds, else kill it. Returns its exit status. A spawner never
        asked for a companion (the demo refused its cards, or its model) is killed at once: it
        may still be importing, and has nothing to stop."""
        self._closed = True
        self._stdlib_sock.close()
        if not self._asked:
            os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + CLOSE_TIMEOUT
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        log_event(logger, "companion_spawner_killed", logging.WARNING, pid=self.pid, timeout=CLOSE_TIMEOUT)
        os.kill(self.pid, signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


# --- in the spawner -------------------------------------------------------------------------------


def _spawner_main(sock: socket.socket, preload: Sequence[str]) -> None:
    """The forked spawner's whole life: it never returns into the demo's code."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for name in preload:
            with contextlib.suppress(Exception):  # the companion that imports it says why, in its log
                __import__(name)
        args = _Serving(sock).run()
    except BaseException:
        traceback.print_exc()
        os._exit(70)
    if args is None:
        os._exit(0)
    os._exit(_run_companion(args))


class _Serving:
    """The spawner's loop: fork on request, reap and report, end when the demo has gone and
    every companion has ended."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: set[int] = set()
        self.open = True
        self.kill_at: float | None = None
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    def run(self) -> list[str] | None:
        """``None`` when the spawner is done; in a forked companion, its arguments."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            selector.register(self.wake_r, selectors.EVENT_READ)
            while self.open or self.children:
                for key, _ in selector.select(_POLL):
                    if key.fileobj is self.wake_r:
                        self._drain()
                    elif self.open:
                        args = self._request()
                        if args is not None:
                            return args
                        if not self.open:
                            selector.unregister(self.sock)
                self._reap()
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    self._signal_all(signal.SIGKILL)
                    self.kill_at = None
        return None

    def _drain(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _request(self) -> list[str] | None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_PACKET, 2)
        except OSError:  # its end reset: as good as closed
            data, fds = b"", []
        if not data:  # the demo closed its end: its companions go too
            for fd in fds:
                os.close(fd)
            self.open = False
            self._signal_all(signal.SIGTERM)
            self.kill_at = time.monotonic() + GRACE
            return None
        try:
            args = json.loads(data)
            if len(fds) != 2 or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ValueError("expected a list of arguments and two fds")
            pid = os.fork()
        except Exception as exc:
            self._tell({"error": f"{type(exc).__name__}: {exc}"})
            pid = -1
        if pid == 0:  # the companion: its fds in place, nothing of the spawner's left open
            self.sock.close()
            signal.set_wakeup_fd(-1)
            os.close(self.wake_r)
            os.close(self.wake_w)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            return list(args)
        for fd in fds:
            os.close(fd)
        if pid > 0:
            self.children.add(pid)
            self._tell({"pid": pid})
        return None

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.children.discard(pid)
            self._tell({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})

    def _signal_all(self, sig: int) -> None:
        for pid in self.children:  # not reaped yet: still ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _tell(self, message: dict[str, Any]) -> None:
        if not self.open:
            return
        with contextlib.suppress(OSError):  # the demo is gone; its companions stop when its end closes
            self.sock.send(json.dumps(message).encode())


def run_as_main(module: str) -> None:
    """Run ``module`` as ``python -m`` does, in a process that imported it already: its code runs
    anew as ``__main__`` (the imported copy is set aside first, or runpy warns on stderr that
    it found it: a line in every forked companion's log)."""
    sys.modules.pop(module, None)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _run_companion(args: list[str]) -> int:
    """In a forked companion: ``python -m companion.cli.run ARGS`` from the top, with the
    signal handlers a fresh interpreter has. Returns its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):  # the spawner killed: told to stop, not orphaned
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    sys.argv = [RUN_MODULE, *args]
    code: int = 0
    try:
        run_as_main(RUN_MODULE)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()  # what the interpreter's exit would do: this one ends with os._exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code
