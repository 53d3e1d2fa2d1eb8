"""A soak: companions left running for minutes or hours, a conversation every minute, and what
each process holds over time.

``--companions`` (default 5) ``companion run`` processes on 127.0.0.1, one card each (the
offline scripted model, cards written to a temporary folder, ``max_turns`` of ``--turns``);
the first one also serves clients (``--ws``), the others dial it. A Firehose client of that
bridge (a WebSocket, as a page or ``companion listen`` is) sends a message to every companion
each ``--interval`` seconds and counts the conversation answered when a companion's reply to
it comes back within the interval. Beside them, as the reference measured in the same run, a
bare py-libp2p gossipsub peer (``bench_conversation.py --bare-worker``: the project's
gossipsub parameters, nothing else) joined to the same network: what py-libp2p alone grows by
on this machine in the same minutes.

Every ``--sample`` seconds, per process: resident memory (VmRSS), open files (``/proc/PID/fd``),
threads and the size of its data directory (every file in it, the SQLite write-ahead log
included: in a soak of half an hour that log is nearly all of the growth, since SQLite copies
it into the database only at its checkpoint of 1000 pages, about 4 MB, and then reuses it).
Printed: one block per sample, then per process the first and last reading and the growth per
hour (a least-squares line through the samples after the first conversation, so start-up is
not counted as growth), the conversations answered, the replies, and every WARNING, ERROR or
CRITICAL line the processes logged (their stderr, ``--log-format json``), with each process's
exit status after one SIGTERM. Each companion serves ``--metrics``; at the end its own counts
are read from there as Prometheus would scrape them (replies, turns led, model calls, store
commits, drops by reason).

    python scripts/bench_soak.py --minutes 30 > soak.txt
    python scripts/bench_soak.py --minutes 3 --sample 20   # a quick look
    python scripts/bench_soak.py --minutes 30 --llama-venv VENV   # a real model (outside CI)

``--llama-venv VENV`` gives the companions a real model: SmolLM2-135M behind llama-cpp-python
(``--cache true`` unless ``--llama-no-cache``; ``VENV`` as for ``bench_latency.py --source
smollm2``: its ``GGUF`` file names the model), started on a free loopback port and stopped by
its PID at the end; its process is read each sample as the companions are. The WARNING lines
of a real model's run are mostly the line check at work (``line_refused``, ``speak_own_line``):
they are counted by event, with the first of each printed. Measured with it: llama-cpp-python's
``--cache true`` holds about seven times its ``--cache_size`` (docs/models.md).

Every process is stopped by its PID (SIGTERM, then SIGKILL after a grace) however the run
ends; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_conversation import QUESTIONS, companion_ids, write_cards
from bench_latency import CACHE_SIZE, MODEL, llama_server
from bench_support import data_bytes, exit_on_sigterm, fd_count, rss_bytes, thread_count

HERE: Final = Path(__file__).resolve().parent

USER: Final = "user_soak"
BARE: Final = "soak_bare"
START_TIMEOUT: Final = 60.0
"""Seconds for a process's first lines (its address, the bridge's URL) and for every companion
to see every other one."""
STOP_GRACE: Final = 15.0
RESEND_AFTER: Final = 3.0
RESEND_AFTER_MODEL: Final = 20.0
RESENDS: Final = 5
"""A message with nothing back after ``RESEND_AFTER`` seconds is sent again with the same id (at
most ``RESENDS`` times; the companions' replay guard keeps one): the clients' node joins the
gossip mesh on a heartbeat, so the very first message may find no mesh yet. With a real model
the first reply takes longer than that (states, parameters, speech: about 5 s with SmolLM2), so
the client waits ``RESEND_AFTER_MODEL`` (at 3 s it sent 78 messages again in 30 minutes)."""
LOUD: Final = ("warning", "error", "critical")


@dataclass
class Child:
    """One process of the soak: its command, output files and readings."""

    name: str
    argv: list[str]
    folder: Path
    data: Path | None
    proc: subprocess.Popen[bytes] | None = None
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    """(seconds since the start, RSS bytes, open files, threads, data bytes)."""
    signalled: bool = False

    @property
    def stdout(self) -> Path:
        return self.folder / f"{self.name}.out"

    @property
    def stderr(self) -> Path:
        return self.folder / f"{self.name}.err"

    def start(self) -> None:
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def lines(self) -> list[str]:
        return self.stdout.read_text(encoding="utf-8", errors="replace").splitlines()

    def sample(self, at: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pid = self.proc.pid
        rss, fds, threads = rss_bytes(pid), fd_count(pid), thread_count(pid)
        if rss is None or fds is None or threads is None:
            return
        self.samples.append((at, rss, fds, threads, data_bytes(self.data) if self.data else 0))

    def terminate(self) -> None:
        """One SIGTERM, however often it is called: a second one is a user's "stop now"."""
        if self.proc is not None and self.proc.poll() is None and not self.signalled:
            self.signalled = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM (unless sent already), then SIGKILL after ``STOP_GRACE``; the exit status."""
        if self.proc is None:
            return None
        self.terminate()
        try:
            return self.proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(STOP_GRACE)


async def wait_line(child: Child, predicate: str, timeout: float = START_TIMEOUT) -> list[str]:
    """The child's stdout lines once one starts with ``predicate`` (raises on timeout or exit)."""
    with trio.fail_after(timeout):
        while True:
            lines = child.lines()
            if any(line.startswith(predicate) for line in lines):
                return lines
            if child.proc is not None and child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}); see {child.stderr}")
            await trio.sleep(0.2)


