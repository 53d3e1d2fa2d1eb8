"""``companion demo``: companions hold a conversation you can watch.

:func:`run_demo` starts a bridge node that watches as a bystander
(:class:`~companion.conversation.transcript.Transcript`), then every companion as its own
``companion run CARD`` process on 127.0.0.1 (a libp2p node with the conversation engine; its
standard output says when it listens and whom it sees, :mod:`.lines`), all at once with the
bridge as their one peer: they meet through it. Started one after another, each given the
earlier ones' addresses, three were ready in 5.4 s; at once, in 3.5-4.3 s (measured). Forked by
the demo's spawner (:mod:`.spawner`) rather than started as fresh interpreters, they are ready
a third sooner, for two thirds of the CPU seconds (``scripts/bench_demo.py``). It sends
the opening line and prints the transcript until ``terminal`` or the turn cap. With
``in_memory`` everything runs in this process instead (:func:`run_in_memory`, on
:class:`~.group.MemoryGroup`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from companion.app.cards import card_files, packaged_cards
from companion.app.changes import Changes
from companion.app.group import USER_ID, MemoryGroup
from companion.app.lines import parse_peer_line, parse_sees
from companion.app.spawner import RUN_MODULE
from companion.app.stopping import CLIENTS_CATCH_UP, STOP_GRACE, Interrupted, is_interrupt
from companion.card.model import LoadedCard, load_card
from companion.conversation.transcript import Transcript, TranscriptEvent
from companion.log import library_teardown, log_event
from companion.memory import Inbound
from companion.models.specs import is_offline
from companion.protocol import MESSAGES, PREVIEWS, Message, Metadata
from companion.text import clip

if TYPE_CHECKING:
    from trio_typing import TaskStatus

    from companion.app.spawner import Spawner

__all__ = [
    "DemoOptions",
    "check_demo_model",
    "default_cards",
    "kickoff_text",
    "names_of",
    "run_demo",
    "run_in_memory",
]

logger = logging.getLogger("companion.app.demo")


FINISHED: Final = ("terminal", "turn_cap")
"""The ends of a demo that did what it should (exit 0; the folder of logs is removed)."""


def stops_by_itself() -> float:
    """Seconds a companion process has to stop in order by itself once the terminal's Ctrl-C
    reached it too (its turn in flight, its clients, telling its peers it leaves) before the
    demo's SIGTERM, its second signal, stops it at once. 5 s was too few for one of three on a
    loaded machine."""
    from companion.node.presence import LEAVE_NOTICE_TIMEOUT  # (importing this module loads no libp2p)

    return STOP_GRACE + CLIENTS_CATCH_UP + LEAVE_NOTICE_TIMEOUT


def check_demo_model(spec: str, base_url: str | None) -> None:
    """Build and check a provider model once, so a missing key or an unreachable endpoint is
    reported before any process starts (the scripted model has nothing to check). Raises
    :class:`~companion.models.errors.ModelSetupError`."""
    if is_offline(spec):
        return
    from companion.models.factory import check_model, make_model

    trio.run(check_model, make_model(spec, base_url=base_url))


# --- in memory ------------------------------------------------------------------------------------


def names_of(cards: Iterable[LoadedCard]) -> dict[str, str]:
    """Display names by id: the companions', and "User" for the demo's opening line."""
    names = {c.card.metadata.id: c.card.metadata.name for c in cards}
    names[USER_ID] = "User"
    return names


def kickoff_text(cards: Sequence[LoadedCard]) -> str:
    """An opening line in the cards' language."""
    samples = " ".join(c.card.metadata.sample for c in cards)
    if any("\u3040" <= ch <= "\u9fff" for ch in samples):
        return "みなさん、こんにちは!今日はどんな一日でしたか?"
    return "Hello everyone! What has been the best part of your day so far?"


