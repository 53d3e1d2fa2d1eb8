"""Build a fixture data directory with an old release of companion, from this repository's history.

``python tests/layouts/build_fixture.py COMMIT NAME`` checks COMMIT out in a temporary git
worktree, runs *that* code (``PYTHONPATH`` pointing at it, this environment's dependencies) as
``companion run cards/pim.yaml cards/ostra.yaml --data-dir D``, has one conversation with it, stops
it with SIGTERM, and packs ``D`` as ``tests/layouts/NAME.tar.gz``. The conversation: a bare
py-libp2p peer (``support.raw_publisher``) publishes a person's message to both
companions and waits for two replies; a second one claims the id ``companion_visitor``, so a
release that pins ids writes ``trust.json``. It prints the peer ids, the replies, the files and
the companions' warnings and errors. What each fixture is: ``tests/layouts/README.md``.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))  # tests/, for the support package: this runs as a script

from companion.protocol import MESSAGES, Message, encode  # noqa: E402
from support.network import Proc, helper_argv  # noqa: E402

PERSON = "user_fixture"
COMPANIONS = ["companion_pim", "companion_ostra"]
VISITOR = "companion_visitor"
CARDS = ["cards/pim.yaml", "cards/ostra.yaml"]
FLAGS = ["--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json", "--log-level", "INFO"]
"""Flags every release since the first one takes (``-v`` came on 2026-12-01)."""


def converse(run: Proc, replies: int) -> None:
    """The visitor and the person connect to ``run``'s first node; the person asks both
    companions one question and waits (bounded) for ``replies`` replies."""
    addr = run.event("started", 60)["addrs"][0]
    raw = Proc("raw", helper_argv("raw_publisher"), events_on="stdout", stdin=True)
    visitor = Proc(
        "visitor", [*helper_argv("raw_publisher"), "--companion", VISITOR], events_on="stdout", stdin=True
    )
    try:
        for peer in (raw, visitor):
            peer.event("started", 30)
            peer.send({"op": "connect", "addr": addr})
            peer.event("connected", 30)
        time.sleep(3)  # for the companions to hear the peers' subscriptions (old releases log no event)
        question = Message.create(PERSON, COMPANIONS, "Hello both, what are you up to today?", id="fixture")
        raw.send({"op": "publish", "topic": MESSAGES, "b64": base64.b64encode(encode(question)).decode()})
        deadline = time.monotonic() + 60
        while raw.count("message") < replies and time.monotonic() < deadline:
            time.sleep(0.2)
        for event in raw.events:
            if event.get("event") == "message":
                print("reply:", json.loads(event["text"])["params"]["message"][:100])
    finally:
        for peer in (raw, visitor):
            peer.stop()


def build(commit: str, name: str, replies: int) -> None:
    with tempfile.TemporaryDirectory(prefix="layout-") as tmp:
        checkout, data = Path(tmp) / "src", Path(tmp) / "data"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), commit], check=True
        )
        try:
            argv = [sys.executable, "-m", "companion.cli.run", *CARDS, *FLAGS, "--data-dir", str(data)]
            run = Proc("old", argv, pythonpath=str(checkout))
            try:
                run.wait_for(
                    lambda e: e.get("event") == "started" and run.count("started") >= 2, 60, "2 nodes"
                )
                converse(run, replies)
            finally:
                print("exit", run.stop(20))
            for line in run.lines:
                if " peer " in line and not line.startswith("{"):
                    print(line)
                elif '"level": "error"' in line or '"level": "warning"' in line or "Traceback" in line:
                    print("log:", line[:300])
            for path in sorted(data.rglob("*")):
                print(path.relative_to(data), path.stat().st_size if path.is_file() else "")
            out = HERE / f"{name}.tar.gz"
            with tarfile.open(out, "w:gz") as tar:
                tar.add(data, arcname="data")
            print(out.name, out.stat().st_size, "bytes")
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)], check=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("commit")
    parser.add_argument("name", help="the fixture's name: the date of the release")
    parser.add_argument("--replies", type=int, default=2, help="replies to wait for before the stop")
    args = parser.parse_args()
    build(args.commit, args.name, args.replies)


if __name__ == "__main__":
    main()
