"""``companion demo`` from its start: its companions forked by its spawner
(companion/app/spawner.py), against the reference measured in the same run, the same demo with
each companion a fresh interpreter (as before the spawner).

Each run is a fresh process, as a user's ``companion demo``: this script's ``--one MODE`` runs
the packaged cards' demo offline (scripted model, ``--pace 0``, ``--turns`` replies) and says
when every companion was ready (the demo's ``demo_ready``); this script measures its whole run
and the CPU seconds of it and every process it started (``RUSAGE_CHILDREN``: the companions are
reaped through the spawner and the demo). The two kinds alternate, one untimed warm-up run of
each first. Printed: medians and spread, and the ratio spawner/fresh.

    python scripts/bench_demo.py [--runs 5] [--turns 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("spawner", "fresh")


def one(mode: str, turns: int, began: float) -> None:
    """One demo in this (fresh) process; prints ``{"ready": seconds from began}``."""
    import trio

    from companion.app.demo import DemoOptions, default_cards, run_demo
    from companion.app.spawner import Spawner, preload_for

    ready: list[float] = []

    class Ready(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "companion_event", "") == "demo_ready":
                ready.append(time.time() - began)

    demo_logger = logging.getLogger("companion.app.demo")
    demo_logger.setLevel(logging.INFO)
    demo_logger.addHandler(Ready())
    spawner = Spawner.fork(preload_for("scripted")) if mode == "spawner" else None
    if mode == "spawner" and spawner is None:
        raise SystemExit("bench_demo: this machine cannot fork a spawner")
    options = DemoOptions(cards=default_cards(), pace=0.0, max_replies=turns, timeout=120.0)
    try:
        end = trio.run(run_demo, options, lambda event: None, spawner)
    finally:
        if spawner is not None:
            spawner.close()
    if end.reason not in ("terminal", "turn_cap") or not ready:
        raise SystemExit(f"bench_demo: the demo did not finish ({end.reason}: {end.why})")
    print(json.dumps({"ready": ready[0]}))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(mode: str, turns: int) -> dict[str, float]:
    cpu_before = _children_cpu()
    began = time.time()
    argv = [sys.executable, str(Path(__file__)), "--one", mode, "--turns", str(turns), "--began", repr(began)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    whole = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"bench_demo: a {mode} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    ready = float(json.loads(done.stdout.splitlines()[-1])["ready"])
    return {"ready": ready, "whole": whole, "cpu": _children_cpu() - cpu_before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--began", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.turns, args.began if args.began is not None else time.time())
        return 0
    sys.path.insert(0, str(HERE))
    from bench_support import machine

    print(f"bench_demo: {machine()}; {args.runs} runs of each, {args.turns} replies, alternating")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for mode in MODES:
        _run(mode, args.turns)  # warm-up: the page cache, the bytecode
    for _ in range(args.runs):
        for mode in MODES:
            results[mode].append(_run(mode, args.turns))
    medians: dict[str, dict[str, float]] = {}
    for mode in MODES:
        medians[mode] = {}
        for key, label in (("ready", "start -> all ready"), ("whole", "start -> exit"), ("cpu", "CPU s")):
            values = [r[key] for r in results[mode]]
            medians[mode][key] = statistics.median(values)
            print(
                f"  {mode:8} {label:18} median {medians[mode][key]:6.2f}  "
                f"({min(values):.2f}-{max(values):.2f})"
            )
    for key in ("ready", "whole", "cpu"):
        print(f"  spawner/fresh {key}: {medians['spawner'][key] / medians['fresh'][key]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