async def run_in_memory(
    cards: Sequence[LoadedCard],
    *,
    seed: int,
    max_replies: int,
    timeout: float,
    emit: Callable[[TranscriptEvent], None],
    pace: float = 0.0,
    text: str | None = None,
    model: str = "scripted",
    base_url: str | None = None,
) -> TranscriptEvent:
    """The demo in one process, no sockets. Returns the final ``end`` event."""
    from companion.models.factory import engine_timings, make_model

    models = [make_model(model, base_url=base_url, seed=seed + index) for index in range(len(cards))]
    timings = engine_timings(models, pace)
    async with MemoryGroup(timings=timings, on_event=emit) as group:
        for loaded, made in zip(cards, models, strict=True):
            await group.add(loaded, made)
        await group.say(text or kickoff_text(cards))
        done = await group.wait_until(lambda t: t.over or t.reply_count >= max_replies, timeout)
        end = _end_event(group.transcript, done, max_replies)
        if not group.transcript.over:
            emit(end)
    return end


def _end_event(transcript: Transcript, done: bool, max_replies: int) -> TranscriptEvent:
    last_end = next((e for e in reversed(transcript.events) if e.kind == "end"), None)
    if transcript.over and last_end is not None:
        return last_end
    replies = transcript.reply_count
    if done:
        return TranscriptEvent(
            "end", None, why=f"the turn cap of {max_replies} replies", reason="turn_cap", turn=replies
        )
    return TranscriptEvent(
        "end", None, why=f"no terminal after {replies} replies", reason="timeout", turn=replies
    )


# --- separate processes ---------------------------------------------------------------------------


def default_cards(root: Path | None = None) -> list[Path]:
    """The first three cards in ``root``, else in ``cards/`` of the working directory, else the
    cards installed with the package."""
    candidates = [root] if root else [Path.cwd() / "cards", packaged_cards()]
    for folder in candidates:
        if folder.is_dir():
            found = card_files(folder)
            if found:
                return found[:3]
    raise FileNotFoundError(f"no card files found in {', '.join(str(c) for c in candidates)}")


@dataclass(frozen=True)
class DemoOptions:
    cards: Sequence[Path]
    model: str = "scripted"
    base_url: str | None = None
    seed: int = 0
    max_replies: int = 30
    timeout: float = 180.0
    pace: float = 0.5
    text: str | None = None
    in_memory: bool = False
    keep_dir: Path | None = None
    start_timeout: float = 60.0


class _Process(Protocol):
    """A companion process as the demo uses it: a ``trio.Process`` it started, or a
    :class:`~companion.app.spawner.SpawnedProcess` its spawner forked."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def send_signal(self, sig: signal.Signals) -> None: ...
    def kill(self) -> None: ...
    async def wait(self) -> int | None: ...


@dataclass
class _Child:
    card: Path
    process: _Process
    log_path: Path
    companion_id: str | None = None
    peer_id: str | None = None
    addrs: list[str] = field(default_factory=list)
    """Full multiaddrs, ``/p2p/PEER`` included."""
    directory: set[str] = field(default_factory=set)
    closed: bool = False
    """Its stdout ended: the process is exiting."""
    changes: Changes = field(default_factory=Changes)


async def _read_child(child: _Child, stream: trio.abc.ReceiveStream) -> None:
    """Follow a child's stdout: its peer id, its addresses and its directory lines."""
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            sees = parse_sees(line)
            if sees is not None:
                child.directory = set(sees[1])
            elif (started := parse_peer_line(line)) is not None:
                child.companion_id, child.peer_id = started
            elif line.strip().startswith("/ip4/") and child.peer_id:
                addr = line.strip()
                child.addrs.append(addr if "/p2p/" in addr else f"{addr}/p2p/{child.peer_id}")
            child.changes.note()
    child.closed = True
    child.changes.note()


