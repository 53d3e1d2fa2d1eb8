"""Conversations back to back in a mixed network: two JavaScript peers that take turns as aikyo
1.6 companions do (``tests/js/peer.mjs`` in its aikyo mode: only an array's top speaker replies,
yields ignored, ``closing: none`` arrays, no turn limit, aikyo's model calls under its one
"generating" flag) and two ``companion run`` companions with turn limits 3 and 4
(``tests/support/mixed.py``), each conversation opened by a client addressing all
four. Printed: stalls (the last message unanswered for ``--stall`` s), states arrays per
addressed message and what the second ones were (ours or the aikyo peers'), replies per
conversation (those past the highest limit, ours or aikyo's, and whether ours spoke past their
own), time to ``terminal``. ``--explain`` adds, for each conversation with a stall, a second
array or a reply past the highest limit, every message and array with who published it.

With ``--reference DIR``, the same run follows with our companions from another checkout (e.g.
the commit before these turn rules), printed beside it: the figures of the same machine, the
same run. Needs Node.js and npm (the peers' packages are installed into a cache, once).

    .venv/bin/python scripts/bench_mixed.py [--conversations 50] [--reference ../main] [--explain]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run(
    conversations: int,
    label: str,
    *,
    pythonpath: str | None,
    delay_ms: int,
    stall: float,
    keep: Path | None = None,
    explain: bool = False,
) -> dict[str, Any]:
    """One network, ``conversations`` back to back; the figures of :func:`support.mixed.summary`
    (``explain``: with ``stories``, who published what in each conversation worth reading)."""
    from support.js import js_peer_command
    from support.mixed import mixed_network, stories, summary

    command = js_peer_command()
    if command is None:
        raise SystemExit("bench_mixed: Node.js and npm are needed for the aikyo peers")
    with (
        tempfile.TemporaryDirectory(prefix="bench-mixed-") as tmp,
        mixed_network(Path(tmp), command, delay_ms=delay_ms, pythonpath=pythonpath, keep=keep) as mixed,
    ):
        reports = []
        for n in range(conversations):
            reports.append(mixed.converse(quiet=2.0, stall=stall, limit=stall * 3))
            last = reports[-1]
            print(
                f"{label} {n + 1}/{conversations}: {last.replies} replies, "
                f"terminal after {last.terminal_after and round(last.terminal_after, 2)} s"
                + (" STALLED" if last.stalled else ""),
                file=sys.stderr,
                flush=True,
            )
        figures = {"label": label, **summary(reports)}
        if explain:
            figures["stories"] = stories(reports)
        return figures


def describe(figures: dict[str, Any]) -> str:
    replies = figures["replies"]
    second = ", ".join(f"{kind} {n}" for kind, n in figures["second_arrays"].items())
    past = ", ".join(f"{whose} {n}" for whose, n in figures["replies_past_highest_cap"].items())
    text = (
        f"{figures['label']}: {figures['conversations']} conversations, {figures['stalls']} stalls; "
        f"arrays per addressed message {figures['arrays_per_addressed_message']} "
        f"(second arrays: {second}); replies per conversation "
        f"min/median/max {min(replies)}/{figures['replies_median']}/{max(replies)}, "
        f"{figures['past_highest_cap']} conversations past the highest limit {figures['highest_cap']} "
        f"(replies past it: {past}; {figures['of_them_answered_by_our_terminal']} of them answered "
        f"first by our terminal; ours past their own limit: {figures['our_replies_past_own_cap']}); "
        f"time to terminal median {figures['terminal_s_median']} s, max {figures['terminal_s_max']} s"
    )
    return "\n".join([text, *figures.get("stories", [])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--reference", help="a checkout whose companions run the reference network")
    parser.add_argument("--delay-ms", type=int, default=200, help="the aikyo peers' time per model call")
    parser.add_argument("--stall", type=float, default=20.0, help="seconds unanswered that make a stall")
    parser.add_argument("--json", action="store_true", help="one JSON object per network")
    parser.add_argument("--keep", help="a directory for every process's output (one per network)")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print who published what in each conversation with a stall, a second array or a "
        "reply past the highest limit",
    )
    args = parser.parse_args()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # unwinds through the network, which stops its processes

    signal.signal(signal.SIGTERM, interrupted)
    sys.path.insert(0, str(ROOT / "tests"))  # the support package
    cases: list[tuple[str, str | None]] = [("this tree", None)]
    if args.reference:
        cases.append((f"reference {args.reference}", str(Path(args.reference).resolve())))
    for n, (label, pythonpath) in enumerate(cases):
        keep = Path(args.keep) / f"network-{n}" if args.keep else None
        figures = run(
            args.conversations,
            label,
            pythonpath=pythonpath,
            delay_ms=args.delay_ms,
            stall=args.stall,
            keep=keep,
            explain=args.explain,
        )
        print(json.dumps(figures) if args.json else describe(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
