"""`companion demo`: three companion processes on 127.0.0.1 with the scripted model hold one
conversation to `terminal`; the JSON transcript explains every turn and no message is answered
twice; every process the demo started is gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.cli import REPO, companion_popen, run_companion, run_demo
from support.fake_llm_server import CooperativeModel, running_server

pytestmark = pytest.mark.integration
FIELDS = {"event", "speaker", "recipients", "text", "emotion", "why", "closing"}


def _started_pids(stderr: str) -> list[int]:
    pids = []
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "companion_process_started":
            pids.append(int(record["pid"]))
    return pids


def test_demo_reaches_terminal_with_a_readable_json_transcript(tmp_path: Path) -> None:
    done, events = run_demo(tmp_path)
    logs = "\n".join(f"{p.name}:\n{p.read_text()[-2000:]}" for p in sorted((tmp_path / "run").glob("*.log")))
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}\n{logs}"
    assert all(set(e) >= FIELDS for e in events)

    end = events[-1]
    assert (end["event"], end["reason"], end["closing"]) == ("end", "terminal", "terminal")

    messages = [e for e in events if e["event"] == "message"]
    opening, replies = messages[0], messages[1:]
    assert opening["speaker"] == "user_demo" and len(opening["recipients"]) == 3
    assert len(replies) >= 2
    answered = [r["in_reply_to"] for r in replies]
    assert len(answered) == len(set(answered)), "a message was answered twice"

    decisions = {e["message_id"]: e for e in events if e["event"] == "decision"}
    for reply in replies:
        assert reply["speaker"].startswith("companion_") and reply["text"]
        assert reply["emotion"] in ("happy", "sad", "angry", "neutral")
        assert reply["speaker"] not in reply["recipients"]
        decision = decisions.get(reply["in_reply_to"])
        if decision is not None:  # the bystander saw the states that chose this speaker
            assert decision["speaker"] == reply["speaker"]
            assert reply["why"] == decision["why"] and reply["speaker"] in reply["why"]
    stages = [r["closing"] for r in replies]
    assert stages[-1] == "closing" and "pre-closing" in stages
    order = ["none", "pre-closing", "closing", "terminal"]
    assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages)

    pids = _started_pids(done.stderr)
    assert len(pids) == 3
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert {p.name for p in (tmp_path / "run").glob("*.log")} == {"juniper.log", "ostra.log", "pim.log"}


def test_demo_stops_at_the_turn_cap_and_leaves_no_folder_behind(tmp_path: Path) -> None:
    """Without ``--keep`` the companions' logs and data go to a temporary folder, removed when
    the demo finished as it should."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done, events = run_demo(tmp_path, "--max-turns", "2", env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(scratch.iterdir()) == []
    # a demo that went well warns of nothing of its own, nor of py-libp2p's DHT about companions
    # stopping (a peer ending its request, a lookup still asking a companion that left, a request
    # reset by one)
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    warned = [r for r in records if r["level"] not in ("info", "debug")]
    assert records and [r for r in warned if r["logger"].startswith("companion")] == []
    routine = (
        "Failed to read DHT message",
        "No valid connections available",
        "failed to open a stream to peer",
    )
    messages = [str(r.get("message", "")) for r in warned]
    assert not [m for m in messages if any(text in m for text in routine)], messages
    assert "Failed to parse protobuf message:" not in [m.strip() for m in messages]
    end = events[-1]
    assert (end["event"], end["reason"]) == ("end", "turn_cap")
    assert len([e for e in events if e["event"] == "message" and e["in_reply_to"]]) >= 2


def test_demo_with_a_provider_model_over_http(tmp_path: Path) -> None:
    """`--model openai:NAME --base-url` switches every companion process to the provider path
    (here the fake OpenAI-compatible server on 127.0.0.1)."""
    answers = CooperativeModel()
    with running_server() as server:
        server.push(*([answers] * 200))
        done, events = run_demo(
            tmp_path, "--model", "openai:fake-1", "--base-url", server.openai_base_url, "--max-turns", "4"
        )
        requests = server.model_requests()
    assert done.returncode == 0, done.stderr[-3000:]
    replies = [e for e in events if e["event"] == "message" and e["in_reply_to"]]
    assert len(replies) >= 4 and all(r["text"].startswith("Reply number") for r in replies)
    assert events[-1]["reason"] == "turn_cap"
    tools = [{t["function"]["name"] for t in r.body["tools"]} for r in requests]
    assert {"set_states"} in tools and {"set_params"} in tools and any("speak" in t for t in tools)