def _last_line(log: Path, tail: int = 2048) -> str:
    """The last line a companion's log holds (what a command that refused to start says last,
    a crash's exception), from its last ``tail`` bytes, clipped; empty if there is none. One of
    the JSON records a running companion writes is named by its event: the whole record would
    fill a terminal's screen and say little (a killed process's last record is any record)."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - tail))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    if not lines:
        return ""
    last = lines[-1].strip()
    try:
        record = json.loads(last)
    except ValueError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("event"), str):
        return clip(f"last logged: {record.get('level', '?')} {record['event']}", 300)
    return clip(last, 300)


def _exited_error(child: _Child, code: int | None, when: str) -> RuntimeError:
    """The demo's error for a companion that exited ``when`` it should not have: its card, its
    exit status, the last line its log holds, where the log is."""
    said = _last_line(child.log_path)
    return RuntimeError(
        f"companion process for {child.card} exited with {code} {when}"
        + (f" ({said})" if said else "")
        + f"; its log: {child.log_path}"
    )


async def _wait_child(child: _Child, predicate: Callable[[_Child], bool], timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not predicate(child):
            if child.closed:
                raise _exited_error(child, await child.process.wait(), f"before {what}")
            await child.changes.wait()
        return
    raise TimeoutError(
        f"companion process for {child.card} did not {what} within {timeout:g} s; log: {child.log_path}"
    )


async def _stop_children(children: Sequence[_Child], grace: float = 10.0, settle: float = 0.0) -> None:
    """SIGTERM to each, then SIGKILL to any still running after ``grace`` seconds. Only our
    own children, by their PIDs. ``settle``: seconds to let them stop by themselves first --
    after a Ctrl-C the terminal signalled the whole process group, so each child is stopping
    already, and a SIGTERM on top would be its second signal (which stops at once, exit 143);
    a ``kill -INT`` of the demo alone costs those seconds before the SIGTERM."""
    if settle > 0:
        with trio.move_on_after(settle):
            for child in children:
                await child.process.wait()
    running = [c.process for c in children if c.process.returncode is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        for process in running:
            await process.wait()
    for process in running:
        if process.returncode is None:
            log_event(logger, "companion_process_killed", logging.WARNING, pid=process.pid, grace=grace)
            process.kill()
            await process.wait()
    for child in children:
        log_event(logger, "companion_process_exited", pid=child.process.pid, status=child.process.returncode)


class _Watcher:
    """The bridge node's handler: feeds the transcript, prints it, notices the end."""

    def __init__(
        self,
        transcript: Transcript,
        directory: Mapping[str, Metadata],
        emit: Callable[[TranscriptEvent], None],
        companion_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.transcript = transcript
        self.directory = directory
        self.emit = emit
        self.companion_of = companion_of
        self.changes = Changes()

    async def handle(self, inbound: Inbound) -> None:
        if inbound.topic == PREVIEWS:  # a line still being voiced: shown when its message comes
            return
        peer = inbound.sender_peer
        publisher = (self.companion_of(peer) if self.companion_of else None) or peer
        lines = self.transcript.feed(
            inbound.payload, self.directory, publisher=publisher, now=trio.current_time()
        )
        self._show(lines)

    async def clock(self) -> None:
        """Feed the transcript the time when it is due to add a line by itself: a speaker still
        thinking ("Juniper is thinking… (13 s)"), an array held for its leader's slot."""
        while True:
            deadline = self.transcript.deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline) as waited:
                await self.changes.wait()  # something arrived: the deadline may have moved
            if waited.cancelled_caught:
                self._show(self.transcript.tick(trio.current_time()))

    def _show(self, lines: list[TranscriptEvent]) -> None:
        for event in lines:
            self.emit(event)
        self.changes.note()

    async def wait_until(self, predicate: Callable[[Transcript], bool], timeout: float) -> bool:
        return await self.changes.wait_until(lambda: predicate(self.transcript), timeout)


