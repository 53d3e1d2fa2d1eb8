"""An upgrade one machine at a time: a companion still on release 0.2.0 and two of today's hold
one conversation. ``tests/releases/0.2.0.tar.gz`` is that release's own package and cards (its
README says how it was made); it runs with today's dependencies, as an old node would beside new
ones on one network.

A person (a bare libp2p peer, connected to the old node only, so everything it hears passes
through the old node) asks all three. Companions of both releases reply, both of today's see the
conversation close (also the one whose line was the last, from an old leader's array), and
neither release logs a warning, an error or a traceback: each side's extensions of aikyo's wire
are ones the other takes or ignores.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

from companion.protocol import MESSAGES, Message, encode
from support.live import start_run
from support.network import Network, Proc, network, publish, warm_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "tests" / "releases"
PERSON = "user_upgrader"
OLD = "companion_pim"
TODAY = ("companion_ostra", "companion_juniper")


def unpack_release(version: str, into: Path) -> Path:
    """The folder holding release ``version``'s ``companion`` package and ``cards/``."""
    with tarfile.open(RELEASES / f"{version}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / f"companion-{version}"


def start_old(net: Network, code: Path) -> Proc:
    """``companion run`` of the old release for Pim, its own card; returns once it listens."""
    argv = [sys.executable, "-m", "companion.cli.run", str(code / "cards" / "pim.yaml")]
    argv += ["--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(net.tmp / "data-old")]
    argv += ["--log-format", "json", "--log-level", "INFO"]
    proc = Proc("release-0.2.0", argv, pythonpath=str(code))  # never warm: another package
    net.procs.append(proc)
    proc.event("started", 60)
    return proc


def replies(raw: Proc) -> list[tuple[str, str]]:
    """(speaker, line) of every companion's message the person heard."""
    heard = []
    for event in raw.events:
        if event.get("event") == "message":
            params = json.loads(str(event["text"])).get("params", {})
            if str(params.get("from", "")).startswith("companion_") and "message" in params:
                heard.append((str(params["from"]), str(params["message"])))
    return heard


def troubles(proc: Proc) -> list[str]:
    """Warnings, errors and tracebacks, but a model's own tool call refused: on a loaded machine
    a scripted speaker may still be writing when its turn has moved on, and its line is refused
    ("the conversation moved on"), as it is between any two companions."""
    return [
        line
        for line in proc.lines
        if ('"level": "warning"' in line or '"level": "error"' in line or "Traceback" in line)
        and '"logger": "companion.models.' not in line
    ]


@pytest.mark.early
@pytest.mark.timeout(240)
def test_a_companion_of_release_0_2_0_converses_with_today_s(tmp_path: Path) -> None:
    code = unpack_release("0.2.0", tmp_path)
    with network(tmp_path) as net:
        old = start_old(net, code)
        address = old.event("started", 5)["addrs"][0]
        cards = [ROOT / "cards" / "ostra.yaml", ROOT / "cards" / "juniper.yaml"]
        today = start_run(net, "today", cards, address)
        raw, _ = net.raw(None)
        raw.send({"op": "connect", "addr": address})
        raw.event("connected", 30)
        warm_up(raw, today, PERSON, [PERSON])  # to nobody: heard by today's nodes through the old one
        question = Message.create(PERSON, [OLD, *TODAY], "Hello all, what are you up to today?", id="q-up")
        publish(raw, MESSAGES, encode(question))
        for companion in TODAY:  # the one whose line was the last too, whoever led
            today.event("conversation_over", 120, companion=companion)
        heard = replies(raw)
        speakers = {speaker for speaker, _ in heard}
        assert OLD in speakers and speakers & set(TODAY), heard
        assert troubles(today) == [] and troubles(old) == []
        assert old.running and today.running
