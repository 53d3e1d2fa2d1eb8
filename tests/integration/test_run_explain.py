"""``companion explain`` and ``companion status`` on the data directory of a real ``companion run``.

Pim and Ostra (the shipped cards, offline models) in one process with ``--ws``; a person writes
to both through the bridge, the companions talk until the conversation is over. Then the
commands, as a user types them beside the running process and after it stopped: ``explain``
says once each decision both companions took alike, names the leader, the speaker and the
reply; ``status`` lists both as running with their pid and the companion each sees, and the
last turns with who replied.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trio_websocket import open_websocket_url

from support.cli import run_companion
from support.live import OSTRA, PIM, start_pim_and_ostra
from support.live_bridge import blocking, message_frame
from support.network import network

pytestmark = pytest.mark.integration


def _lines_of(kind: str, output: str) -> list[str]:
    return [line for line in output.splitlines() if f"  {kind} " in line]


async def test_explain_and_status_read_what_the_running_companions_decided(tmp_path: Path) -> None:
    data = tmp_path / "data-home"
    # cold: `companion status` tells a running companion by its command line (a warm start's
    # is the warm-start server's, support/warm.py)
    with network(tmp_path, warm=False) as net:
        proc, url = await blocking(start_pim_and_ostra, net, 0.2)
        async with open_websocket_url(url) as ws:
            await ws.send_message(
                message_frame("user_mika", [PIM, OSTRA], "What did you two do today?", "m-1")
            )
            replied = await blocking(proc.event, "replied", 30, message_id="m-1")
            await blocking(proc.event, "conversation_over", 60)

        explained = run_companion(["explain", "m-1", "--data-dir", str(data)], cwd=tmp_path, warm=True)
        assert explained.returncode == 0, explained.stderr
        out = explained.stdout
        assert out.splitlines()[0].startswith(f"message m-1 from user_mika to {PIM},{OSTRA}: ")
        (leader,) = _lines_of("leader_chosen", out)  # both took it, for the same reason: one line
        (speaker,) = _lines_of("speaker_chosen", out)
        assert PIM in leader and OSTRA in leader and PIM in speaker and OSTRA in speaker
        (reply,) = _lines_of("replied", out)
        assert f"reply_id={replied['reply_id']}" in reply and str(replied["companion"]) in reply
        assert _lines_of("states_published", out) != []

        # the reply's own id: the turn that produced it is explained too
        by_reply = run_companion(
            ["explain", str(replied["reply_id"]), "--data-dir", str(data)], cwd=tmp_path, warm=True
        )
        assert by_reply.returncode == 0 and "(the turn on m-1)" in by_reply.stdout

        as_json = run_companion(
            ["explain", "m-1", "--json", "--data-dir", str(data)], cwd=tmp_path, warm=True
        )
        rows = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert rows[0]["message"]["id"] == "m-1"
        assert {"leader_chosen", "speaker_chosen", "replied"} <= {r.get("kind") for r in rows[1:]}

        unknown = run_companion(
            ["explain", "no-such-message", "--data-dir", str(data)], cwd=tmp_path, warm=True
        )
        assert unknown.returncode == 1 and "no local companion kept a decision" in unknown.stdout

        status = run_companion(["status", "--turns", "20", "--data-dir", str(data)], cwd=tmp_path, warm=True)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert f"  {PIM}: running (pid {proc.pid}, since " in status.stdout
        assert f"  {OSTRA}: running (pid {proc.pid}, since " in status.stdout
        assert f"    sees {OSTRA}" in lines and f"    sees {PIM}" in lines
        (first,) = [line for line in lines if "  m-1  " in line]
        assert "from user_mika" in first and f"replied by {replied['companion']}" in first

        assert proc.stop() == 0
    stopped = run_companion(["status", "--turns", "20", "--data-dir", str(data)], cwd=tmp_path, warm=True)
    assert f"  {PIM}: not running (last: pid {proc.pid}" in stopped.stdout
    assert "  m-1  " in stopped.stdout  # the turns are in the stores, running or not