async def run_demo(
    options: DemoOptions, emit: Callable[[TranscriptEvent], None], spawner: Spawner | None = None
) -> TranscriptEvent:
    """Start one process per card on 127.0.0.1 (forked by ``spawner`` if there is one,
    :mod:`.spawner`), open the conversation, follow it to the end."""
    from companion.node import CompanionNode, NodeConfig

    loaded = [load_card(path) for path in options.cards]
    sink, finished = emit, False

    def gated(event: TranscriptEvent) -> None:
        """Nothing after the end line (companions may still talk while they are stopped)."""
        nonlocal finished
        if not finished:
            sink(event)
            finished = event.kind == "end"

    emit = gated
    if options.in_memory:
        return await run_in_memory(
            loaded,
            seed=options.seed,
            max_replies=options.max_replies,
            timeout=options.timeout,
            emit=emit,
            pace=options.pace,
            text=options.text,
            model=options.model,
            base_url=options.base_url,
        )
    ids = [c.card.metadata.id for c in loaded]
    workdir = options.keep_dir or Path(tempfile.mkdtemp(prefix="companion-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    from companion.models.factory import engine_timings, make_model

    # The companions' deadlines (each process derives the same from the server its check found).
    offline = is_offline(options.model)
    probe = make_model(options.model, base_url=None if offline else options.base_url)
    timings = engine_timings([probe], options.pace)
    transcript = Transcript(timings=timings)
    bridge = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="demo-bridge"))
    watcher = _Watcher(transcript, bridge.directory, emit, bridge.membership.companion_of)
    children: list[_Child] = []
    bridge_scope = trio.CancelScope()
    ctrl_c = trio.Event()

    async def run_bridge(task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with bridge_scope:
            await bridge.run(watcher, task_status=task_status)

    async def stop_on_ctrl_c(scope: trio.CancelScope) -> None:
        """Ctrl-C ends the demo through this receiver, not as a ``KeyboardInterrupt`` raised
        wherever the loop happens to be: one raised inside a py-libp2p task was taken for that
        task's failure, and the demo went on waiting for a conversation that had stopped."""
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                ctrl_c.set()
                scope.cancel()
                return

    async def with_processes() -> TranscriptEvent:
        if spawner is None:
            return await conversation()
        failure: Exception | KeyboardInterrupt | None = None
        async with trio.open_nursery() as outer:  # its exits are followed until they are stopped
            await outer.start(spawner.serve)
            try:
                end = await conversation()
            except (Exception, KeyboardInterrupt) as exc:  # raised as it is, not in a group
                failure = exc
            finally:
                outer.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return end

    async def conversation() -> TranscriptEvent:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_ctrl_c, nursery.cancel_scope)
            await nursery.start(run_bridge)
            nursery.start_soon(watcher.clock)
            try:
                bridge_addr = f"{bridge.listen_addrs[0]}/p2p/{bridge.peer_id}"
                for index, card in enumerate(options.cards):
                    child: _Child = await nursery.start(
                        partial(_run_child, card, index, [bridge_addr], options, workdir, spawner=spawner)
                    )
                    children.append(child)
                for child in children:
                    await _wait_child(
                        child, lambda c: bool(c.addrs), options.start_timeout, "start listening"
                    )
                for child in children:
                    await _wait_child(
                        child, lambda c: set(ids) <= c.directory, options.start_timeout, "meet the others"
                    )
                everyone = await bridge.wait_for(
                    lambda: set(ids) <= set(bridge.directory), options.start_timeout
                )
                if not everyone:
                    raise TimeoutError(
                        f"the bridge did not meet every companion within {options.start_timeout:g} s"
                    )
                log_event(logger, "demo_ready", companions=ids, workdir=str(workdir))
                opening = Message.create(USER_ID, ids, options.text or kickoff_text(loaded))
                end = await _watched(partial(_converse, bridge, watcher, opening, options), children, ctrl_c)
                if not watcher.transcript.over:
                    emit(end)  # (a terminal end is already in the transcript)
                return end
            finally:
                # the network is taken down on purpose from here: py-libp2p's records of it
                # (streams cut mid-negotiation by companions that stop) are left out, as when a
                # command stops; seen after the end line in one demo of several
                library_teardown()
                bridge_scope.cancel()  # first, so it does not try to redial companions that stop
                with trio.CancelScope(shield=True):
                    await _stop_children(children, settle=stops_by_itself() if ctrl_c.is_set() else 0.0)
                nursery.cancel_scope.cancel()
        raise Interrupted  # only a Ctrl-C cancels the nursery before the body returned

    try:
        end = await with_processes()
    except (Exception, KeyboardInterrupt) as exc:
        if options.keep_dir is None and is_interrupt(exc):
            shutil.rmtree(workdir, ignore_errors=True)
        raise  # an error names a log in the folder, so the folder stays
    if options.keep_dir is None:
        if end.reason in FINISHED:
            shutil.rmtree(workdir, ignore_errors=True)
        else:  # the companions' logs say why it did not finish
            log_event(logger, "demo_logs_kept", logging.WARNING, workdir=str(workdir), reason=end.reason)
    return end


