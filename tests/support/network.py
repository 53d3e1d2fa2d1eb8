"""Separate node processes on 127.0.0.1 for integration tests: start, read their JSON event lines,
wait for an event with a deadline, signal and stop them by PID."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from companion.protocol import MESSAGES, Message, encode
from support.cards import write_card
from support.hostile_payloads import message
from support.warm import popen as warm_popen

Event = dict[str, Any]
T = TypeVar("T")

TAIL_ON_FAILURE = 40
"""Lines of each process shown when a test fails inside :func:`network` (bounded: a report from
CI must say what the companions did last, not drown in it)."""

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
"""The folder that holds the support package: on every child's ``PYTHONPATH``, so a helper
process of this package runs as ``python -m support.NAME`` (:func:`helper_argv`)."""


def helper_argv(name: str) -> list[str]:
    """How to start the helper process ``support.<name>`` (``node_driver``, ``raw_publisher``)."""
    return [sys.executable, "-m", f"support.{name}"]


def child_env(pythonpath: str | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this one's (or ``base``), unbuffered, the support
    package on its path, after ``pythonpath`` (another checkout) if given. A warm start serves
    only this interpreter environment (support.warm: the worker's server is started with it)."""
    source = os.environ if base is None else base
    env = dict(source, PYTHONUNBUFFERED="1")
    inherited = [pythonpath] if pythonpath is not None else [source.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, inherited), str(TESTS)])
    return env