def first_address(lines: Sequence[str], name: str) -> str:
    """The first indented address after ``<name> peer <peer id>``."""
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} peer "))
    peer = lines[at].split()[-1]
    addr = lines[at + 1].strip()
    return addr if "/p2p/" in addr else f"{addr}/p2p/{peer}"


def companion_argv(
    card: Path, data: Path, peers: Sequence[str], ws: bool, base_url: str | None = None
) -> list[str]:
    argv = [sys.executable, "-m", "companion", "run", str(card), "--no-mdns", "--log-format", "json"]
    if base_url is not None:
        argv += ["--model", MODEL, "--base-url", base_url]
    argv += ["--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(data), "--metrics", "127.0.0.1:0"]
    for peer in peers:
        argv += ["--peer", peer]
    if ws:
        argv += ["--ws", "127.0.0.1:0", "--no-webrtc", "--no-voice"]
    return argv


async def everyone_sees(children: Sequence[Child], ids: Sequence[str]) -> None:
    from companion.app.lines import parse_sees

    wanted = frozenset(ids)
    with trio.fail_after(START_TIMEOUT):
        while True:
            seen = {
                parsed[0]
                for child in children
                for line in child.lines()
                if (parsed := parse_sees(line)) is not None and parsed[1] == wanted
            }
            if seen >= wanted:
                return
            await trio.sleep(0.5)


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    replies: int = 0
    resends: int = 0
    unanswered: list[str] = field(default_factory=list)


async def converse(
    url: str,
    ids: Sequence[str],
    tally: Tally,
    interval: float,
    until: float,
    resend_after: float = RESEND_AFTER,
) -> None:
    """One message to every companion each ``interval`` seconds until ``until`` (monotonic), sent
    again after ``resend_after`` seconds with nothing back (see :data:`RESENDS`)."""
    from trio_websocket import open_websocket_url

    async with open_websocket_url(f"{url}?topics=messages") as ws:
        n = 0
        while time.monotonic() + interval <= until + 1:
            started = time.monotonic()
            msg_id = f"soak-{n:04d}"
            text = QUESTIONS[n % len(QUESTIONS)]
            params = {"id": msg_id, "from": USER, "to": list(ids), "message": text}
            frame = json.dumps(
                {"topic": "messages", "body": {"jsonrpc": "2.0", "method": "message.send", "params": params}}
            )
            tally.sent += 1
            await ws.send_message(frame)
            answered, sends = False, 1
            with trio.move_on_after(max(1.0, interval - 2)):
                while True:
                    with trio.move_on_after(resend_after) as quiet:
                        got = json.loads(await ws.get_message())
                    if quiet.cancelled_caught:
                        if sends <= RESENDS and not answered:
                            sends += 1
                            tally.resends += 1
                            await ws.send_message(frame)
                        continue
                    params_in = got.get("params") if isinstance(got, dict) else None
                    meta = (params_in or {}).get("metadata") or {}
                    if got.get("method") == "message.send" and meta.get("in_reply_to"):
                        tally.replies += 1
                        if meta["in_reply_to"] == msg_id and not answered:
                            answered = True
                            tally.answered += 1
                        sends = RESENDS + 1  # something came back: the mesh is there
            if not answered:
                tally.unanswered.append(msg_id)
            n += 1
            await trio.sleep(max(0.0, started + interval - time.monotonic()))


async def sampler(children: Sequence[Child], start: float, every: float, until: float, tally: Tally) -> None:
    while True:
        at = time.monotonic() - start
        for child in children:
            child.sample(at)
        print_sample(children, at, tally)
        if time.monotonic() + every > until:
            return
        await trio.sleep(every)


def print_sample(children: Sequence[Child], at: float, tally: Tally) -> None:
    print(f"t={at / 60:6.1f} min  conversations {tally.answered}/{tally.sent} answered", flush=True)
    for child in children:
        if not child.samples or child.samples[-1][0] != at:
            print(f"  {child.name:<22} (gone)", flush=True)
            continue
        _, rss, fds, threads, data = child.samples[-1]
        print(
            f"  {child.name:<22} rss {rss / 2**20:7.1f} MB  fds {fds:4d}  threads {threads:3d}  "
            f"data {data / 1024:8.1f} kB",
            flush=True,
        )


def per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """The slope of the least-squares line through ``(seconds, value)`` points, per hour."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    slope, _ = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return slope * 3600


def summary(children: Sequence[Child], tally: Tally, warm_up: float, minutes: float) -> None:
    print(f"\n== soak of {minutes:g} min: growth per hour (fit over samples after {warm_up / 60:.1f} min)")
    columns = (("rss MB", 1, 2**20), ("fds", 2, 1), ("threads", 3, 1), ("data kB", 4, 1024))
    for child in children:
        kept = [s for s in child.samples if s[0] >= warm_up] or child.samples
        if not kept:
            print(f"  {child.name:<22} no samples")
            continue
        parts = []
        for label, index, unit in columns:
            first, last = kept[0][index] / unit, kept[-1][index] / unit
            slope = per_hour([(s[0], s[index] / unit) for s in kept])
            growth = "n/a" if slope is None else f"{slope:+.1f}/h"
            parts.append(f"{label} {first:.1f} -> {last:.1f} ({growth})")
        print(f"  {child.name:<22} " + "; ".join(parts))
    print(
        f"conversations answered: {tally.answered}/{tally.sent}; replies received: {tally.replies}; "
        f"messages sent again: {tally.resends}"
    )
    if tally.unanswered:
        print(f"unanswered: {', '.join(tally.unanswered)}")


COUNTED: Final = (
    ("companion_replies_total", "replies"),
    ("companion_turns_led_total", "turns led"),
    ("companion_model_request_duration_seconds_count", "model calls"),
    ("companion_store_commit_duration_seconds_count", "store commits"),
    ("companion_payloads_dropped_total", "payloads dropped"),
)
"""What :func:`print_metrics` sums from each process's ``/metrics`` (and the label it prints)."""


def print_metrics(children: Sequence[Child]) -> None:
    """Each companion process's own count of what it did, from its ``--metrics`` endpoint (as
    Prometheus would scrape it): replies, turns led, model calls, store commits and drops by
    reason, with the slowest store commit bucket that was reached."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    print("\n== each process's /metrics at the end")
    for child in children:
        line = next((x for x in child.lines() if x.startswith("metrics ")), None)
        if line is None:
            print(f"  {child.name:<22} no metrics line")
            continue
        try:
            with urllib.request.urlopen(line.split()[1], timeout=10) as response:
                text = response.read().decode()
        except OSError as exc:
            print(f"  {child.name:<22} /metrics failed: {exc}")
            continue
        totals: dict[str, float] = {}
        drops: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in dict(COUNTED):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                if sample.name == "companion_payloads_dropped_total":
                    reason = sample.labels["reason"]
                    drops[reason] = drops.get(reason, 0.0) + sample.value
        parts = [f"{label} {totals.get(name, 0):g}" for name, label in COUNTED]
        reasons = ", ".join(f"{k} {v:g}" for k, v in sorted(drops.items()))
        print(f"  {child.name:<22} " + "; ".join(parts) + (f" ({reasons})" if reasons else ""))


def loud_lines(child: Child) -> list[tuple[float, str]]:
    """Every WARNING/ERROR/CRITICAL record of ``child``'s stderr with its time stamp, and any
    line that is not a record (a traceback printed outside logging: stamped as the record
    before it)."""
    out: list[tuple[float, str]] = []
    at = 0.0
    for line in child.stderr.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append((at, line))
            continue
        if not isinstance(record, dict):
            out.append((at, line))
            continue
        at = float(record.get("ts") or at)
        if record.get("level") in LOUD:
            out.append((at, line))
    return out


async def soak(args: argparse.Namespace, folder: Path) -> int:
    if args.llama_venv is None:
        return await soak_with(args, folder, None, None)
    with llama_server(args.llama_venv, not args.llama_no_cache, args.llama_cache_size or None) as server:
        model = Child("llama-cpp-python", [], folder, None, proc=server.proc)
        return await soak_with(args, folder, server.url, model)


async def soak_with(args: argparse.Namespace, folder: Path, base_url: str | None, model: Child | None) -> int:
    """The soak; with ``base_url``, its companions talk through that server, and ``model`` (its
    process) is read with theirs but never stopped here."""
    ids = companion_ids(args.companions, "soak")
    cards = write_cards(folder, ids, args.turns)
    children = [
        Child(
            cid,
            companion_argv(card, folder / f"data-{cid}", [], i == 0, base_url),
            folder,
            folder / f"data-{cid}",
        )
        for i, (cid, card) in enumerate(zip(ids, cards, strict=True))
    ]
    try:
        children[0].start()
        lines = await wait_line(children[0], "bridge ")
        hub = first_address(lines, ids[0])
        url = next(line for line in lines if line.startswith("bridge ")).split()[1]
        for child in children[1:]:
            child.argv += ["--peer", hub]
            child.start()
        if not args.no_bare:
            bare_argv = [
                sys.executable,
                str(HERE / "bench_conversation.py"),
                "--bare-worker",
                BARE,
                "--peer",
                hub,
            ]
            children.append(Child(BARE, bare_argv, folder, None))
            children[-1].start()
        watched = [*children, *([model] if model is not None else [])]  # the bare peer included
        await everyone_sees(children[: len(ids)], ids)
        print(f"soak: {len(ids)} companions and the bridge up; a conversation every {args.interval:g} s")
        print(f"soak: {args.minutes:g} min from {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
        print("soak: pids " + ", ".join(f"{c.name}={c.proc.pid}" for c in children if c.proc), flush=True)
        tally = Tally()
        start = time.monotonic()
        until = start + args.minutes * 60
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler, watched, start, args.sample, until, tally)
            resend_after = RESEND_AFTER_MODEL if args.llama_venv else RESEND_AFTER
            await converse(url, ids, tally, args.interval, until, resend_after)
        summary(watched, tally, min(args.interval, args.minutes * 30), args.minutes)
        await trio.to_thread.run_sync(print_metrics, children[: len(ids)])
    finally:
        stopping = time.time()
        for child in children:  # all at once: a peer stopping first is not what is measured
            child.terminate()
        statuses = {child.name: child.stop() for child in children}
    print("exit statuses after SIGTERM: " + ", ".join(f"{k}={v}" for k, v in statuses.items()))
    loud = {child.name: loud_lines(child) for child in children}
    during = {k: [line for at, line in v if at < stopping] for k, v in loud.items()}
    after = {k: [line for at, line in v if at >= stopping] for k, v in loud.items()}
    for label, found in (("during the soak", during), ("after SIGTERM", after)):
        print(f"WARNING/ERROR lines {label}: {sum(len(v) for v in found.values())}")
        for name, lines in found.items():
            print_loud(name, lines)
    return 0


ALL_LOUD: Final = 20
"""Up to this many WARNING/ERROR lines of a process are printed whole; more are counted by event."""


def print_loud(name: str, lines: Sequence[str]) -> None:
    """``name``'s loud lines: all of them, or (past :data:`ALL_LOUD`) a count per event with the
    first line of each (a real model's run refuses lines by the dozen)."""
    if len(lines) <= ALL_LOUD:
        for line in lines:
            print(f"  {name}: {line}")
        return
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        event = str(record.get("event", "?")) if isinstance(record, dict) else "(not a log record)"
        counts[event] = counts.get(event, 0) + 1
        first.setdefault(event, line)
    for event, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {count} x {event}; the first: {first[event][:400]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the soak runs (30)")
    parser.add_argument("--companions", type=int, default=5, help="companion processes (5)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between conversations (60)")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between readings (60)")
    parser.add_argument("--turns", type=int, default=3, help="the cards' max_turns (3)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare py-libp2p reference")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data)")
    parser.add_argument(
        "--llama-venv", type=Path, help="a real model: SmolLM2 behind llama-cpp-python from this venv"
    )
    parser.add_argument(
        "--llama-cache-size",
        type=int,
        default=CACHE_SIZE,
        help="the server's --cache_size in bytes (default 268435456, as docs/models.md says; 0: the "
        "server's own default, 2 GiB)",
    )
    parser.add_argument("--llama-no-cache", action="store_true", help="the server with --cache false")
    args = parser.parse_args(argv)
    if args.companions < 2 or args.minutes <= 0 or args.interval < 5 or args.sample < 1:
        parser.error(
            "needs at least 2 companions, minutes > 0, an interval of 5 s or more, a sample of 1 s or more"
        )
    folder = Path(tempfile.mkdtemp(prefix="bench_soak_"))
    try:
        return trio.run(soak, args, folder)
    finally:
        if args.keep:
            print(f"kept: {folder}")
        else:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
