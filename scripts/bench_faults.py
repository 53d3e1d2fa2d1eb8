"""The fault suite at scale: many seeded conversations under faults (``tests/support/faults.py``:
killed leaders and speakers, failing and slow models, reordered states, joiners, and the
scenarios chatter, two groups, forger, ghosts, flaky provider, aikyo-style leader, provider
outage), on the in-memory transport with a virtual clock.

Prints, over all seeds and per scenario: double speech (messages answered twice; goal 0),
stalls (conversations that never reached ``terminal``; goal 0), broken promises (the seed's
scenario did not keep its own promise, ``support.faults.check_scenario``, as the fault suite
asks it: an aikyo-style leader past the cap, a forger obeyed, two groups talking across; goal
0), the longest failover (a failing speaker's yield to the next speaker starting; goal under
FAILOVER seconds), the longest silence between two messages of a conversation (virtual seconds;
dead speakers cost a reply deadline each), and the terminal rate (goal 100 %); then the seeds
that missed a goal (``failing_seeds`` with ``--json``), each reproducible alone with ``--seeds 1
--first SEED``. Exit status 1 when a goal is missed.

    python scripts/bench_faults.py [--seeds 1000] [--first 0] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from companion.log import configure_logging
from support.faults import FAILOVER, SCENARIOS, Outcome, check_scenario, converse_alone, describe


def longest_silence(outcome: Outcome) -> float:
    """The longest wait between two consecutive messages of one conversation, in virtual seconds
    (when its first node saw each message)."""
    longest = 0.0
    for members in outcome.groups:
        first: dict[str, float] = {}
        for at, event in outcome.events:
            if event.kind == "leader_chosen" and event.companion in members:
                first.setdefault(str(event.fields["message_id"]), at)
        times = sorted(first.values())
        longest = max([longest, *(b - a for a, b in itertools.pairwise(times))])
    return longest


def run(seeds: range) -> tuple[list[dict[str, Any]], list[Outcome]]:
    """Each seed alone (:func:`support.faults.converse_alone`): a failing seed fails again when the
    fault suite or a debugger runs it by itself."""
    rows: list[dict[str, Any]] = []
    failures: list[Outcome] = []
    for seed in seeds:
        outcome = converse_alone(seed)
        gaps = outcome.failover_gaps()
        row: dict[str, Any] = {
            "seed": seed,
            "scenario": outcome.scenario,
            "double_speech": len(outcome.double_speech),
            "stalled": not outcome.ended,
            "failover": max(gaps, default=0.0),
            "silence": longest_silence(outcome),
            "replies": sum(t.reply_count for t in outcome.transcripts),
            "promise_broken": not kept_promise(outcome),
        }
        rows.append(row)
        if row["double_speech"] or row["stalled"] or row["failover"] >= FAILOVER or row["promise_broken"]:
            failures.append(outcome)
    return rows, failures


def kept_promise(outcome: Outcome) -> bool:
    """Whether the seed kept its scenario's own promise (:func:`support.faults.check_scenario`,
    as the fault suite asks it): chatter and forgers change nothing, two groups never talk
    across, an aikyo-style leader cannot run past the cap, an outage ends visibly."""
    try:
        check_scenario(outcome)
    except AssertionError:
        return False
    return True


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    return {
        "conversations": n,
        "double_speech": sum(r["double_speech"] for r in rows),
        "stalls": sum(r["stalled"] for r in rows),
        "promises_broken": sum(r["promise_broken"] for r in rows),
        "longest_failover_s": round(max((r["failover"] for r in rows), default=0.0), 3),
        "longest_silence_s": round(max((r["silence"] for r in rows), default=0.0), 3),
        "terminal_rate": round(100.0 * sum(not r["stalled"] for r in rows) / n, 2) if n else math.nan,
        "replies": sum(r["replies"] for r in rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seeds", type=int, default=1000, help="how many seeded conversations (default 1000)"
    )
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--show", type=int, default=1, help="describe this many failing seeds (default 1)")
    args = parser.parse_args()
    configure_logging("ERROR", "json")
    started = time.perf_counter()
    rows, failures = run(range(args.first, args.first + args.seeds))
    wall = time.perf_counter() - started
    total = summary(rows)
    by_scenario: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_scenario[row["scenario"]].append(row)
    if args.json:
        print(
            json.dumps(
                {
                    "all": total,
                    "scenarios": {k: summary(v) for k, v in by_scenario.items()},
                    "failing_seeds": [o.seed for o in failures],
                    "wall_s": wall,
                }
            )
        )
    else:
        header = (
            f"{'scenario':<12}{'runs':>6}{'double':>8}{'stalls':>8}{'promise':>9}"
            f"{'failover s':>12}{'silence s':>11}{'terminal %':>12}"
        )
        print(header)
        print("-" * len(header))
        for name in (*SCENARIOS, "all"):
            s = total if name == "all" else summary(by_scenario.get(name, []))
            if not s["conversations"]:
                continue
            print(
                f"{name:<12}{s['conversations']:>6}{s['double_speech']:>8}{s['stalls']:>8}"
                f"{s['promises_broken']:>9}"
                f"{s['longest_failover_s']:>12.3f}{s['longest_silence_s']:>11.1f}{s['terminal_rate']:>12.2f}"
            )
        if failures:
            print(f"\nfailing seeds: {' '.join(str(o.seed) for o in failures)}")
        print(
            f"\ngoals: double 0, stalls 0, promises broken 0, failover < {FAILOVER:g} s, terminal 100 %; "
            f"{wall:.0f} s wall clock"
        )
    for outcome in failures[: args.show]:
        print("\nfailing seed:\n" + describe(outcome), file=sys.stderr)
    missed = (
        total["double_speech"]
        or total["stalls"]
        or total["promises_broken"]
        or total["longest_failover_s"] >= FAILOVER
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
