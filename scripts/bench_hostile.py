"""Hostile payloads through a running node's edge: no pass/fail, just numbers.

Starts two ``companion run`` companions (scripted model, JSON logs) on loopback, ``a`` and ``b``
(``b`` hears only what ``a`` forwards), and a raw py-libp2p peer (``tests/support/raw_publisher.py``:
strict signing, no validators) connected to ``a``. The raw peer publishes ``--cases`` hypothesis
cases per topic (arbitrary bytes, arbitrary JSON, each topic's envelope with one field wrong: lone
surrogates, huge and deep values) and ``--rpcs`` whole fuzzed pubsub RPCs on its own streams.
Then it asks ``a`` a question. It prints, per topic and in total: payloads tried, dropped by
reason, accepted, what ``b`` was forwarded, process exits, ``a``'s RSS before and after, and
``a``'s log bytes per 1,000 payloads.

    python scripts/bench_hostile.py                       # 10,000 cases per topic, a few minutes
    python scripts/bench_hostile.py --cases 500 --rpcs 100 --json

``--node-package DIR`` runs the two companions with the package found in ``DIR`` (a checkout
of another revision, e.g. to measure the log volume before a change); the raw peer and this
script keep this checkout's.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the support package

from companion.protocol import MESSAGES, TOPICS  # noqa: E402
from support.hostile_payloads import collect, payloads, rpcs  # noqa: E402
from support.network import Proc, ask, network  # noqa: E402


def rss_kib(proc: Proc) -> int:
    if not proc.running:
        return -1
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def log_bytes(proc: Proc) -> int:
    """What the process wrote so far (its JSON log lines on stderr, a few lines on stdout),
    leaving out the ``stats`` lines this script asks for."""
    with proc._cond:
        return sum(len(line.encode()) + 1 for line in proc.lines if '"event": "stats"' not in line)


def send_all(raw: Proc, commands: list[dict[str, Any]], timeout: float) -> None:
    """Send ``commands`` and wait until the raw peer has carried out the last one."""
    mark = raw.count("published")
    for command in commands:
        raw.send(command)
    raw.send({"op": "publish", "topic": MESSAGES, "b64": base64.b64encode(b"{}").decode(), "ack": True})
    raw.wait_for(lambda e: e.get("event") == "published" and raw.count("published") > mark, timeout, "ack")


def stats(proc: Proc) -> dict[str, Any]:
    """The node's counters; its last ``stopped`` figures if it exited (a crash is a result)."""
    if proc.running:
        try:
            return proc.stats()
        except AssertionError:
            if proc.running:
                raise
    last = [e for e in proc.events if e.get("event") in ("stats", "stopped")]
    return last[-1] if last else {"accepted": 0, "dropped": 0, "drops": {}}


def settled(proc: Proc, limit: float = 60.0) -> dict[str, Any]:
    """The node's stats once it has handled everything sent (its counts stop moving)."""
    deadline = time.monotonic() + limit
    current = stats(proc)
    while proc.running and time.monotonic() < deadline:
        time.sleep(1.0)
        again = stats(proc)
        if (again["accepted"], again["dropped"]) == (current["accepted"], current["dropped"]):
            return again
        current = again
    return current


def answers(raw: Proc, watched: list[Proc], tag: str, timeout: float = 60.0) -> bool:
    """Whether ``companion_a`` answers the raw peer's question (a fresh message id each try, as
    the tests ask: the same bytes again are a replay, dropped at the edge), while ``watched``
    run."""
    if not all(p.running for p in watched):
        return False
    try:
        ask(raw, "a", f"bench-{tag}", timeout=timeout)
    except AssertionError:
        return False
    return all(p.running for p in watched)


