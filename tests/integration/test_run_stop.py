"""SIGTERM to ``companion run pim ostra --ws`` at every point of a turn loses nothing.

A person's message goes to both companions through the process's own bridge (a real WebSocket
client); the stop lands before the leader's states, during the speaker's model call (the offline
model with a pace: the speaker's slot is busy for that long), during the reply's publish, and
past the grace a reply in flight gets (then it is withdrawn). Each time: exit 0, no ERROR line,
no traceback, and each companion's store holds every message its node handed to it (counted
against its ``inbound`` events). A second SIGTERM stops at once with 143, and what was stored
before is still there.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trio_websocket import open_websocket_url

from companion.store.sqlite import Store
from support.cli import run_companion
from support.live import BOTH, OSTRA, PIM, start_pim_and_ostra
from support.live_bridge import blocking, message_frame
from support.local_model import LOCAL_MODEL, local_model_name, needs_local_model
from support.network import Event, Proc, network

pytestmark = pytest.mark.integration

EXIT_WITHIN = 15.0
"""The stop's deadlines: 3 s of grace, a publish, the nodes' close (5 s at most)."""


def _is(name: str, **fields: object) -> Callable[[Event], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


def _third_speaker(e: Event) -> bool:
    """A speaker starts its slot after two replies: the stop lands mid-conversation."""
    return _speaking(e) and e.get("turn") == 2


def _speaking(e: Event) -> bool:
    """The speaker's own choice of itself: its slot (the pace, then the model) starts now."""
    return e.get("event") == "speaker_chosen" and e.get("companion") == e.get("speaker")


async def _say_then_stop(proc: Proc, url: str, when: Callable[[Event], bool], *signals: int) -> int:
    """A message to both through the bridge; each of ``signals`` as soon as ``when`` matched
    (the next one once the stop began); the exit status."""
    async with open_websocket_url(url) as ws:
        await ws.send_message(
            message_frame("user_mika", [PIM, OSTRA], "Hello you two, how was the day?", "m-1")
        )
        await blocking(proc.wait_for, when, 30, "the moment to stop")
        began = time.monotonic()
        proc.signal(signals[0])
        for signum in signals[1:]:
            await blocking(proc.event, "stopping", 10)
            proc.signal(signum)
        status = await blocking(proc.reap, EXIT_WITHIN)
    print(f"exit {status} {time.monotonic() - began:.2f} s after the first signal")
    return status


def _delivered(proc: Proc, cid: str) -> list[str]:
    """Ids of the messages ``cid``'s node handed to its engine (each is recorded, or a duplicate)."""
    return [
        str(e["id"])
        for e in list(proc.events)
        if e.get("event") == "inbound" and e.get("node") == cid and e.get("topic") == "messages"
    ]


def _stored(data: Path, cid: str) -> list[str]:
    with Store.in_directory(data / cid) as store:
        return [m.params.id for m in store.recent(10_000)]


def _assert_clean(proc: Proc) -> None:
    bad = [
        line
        for line in list(proc.lines)
        if "Traceback" in line or '"level": "error"' in line or '"level": "critical"' in line
    ]
    assert bad == [], "\n".join(bad[:5])


def _assert_every_message_stored(proc: Proc, data: Path) -> dict[str, tuple[int, int]]:
    """Per companion: (messages delivered, messages stored); every delivered one is stored."""
    counts = {}
    for cid in sorted(BOTH):
        delivered, stored = _delivered(proc, cid), _stored(data, cid)
        assert "m-1" in stored, (cid, stored)
        missing = [mid for mid in delivered if mid not in stored]
        assert missing == [], f"{cid}: delivered but not stored: {missing}"
        counts[cid] = (len(set(delivered)), len(stored))
    print("delivered, stored per companion:", json.dumps(counts))
    return counts


@pytest.mark.parametrize(
    ("pace", "when"),
    [
        (1.0, _is("inbound", id="m-1")),  # before the leader's states
        (1.0, _speaking),  # during the speaker's (paced) model call: it finishes
        (0.0, _is("tool_call_started", tool="speak")),  # during the reply's publish
        (6.0, _speaking),  # the reply takes longer than the grace: withdrawn
        (0.3, _third_speaker),  # a few messages in, during the third speaker's slot
    ],
    ids=["before-states", "during-model-call", "during-publish", "past-the-grace", "third-reply"],
)
async def test_sigterm_during_a_turn_exits_0_and_stores_every_message(
    pace: float, when: Callable[[Event], bool], tmp_path: Path
) -> None:
    with network(tmp_path) as net:
        proc, url = await blocking(start_pim_and_ostra, net, pace)
        assert await _say_then_stop(proc, url, when, signal.SIGTERM) == 0
        _assert_clean(proc)
        assert proc.count("store_closed", complete=True) == 2
        if when in (_speaking, _third_speaker) and pace < 3.0:  # it finished within the grace
            assert proc.count("replied", message_id="m-1") >= 1
        if pace > 3.0:  # the speaker's slot outlasted the grace: given up, the peers told
            assert proc.count("withdrawn", what="speech", reason="stopping") == 1
            assert proc.count("speaker_failed", reason="stopping") >= 1
    _assert_every_message_stored(proc, tmp_path / "data-home")
    if pace > 3.0:  # and 'companion explain' says why the speaker did not answer
        data = ["--data-dir", str(tmp_path / "data-home")]
        explained = run_companion(["explain", "m-1", *data], cwd=tmp_path).stdout
        assert "  withdrawn " in explained and "could not reply (stopping)" in explained, explained


async def test_sigterm_without_ws_during_a_reply_exits_0_and_stores_every_message(tmp_path: Path) -> None:
    """The same without ``--ws``: the person writes through a bridge of its own process."""
    with network(tmp_path) as net:
        proc, url = await blocking(start_pim_and_ostra, net, 1.0, ws=False)
        assert await _say_then_stop(proc, url, _speaking, signal.SIGTERM) == 0
        _assert_clean(proc)
        assert proc.count("replied", message_id="m-1") >= 1
    _assert_every_message_stored(proc, tmp_path / "data-home")


@needs_local_model
@pytest.mark.timeout(300)
async def test_sigterm_during_a_real_models_call_exits_0_and_stores_every_message(tmp_path: Path) -> None:
    """Opt-in: the speaker waits for a real local model server (SmolLM2-135M answers in 1-9 s
    here) when the stop comes; its reply finishes within the grace or is withdrawn."""
    model = ("--model", f"openai:{local_model_name()}", "--base-url", LOCAL_MODEL)
    with network(tmp_path) as net:
        proc, url = await blocking(start_pim_and_ostra, net, 0.0, extra=model)
        assert await _say_then_stop(proc, url, _speaking, signal.SIGTERM) == 0
        _assert_clean(proc)
        finished = proc.count("replied", message_id="m-1") + proc.count("withdrawn", what="speech")
        assert finished == 1
    _assert_every_message_stored(proc, tmp_path / "data-home")


async def test_a_second_sigterm_stops_at_once_with_143_and_keeps_what_was_stored(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        proc, url = await blocking(start_pim_and_ostra, net, 6.0)
        status = await _say_then_stop(proc, url, _speaking, signal.SIGTERM, signal.SIGTERM)
        assert status == 143
        assert proc.count("stopping_at_once") == 1 and proc.count("withdrawn") == 0  # before the grace
        _assert_clean(proc)
    _assert_every_message_stored(proc, tmp_path / "data-home")