async def _converse(
    bridge: Any, watcher: _Watcher, opening: Message, options: DemoOptions
) -> TranscriptEvent:
    """Send the opening line (again with the same id until someone reacts: the gossip mesh
    forms on a heartbeat), then follow the conversation to its end."""
    started = False
    with trio.move_on_after(options.timeout):
        while not started:
            await bridge.publish(MESSAGES, opening)  # the same id: a node that has it ignores it
            started = await watcher.wait_until(lambda t: any(e.kind != "message" for e in t.events), 3.0)
    transcript = watcher.transcript
    if not started:
        return TranscriptEvent("end", None, why="no companion answered the opening line", reason="timeout")
    done = await watcher.wait_until(lambda t: t.over or t.reply_count >= options.max_replies, options.timeout)
    return _end_event(transcript, done, options.max_replies)


async def _watched(
    converse: Callable[[], Awaitable[TranscriptEvent]], children: Sequence[_Child], ctrl_c: trio.Event
) -> TranscriptEvent:
    """``converse()``, given up with an error naming the companion as soon as one exits while it
    runs: the others would go on without it or wait for its turn, and the user would learn
    nothing until the demo's timeout. An exit after a Ctrl-C is the stop it asked for (the
    terminal signalled the companions too; the demo's own stop follows)."""
    end: TranscriptEvent | None = None
    gone: RuntimeError | None = None
    async with trio.open_nursery() as race:

        async def talk() -> None:
            nonlocal end
            end = await converse()
            race.cancel_scope.cancel()

        async def watch(child: _Child) -> None:
            nonlocal gone
            while not child.closed:
                await child.changes.wait()
            code = await child.process.wait()  # by then a Ctrl-C that stopped it has been seen
            if ctrl_c.is_set():
                await trio.sleep_forever()  # the demo's stop cancels this
            gone = gone or _exited_error(child, code, "during the conversation")
            race.cancel_scope.cancel()

        race.start_soon(talk)
        for child in children:
            race.start_soon(watch, child)
    if end is None:
        assert gone is not None  # (the race ends early only by one of the two)
        raise gone
    return end


async def _run_child(
    card: Path,
    index: int,
    peers: list[str],
    options: DemoOptions,
    workdir: Path,
    *,
    spawner: Spawner | None = None,
    task_status: TaskStatus[_Child] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start the companion process of ``card`` (started with it), forked by ``spawner`` or else
    a fresh interpreter, and follow its stdout until the process closes it (:func:`_read_child`)."""
    log_path = workdir / f"{card.stem}.log"
    args = [
        str(card),
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(workdir / "data"),
        "--model",
        options.model,
        "--seed",
        str(options.seed + index),
        "--pace",
        str(options.pace),
        "--log-format",
        "json",
        "--log-level",
        "INFO",  # its log file explains every turn
    ]
    if options.base_url:
        args += ["--base-url", options.base_url]
    for peer in peers:
        args += ["--peer", peer]
    stdout: trio.abc.ReceiveStream
    process: _Process
    with log_path.open("wb") as log_file:
        if spawner is None:
            started = await trio.lowlevel.open_process(
                [sys.executable, "-m", RUN_MODULE, *args], stdout=subprocess.PIPE, stderr=log_file
            )
            assert started.stdout is not None
            process, stdout = started, started.stdout
        else:
            read_end, write_end = os.pipe()
            try:
                process = await spawner.spawn(args, write_end, log_file.fileno())
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)
            stdout = trio.lowlevel.FdStream(read_end)
    child = _Child(card, process, log_path)
    log_event(logger, "companion_process_started", card=str(card), pid=process.pid, log=str(log_path))
    task_status.started(child)
    async with stdout:
        await _read_child(child, stdout)