class Proc:
    """One child process whose stderr (or stdout) carries one JSON object per line."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        events_on: str = "stderr",
        stdin: bool = False,
        pythonpath: str | None = None,
        warm: bool = True,
    ) -> None:
        """``pythonpath``: run the process with another checkout of the package (first on the
        path, the process started outside any checkout). ``warm``: a ``python -m`` process of
        this checkout may be forked from one that has done its imports (:mod:`support.warm`);
        ``False`` for a test of what happens while it starts."""
        self.name = name
        self.events: list[Event] = []
        self.lines: list[str] = []
        self._cond = threading.Condition()
        env = child_env(pythonpath)
        start = warm_popen if warm and pythonpath is None else subprocess.Popen
        self.popen = start(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=pythonpath,
            text=True,
            bufsize=1,
        )
        self.pid = self.popen.pid
        streams = {"stderr": self.popen.stderr, "stdout": self.popen.stdout}
        for label, stream in streams.items():
            parse = label == events_on
            threading.Thread(target=self._read, args=(stream, parse), daemon=True).start()

    def _read(self, stream: Any, parse: bool) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append(line)
                if parse and line.startswith("{"):
                    with suppress(ValueError):
                        self.events.append(json.loads(line))
                self._cond.notify_all()

    def first(
        self, items: list[T], predicate: Callable[[T], bool], timeout: float, what: str, since: int = 0
    ) -> T:
        """The first of ``items`` (this process's ``events`` or ``lines``, from ``since`` on),
        already seen or coming, that satisfies ``predicate``; fails after ``timeout``, saying
        ``what`` was awaited."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = since
            while True:
                for item in items[seen:]:
                    if predicate(item):
                        return item
                seen = len(items)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no {what} within {timeout} s\n{self.tail()}")
                self._cond.wait(left)

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float, what: str = "") -> Event:
        """The first event (already seen or coming) that satisfies ``predicate``; fails after ``timeout``."""
        return self.first(self.events, predicate, timeout, what or "matching event")

    def seen(self, predicate: Callable[[Event], bool]) -> Event | None:
        """The first event so far that satisfies ``predicate``, or ``None``: no waiting."""
        with self._cond:
            return next((e for e in self.events if predicate(e)), None)

    def tail(self, count: int = 15) -> str:
        """The last ``count`` output lines, for a failure's message."""
        with self._cond:
            return "\n".join(self.lines[-count:])

    def event(self, name: str, timeout: float = 20.0, **fields: Any) -> Event:
        return self.wait_for(
            lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items()),
            timeout,
            f"{name} {fields}",
        )

    def count(self, name: str, **fields: Any) -> int:
        with self._cond:
            return sum(
                1
                for e in self.events
                if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
            )

    def send(self, command: Event) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def after(self, name: str, before: int, timeout: float, **fields: Any) -> Event:
        """The first ``name`` event (with ``fields``) past the ``before`` ones already counted:
        the answer to a request made once they were. (Waiting for "a matching event once the
        count grew" returned the oldest one whenever the answer came before the wait began:
        stale stats, a test that failed on a counter it had just seen change.)"""

        def matches(e: Event) -> bool:
            return e.get("event") == name and all(e.get(k) == v for k, v in fields.items())

        self.wait_for(lambda e: matches(e) and self.count(name, **fields) > before, timeout, name)
        with self._cond:
            return [e for e in self.events if matches(e)][before]

    def stats(self, timeout: float = 10.0) -> Event:
        """Ask for a ``stats`` event (SIGUSR1) and return the one that follows."""
        before = self.count("stats")
        self.signal(signal.SIGUSR1)
        return self.after("stats", before, timeout)

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGCONT (in case it is frozen), SIGTERM, then SIGKILL after ``timeout``; by PID only."""
        self.terminate()
        return self.reap(timeout)

    def terminate(self) -> None:
        """The first half of ``stop``: SIGCONT (in case it is frozen), then SIGTERM, by PID."""
        if self.popen.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    break

    def reap(self, timeout: float = 10.0) -> int:
        """The second half of ``stop``: its exit code, once it ended; SIGKILL (by PID) if it has
        not within ``timeout``."""
        if self.popen.poll() is None:
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                return self.popen.wait(timeout)
        return self.popen.returncode


class Network:
    """Starts ``companion run`` and raw publisher processes; stops every one of them at the end."""

    def __init__(self, tmp: Path, *, warm: bool = True) -> None:
        """``warm``: whether its ``python -m`` processes may start warm (:mod:`support.warm`)."""
        self.tmp = tmp
        self.warm = warm
        self.procs: list[Proc] = []

    def companion(
        self,
        key: str,
        *peers: str,
        data_dir: Path | None = None,
        mdns: bool = False,
        listen: str = "/ip4/127.0.0.1/tcp/0",
        pythonpath: str | None = None,
    ) -> tuple[Proc, Event]:
        card = write_card(self.tmp, key)
        argv = [
            sys.executable,
            "-m",
            "companion.cli.run",
            str(card),
            *([] if mdns else ["--no-mdns"]),
            "--listen",
            listen,
            "--data-dir",
            str(data_dir or self.tmp / f"data-{key}"),
            "--log-format",
            "json",
            "-v",  # the events these tests wait for are INFO
        ]
        for peer in peers:
            argv += ["--peer", peer]
        proc = Proc(key, argv, pythonpath=pythonpath, warm=self.warm)
        self.procs.append(proc)
        return proc, proc.event("started", timeout=30)

    def raw(
        self, key: str | None, *, metadata: bytes | None = None, identify: bytes | None = None
    ) -> tuple[Proc, Event]:
        """A raw publisher (``support.raw_publisher``), claiming ``companion_<key>`` unless ``None``;
        ``metadata`` / ``identify``: the bytes it answers those requests with instead."""
        argv = helper_argv("raw_publisher")
        if key is not None:
            argv += ["--companion", f"companion_{key}"]
        if metadata is not None:
            argv += ["--metadata-b64", base64.b64encode(metadata).decode()]
        if identify is not None:
            argv += ["--identify-b64", base64.b64encode(identify).decode()]
        proc = Proc(key or "raw", argv, events_on="stdout", stdin=True, warm=self.warm)
        self.procs.append(proc)
        return proc, proc.event("started", timeout=30)

    def driver(self, key: str, *peers: str, config: dict[str, Any] | None = None) -> tuple[Proc, Event]:
        """A bare CompanionNode (``support.node_driver``) for ``companion_<key>``, no engine; ``config``
        overrides NodeConfig fields."""
        metadata = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
        argv = [
            *helper_argv("node_driver"),
            json.dumps(metadata),
            "--config",
            json.dumps(config or {}),
        ]
        for peer in peers:
            argv += ["--peer", peer]
        proc = Proc(key, argv, events_on="stdout", stdin=True, warm=self.warm)
        self.procs.append(proc)
        return proc, proc.event("started", timeout=30)

    def print_tails(self, lines: int = TAIL_ON_FAILURE) -> None:
        for proc in self.procs:
            print(f"--- {proc.name} (pid {proc.pid}), last lines (at most {lines}) ---", file=sys.stderr)
            print(proc.tail(lines), file=sys.stderr)

    def stop_all(self) -> None:
        """All at once: each one told to stop, then each one waited for (one after another they
        took 0.3 to 0.8 s each, 1.7 s for three companions)."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.reap()