def test_a_demo_that_fails_keeps_its_logs_and_names_the_folder(tmp_path: Path) -> None:
    """A model server that answers its check and then fails every request: every companion gives
    its slot up, the leader closes the conversation as unanswered, and the demo says so, exits 1
    and keeps the companions' logs in its temporary folder, named in its log."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    base = ["demo", "--json", "--pace", "0.1", "--log-level", "INFO"]
    with running_server() as server:
        failed = run_companion(
            [*base, "--timeout", "6", "--model", "openai:fake-1", "--base-url", server.openai_base_url],
            cwd=REPO,
            env=env,
            timeout=240,
            warm=True,  # what is read is the end of the conversation, not the start
        )
    assert failed.returncode == 1, failed.stderr[-3000:]
    end = json.loads(failed.stdout.splitlines()[-1])
    assert (end["event"], end["reason"]) == ("end", "unanswered") and "nobody could answer" in end["why"]
    (kept,) = scratch.iterdir()
    assert {p.name for p in kept.glob("*.log")} == {"juniper.log", "ostra.log", "pim.log"}
    kept_lines = [json.loads(line) for line in failed.stderr.splitlines() if line.startswith("{")]
    assert any(r.get("event") == "demo_logs_kept" and r["workdir"] == str(kept) for r in kept_lines)


async def test_the_network_s_teardown_after_the_end_line_prints_no_library_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the end line the demo takes its network down, and py-libp2p logs at ERROR what that
    cuts short (a DHT stream to a companion that is stopping: "Failed to open stream to peer
    ... fail to read from multiselect communicator", seen in one demo of several). Those records
    are left out like any command's teardown; the race is rare, so one is logged here where the
    stopping begins."""
    import logging

    from companion.app import demo
    from support.logs import captured_logs

    stop_children = demo._stop_children

    async def stop_and_race(children: Any, grace: float = 10.0, settle: float = 0.0) -> None:
        logging.getLogger("libp2p.host.basic_host").error(
            "Failed to open stream to peer X: handshake read failed: "
            "fail to read from multiselect communicator"
        )
        await stop_children(children, grace, settle)

    monkeypatch.setattr(demo, "_stop_children", stop_and_race)
    with captured_logs("INFO") as stream:
        options = demo.DemoOptions(cards=demo.default_cards(), pace=0.1, max_replies=2, keep_dir=tmp_path)
        end = await demo.run_demo(options, lambda event: None)
    assert end.reason in ("terminal", "turn_cap"), end
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert any(r.get("event") == "demo_ready" for r in records)  # the capture saw the run
    assert [r for r in records if r.get("event") == "libp2p"] == []
    assert [r for r in records if r.get("level") == "error"] == []


def test_a_demo_whose_reader_goes_away_stops_quietly_with_its_companions(tmp_path: Path) -> None:
    """``companion demo --json | head -2``: the reader closes the pipe after two lines. The demo
    used to log a BrokenPipeError traceback and talk on to the end; it now stops as on Ctrl-C,
    its companions with it, says nothing on stderr above info, and exits 0."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    command = ["demo", "--json", "--pace", "0.1", "--log-level", "INFO"]
    env = {**os.environ, "TMPDIR": str(scratch)}
    demo = companion_popen(  # forked warm: what is read is how it ends
        command, warm=True, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert demo.stdout is not None
        first = [demo.stdout.readline() for _ in range(2)]
        demo.stdout.close()  # as head does once it has its lines
        _, stderr = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert all(json.loads(line)["event"] for line in first)
    assert demo.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert not [r for r in records if r["level"] not in ("info", "debug")], stderr[-3000:]
    assert "Traceback" not in stderr
    pids = _started_pids(stderr)
    assert len(pids) == 3
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(scratch.iterdir()) == []