def run(cases: int, rpc_cases: int, node_package: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"cases_per_topic": cases, "topics": {}}
    with tempfile.TemporaryDirectory() as tmp, network(Path(tmp)) as net:
        a, a_started = net.companion("a", pythonpath=node_package)
        b, _ = net.companion("b", a_started["addrs"][0], pythonpath=node_package)
        raw, _ = net.raw("x")
        raw.send({"op": "connect", "addr": a_started["addrs"][0]})
        raw.event("connected", 15)
        for proc, key in ((a, "b"), (a, "x"), (b, "a")):
            proc.event("companion_joined", 30, companion_id=f"companion_{key}")
        raw.send({"op": "pace", "seconds": 0})
        result["answers_before"] = answers(raw, [a], "before")
        result["rss_kib_before"] = rss_kib(a)
        tried = 0
        attack_log = 0
        for topic in TOPICS:
            generated = collect(payloads((topic,)), cases)
            before_a, before_b, logged = stats(a)["drops"], stats(b)["drops"], log_bytes(a)
            started = time.monotonic()
            commands = [
                {"op": "publish", "topic": t, "b64": base64.b64encode(data).decode()} for t, data in generated
            ]
            send_all(raw, commands, timeout=max(120.0, cases / 20))
            after_a = settled(a)
            after_b = settled(b)["drops"]
            written = log_bytes(a) - logged
            tried += len(generated)
            attack_log += written
            print(f"{topic}: done", file=sys.stderr, flush=True)
            result["topics"][topic] = {
                "tried": len(generated),
                "seconds": round(time.monotonic() - started, 1),
                "dropped": diff(after_a["drops"], before_a),
                "forwarded_to_b_and_dropped_there": diff(after_b, before_b),
                "log_bytes_per_1000": round(written / len(generated) * 1000),
            }
        if rpc_cases:
            fuzzed = collect(rpcs(), rpc_cases)
            before = stats(a)["drops"]
            logged = log_bytes(a)
            commands = [{"op": "rpc", "b64": base64.b64encode(d).decode(), "frame": True} for d in fuzzed]
            send_all(raw, commands, timeout=max(120.0, rpc_cases / 5))
            settled(a)
            written = log_bytes(a) - logged
            attack_log += written
            result["rpcs"] = {
                "tried": len(fuzzed),
                "dropped": diff(stats(a)["drops"], before),
                "log_bytes_per_1000": round(written / len(fuzzed) * 1000),
            }
            tried += len(fuzzed)
        result["answers_after"] = answers(raw, [a], "after")
        result["rss_kib_after"] = rss_kib(a)
        final = settled(a)
        result["accepted"] = final["accepted"]
        result["dropped_total"] = final["dropped"]
        result["drops_by_reason"] = final["drops"]
        result["tried_total"] = tried
        result["log_bytes_per_1000_total"] = round(attack_log / max(tried, 1) * 1000)
        result["exits"] = {p.name: p.popen.poll() for p in (a, b) if not p.running}
        result["run_failed"] = a.count("run_failed") + b.count("run_failed")
    return result


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def mib(kib: int) -> str:
    return "gone" if kib < 0 else f"{kib / 1024:.1f} MiB"


def describe(result: dict[str, Any]) -> str:
    out = []
    for topic, row in result["topics"].items():
        out.append(
            f"{topic:>9}: {row['tried']} tried in {row['seconds']} s, dropped {row['dropped']}, "
            f"b refused {row['forwarded_to_b_and_dropped_there'] or 'nothing'}, "
            f"log {row['log_bytes_per_1000']} bytes per 1,000"
        )
    if "rpcs" in result:
        row = result["rpcs"]
        out.append(
            f"     rpcs: {row['tried']} tried, dropped {row['dropped']}, "
            f"log {row['log_bytes_per_1000']} bytes per 1,000"
        )
    out.append(
        f"total: {result['tried_total']} tried, {result['accepted']} accepted, "
        f"{result['dropped_total']} dropped; "
        f"exits {result['exits'] or 'none'}, run_failed {result['run_failed']}; "
        f"RSS {mib(result['rss_kib_before'])} -> {mib(result['rss_kib_after'])}; "
        f"log {result['log_bytes_per_1000_total']} bytes per 1,000 payloads; "
        f"answers before {result['answers_before']}, after {result['answers_after']}"
    )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="hypothesis cases per topic")
    parser.add_argument("--rpcs", type=int, default=1000, help="fuzzed whole RPCs (0: none)")
    parser.add_argument("--node-package", default=None, help="run the companions with the package in DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    node_package = str(Path(args.node_package).resolve()) if args.node_package else None
    result = run(args.cases, args.rpcs, node_package)
    print(json.dumps(result) if args.json else describe(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