@contextmanager
def network(tmp: Path, *, warm: bool = True) -> Iterator[Network]:
    """The processes a test starts, all stopped at its end; when the test fails, the last
    :data:`TAIL_ON_FAILURE` lines of each are printed to stderr (pytest shows them in the report:
    a failure on CI is read from there, there is no other trace of it). ``warm``: as
    :class:`Network`'s."""
    net = Network(tmp, warm=warm)
    try:
        yield net
    except BaseException:
        net.print_tails()
        raise
    finally:
        net.stop_all()


def first_among(
    procs: Sequence[Proc], predicate: Callable[[Event], bool], timeout: float, what: str
) -> tuple[Proc, Event]:
    """The first process of ``procs`` with an event that satisfies ``predicate``, and the event,
    whichever it comes from (each looked at every 50 ms); fails after ``timeout``. Waiting for
    one process and then another waits out the first one's whole deadline whenever it is the
    other one that answers."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in procs:
            event = proc.seen(predicate)
            if event is not None:
                return proc, event
        left = deadline - time.monotonic()
        if left <= 0:
            tails = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise AssertionError(
                f"no {what} from any of {[p.name for p in procs]} within {timeout} s\n{tails}"
            )
        with procs[0]._cond:
            procs[0]._cond.wait(min(0.05, left))


def publish_until_heard(
    send: Callable[[int], Callable[[Event], bool]], listener: Proc, *, tries: int, wait: float, what: str
) -> Event:
    """Publish again until a copy is heard: gossipsub sends nothing to a peer whose subscription
    it has not heard yet, so the first publishes may precede the mesh and be lost. Attempt ``n``
    calls ``send(n)``, which publishes and returns the test for that copy's event on
    ``listener``; each attempt waits ``wait`` seconds, at most ``tries`` attempts; the event
    that says it arrived is returned."""
    for n in range(tries):
        arrived = send(n)
        try:
            return listener.wait_for(arrived, wait)
        except AssertionError:
            continue
    raise AssertionError(f"{what}: none of {tries} copies heard by {listener.name} ({wait} s each)")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def publish(raw: Proc, topic: str, data: bytes, **extra: Any) -> None:
    """Have ``raw`` (a raw publisher) publish ``data`` as it is on ``topic``."""
    raw.send({"op": "publish", "topic": topic, "b64": b64(data), **extra})


def inbound(message_id: str) -> Callable[[Event], bool]:
    """The test for a node's log of the message ``message_id`` arriving."""
    return lambda e: e.get("event") == "inbound" and e.get("id") == message_id


def warm_up(raw: Proc, target: Proc, sender: str, to: list[str], tries: int = 20, wait: float = 1.5) -> None:
    """Have ``raw`` publish small messages from ``sender`` to ``to`` until ``target`` logged one
    of them (see :func:`publish_until_heard`)."""

    def send(n: int) -> Callable[[Event], bool]:
        publish(raw, MESSAGES, encode(Message.create(sender, to, "warm", id=f"warm-{n}")))
        return inbound(f"warm-{n}")

    publish_until_heard(send, target, tries=tries, wait=wait, what=f"{raw.name}'s warm-up messages")


def ask(raw: Proc, key: str, tag: str, timeout: float = 30.0) -> Event:
    """A message from the raw peer's companion id (``companion_x``) addressed to
    ``companion_<key>``; returns the reply (published again every 4 s until ``timeout``)."""

    def send(n: int) -> Callable[[Event], bool]:
        asked = f"ask-{tag}-{n}"
        # turn 0, closing none: a fresh conversation, whatever earlier messages made of the last one
        text = f"are you there, {key}?"
        publish(
            raw, MESSAGES, message("companion_x", text, asked, (f"companion_{key}",), turn=0, closing="none")
        )
        return lambda e: e.get("event") == "message" and f'"in_reply_to":"{asked}"' in e["text"]

    return publish_until_heard(
        send, raw, tries=max(1, math.ceil(timeout / 4.0)), wait=4.0, what=f"a reply from companion_{key}"
    )
