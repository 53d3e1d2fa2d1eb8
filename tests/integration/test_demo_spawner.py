"""The demo's companions are forked by its spawner (companion/app/spawner.py), not started as
fresh interpreters: what a user meets is the same (a process per card, its PID signalled, its exit
status reported) and a demo killed outright no longer leaves its companions running. A companion
that cannot start is named in one line, with what it said."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from companion.app.spawner import GRACE
from companion.store.dirlock import DirectoryLock
from support.cli import run_companion, run_demo, started_companion
from support.processes import companion_running, proc_stat

pytestmark = pytest.mark.integration

READY_WITHIN = 60.0


def _parent(pid: int) -> int:
    stat = proc_stat(pid)
    assert stat is not None, pid
    return int(stat[1])


def _in(tmp_path: Path) -> dict[str, str]:
    """The environment with ``TMPDIR`` in the test's folder: a demo killed, or one whose
    companion died, keeps its temporary folder (the logs it names), which is then removed with
    the test's own instead of staying in the machine's /tmp."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def test_a_demo_killed_outright_leaves_no_companion_running(tmp_path: Path) -> None:
    """SIGKILL (``kill -9``, the OOM killer) gives the demo no chance to stop its companions. They
    are its spawner's children, forked from it; the spawner sees the demo's end of their socket
    close and stops them (SIGTERM: each stops in order), then ends itself."""
    args = ["demo", "--pace", "3", "--log-level", "INFO"]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "logs", env=_in(tmp_path), warm=True) as demo:
        assert demo.wait_for_output("why: ", READY_WITHIN), demo.stderr()
        children = [int(p) for p in re.findall(r"companion_process_started .*?pid=(\d+)", demo.stderr())]
        assert len(children) == 3 and all(companion_running(pid) for pid in children), demo.stderr()
        (spawner,) = {_parent(pid) for pid in children}
        assert spawner != demo.process.pid and _parent(spawner) == demo.process.pid
        os.kill(demo.process.pid, signal.SIGKILL)
        assert demo.process.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + GRACE + 10
        while any(companion_running(pid) for pid in (*children, spawner)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in (*children, spawner) if companion_running(pid)] == []


_LIFECYCLE = textwrap.dedent(
    """
    import os, signal, sys, time
    import trio
    from companion.app.spawner import Spawner, preload_for

    idle = Spawner.fork(preload_for("openai:x"))  # a demo that refuses its cards closes it at once
    spawner = Spawner.fork(preload_for("scripted"))
    assert idle is not None and spawner is not None
    began = time.monotonic()
    print(repr(("idle", idle.close(), time.monotonic() - began < 1.0)), flush=True)

    async def read_until(stream, needle):
        seen = b""
        with trio.fail_after(60):
            while needle not in seen:
                chunk = await stream.receive_some()
                if not chunk:
                    break
                seen += chunk
        return seen.decode()

    async def one(args, needle, sig=None):
        read_end, write_end = os.pipe()
        try:
            process = await spawner.spawn(args, write_end, write_end)
        finally:
            os.close(write_end)
        async with trio.lowlevel.FdStream(read_end) as out:
            said = await read_until(out, needle)
            if sig is not None:
                process.send_signal(sig)
            with trio.fail_after(30):
                code = await process.wait()
        print(repr((needle.decode() in said, "Warning" in said, code)), flush=True)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(spawner.serve)
            await one(["--no-such-option"], b"arguments are required: CARD")
            await one(
                ["pim", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", sys.argv[1]],
                b"companion_pim sees",
                signal.SIGINT,
            )
            nursery.cancel_scope.cancel()

    trio.run(main)
    print(repr(("spawner", spawner.close())), flush=True)
    """
)


def test_the_spawner_reports_each_companion_s_output_and_exit_status(tmp_path: Path) -> None:
    """One companion fails at its arguments (argparse's message on the fd given as its stderr,
    exit 2); one runs until it listens and sees itself, then takes Ctrl-C's signal as a fresh
    process does (exit 130); neither prints a warning a fresh process would not (runpy's, about
    a module it found imported); the spawner ends with 0 once its end is closed. One never
    asked for a companion is killed at once, still importing (a demo that refused its cards)."""
    done = subprocess.run(
        [sys.executable, "-c", _LIFECYCLE, str(tmp_path / "data")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = ["('idle', -9, True)", "(True, False, 2)", "(True, False, 130)", "('spawner', 0)"]
    assert done.stdout.splitlines() == expected, done.stderr[-3000:]


def test_a_companion_that_cannot_start_is_named_in_one_line_with_what_it_said(tmp_path: Path) -> None:
    """Another Pim holds the data directory the demo's Pim is given (its lock, held here): the
    demo's Pim exits 2 at once. The demo used to print trio's exception group
    as a traceback; it says which companion, its exit status and its last words, and exits 1.
    The same card twice is refused before anything starts (exit 2)."""
    pim_data = tmp_path / "run" / "data" / "companion_pim"  # where run_demo keeps the demo's
    with DirectoryLock(pim_data, what="companion_pim"):  # as another Pim running there holds it
        demo, _ = run_demo(tmp_path)
    assert demo.returncode == 1, demo.stderr[-3000:]
    assert "Traceback" not in demo.stderr and "ExceptionGroup" not in demo.stderr, demo.stderr[-3000:]
    (said,) = [line for line in demo.stderr.splitlines() if line.startswith("companion demo: ")]
    assert "pim.yaml exited with 2 before" in said, said
    assert f"in use by process {os.getpid()}" in said, said

    twice = run_companion(["demo", "pim", "pim"], cwd=tmp_path, timeout=60, warm=True)
    assert twice.returncode == 2, twice.stderr
    assert "are the same companion (companion_pim)" in twice.stderr and "Traceback" not in twice.stderr


def test_a_companion_that_dies_during_the_conversation_ends_the_demo_at_once(tmp_path: Path) -> None:
    """Killed mid-conversation (the OOM killer, a crash), a companion used to leave the demo
    waiting for a reply until its timeout (here ten minutes), the others going on as if it
    were there. The demo says at once which companion exited, with its status and log, exits 1,
    and stops the others."""
    args = ["demo", "--pace", "3", "--timeout", "600", "--log-level", "INFO"]
    with started_companion(args, cwd=tmp_path, logs=tmp_path / "logs", env=_in(tmp_path), warm=True) as demo:
        assert demo.wait_for_output("why: ", READY_WITHIN), demo.stderr()
        started = re.findall(r"companion_process_started .*?card=(\S+) .*?pid=(\d+)", demo.stderr())
        assert len(started) == 3, demo.stderr()
        card, victim = started[1][0].strip("'"), int(started[1][1])
        others = [int(pid) for _, pid in started if int(pid) != victim]
        os.kill(victim, signal.SIGKILL)
        assert demo.process.wait(timeout=GRACE + 30) == 1, demo.stderr()[-3000:]
        (said,) = [line for line in demo.stderr().splitlines() if line.startswith("companion demo: ")]
        assert said.startswith(f"companion demo: companion process for {card} exited with -9 during"), said
        assert "(last logged: " in said, said  # its event, not the whole record
        assert Path(said.rpartition("; its log: ")[2]).is_file(), said  # kept: the error names it
        assert "Traceback" not in demo.stderr(), demo.stderr()[-3000:]
        assert [pid for pid in others if companion_running(pid)] == []
