"""The process's metrics (companion/app/metrics.py) and the ``--metrics`` flag.

Each :class:`ProcessMetrics` has a registry of its own (two in one interpreter never count
into each other, as two processes' would not); the engine's decisions are counted under their
Prometheus names; a relay serves ``/metrics`` and ``/readyz`` on ``--metrics``, and a bridge
alone is alive but not ready; an address already in use, or one that is not an address, is one
line and exit 2, as ``--ws`` is.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from companion.app.group import CountingModel
from companion.app.metrics import ProcessMetrics
from companion.app.metrics_http import METRICS_LINE, REQUEST_TIMEOUT
from companion.card.model import load_card
from companion.engine.driver import EngineEvent
from companion.models.base import StatesRequest
from companion.models.factory import check_model, make_model
from companion.models.scripted import ScriptedModel
from companion.protocol import Message
from support.cli import run_companion
from support.local_model import LOCAL_MODEL, local_model_name, needs_local_model

ROOT = Path(__file__).resolve().parent.parent


def sample(metrics: ProcessMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_process_metrics_counts_into_its_own_registry() -> None:
    first, second = ProcessMetrics(), ProcessMetrics()
    first.observer("companion_pim")(EngineEvent("replied", "companion_pim", {"message_id": "m1"}))
    assert sample(first, "companion_replies_total", companion="companion_pim") == 1
    assert sample(second, "companion_replies_total", companion="companion_pim") is None


def test_the_engines_decisions_are_counted_by_their_labels() -> None:
    metrics = ProcessMetrics()
    observe = metrics.observer("companion_pim")
    events = [
        ("states_published", {"source": "model"}),
        ("states_published", {"source": "model"}),
        ("states_published", {"source": "unanswered"}),
        ("replied", {}),
        ("speaker_failed", {"reason": "timeout"}),
        ("turn_unanswered", {}),
        ("store_failed", {"call": "record"}),
        ("leader_chosen", {}),  # not a metric
    ]
    for kind, fields in events:
        observe(EngineEvent(kind, "companion_pim", fields))
    pim = {"companion": "companion_pim"}
    assert sample(metrics, "companion_turns_led_total", **pim, source="model") == 2
    assert sample(metrics, "companion_turns_led_total", **pim, source="unanswered") == 1
    assert sample(metrics, "companion_replies_total", **pim) == 1
    assert sample(metrics, "companion_speaker_failures_total", **pim, reason="timeout") == 1
    assert sample(metrics, "companion_turns_unanswered_total", **pim) == 1
    assert sample(metrics, "companion_store_failures_total", **pim, call="record") == 1


async def test_a_metered_model_times_each_call_by_kind_and_outcome() -> None:
    """The offline model a user runs by default, called as the leader's engine calls it."""
    loaded = load_card(ROOT / "cards" / "pim.yaml")
    metrics = ProcessMetrics()
    model = metrics.metered("companion_pim", ScriptedModel(seed=3))
    message = Message.create("user_mika", ["companion_pim"], "How is the sea?")
    request = StatesRequest(message=message, companions=[loaded.card.metadata], history=[message])
    decisions = await model.decide_states(request)
    assert [d.companion_id for d in decisions] == ["companion_pim"]
    labels = {"companion": "companion_pim", "call": "states"}
    assert sample(metrics, "companion_model_request_duration_seconds_count", **labels, outcome="ok") == 1
    assert model.name == "scripted(seed=3)"  # the engine and the logs see the model it wraps


class Streaming(ScriptedModel):
    """The offline model, saying what a provider model says of itself."""

    streams_speech = True
    speculates = True


async def test_a_wrapped_model_keeps_what_the_engine_reads_from_it() -> None:
    """Counting (the in-memory group) and timing (metrics) wrap a model call by call; neither
    may turn streaming or prepared replies off, nor invent a flag the model does not have."""
    metrics = ProcessMetrics()
    for wrap in (lambda m: metrics.metered("companion_pim", m), CountingModel):
        wrapped: Any = wrap(Streaming(seed=3))
        assert (wrapped.streams_speech, wrapped.speculates) == (True, True)
        assert getattr(wrapped, "parallel_params", False) is False
        assert wrapped.name == "scripted(seed=3)"
    counting = CountingModel(ScriptedModel(seed=3))
    loaded = load_card(ROOT / "cards" / "pim.yaml")
    message = Message.create("user_mika", ["companion_pim"], "How is the sea?")
    request = StatesRequest(message=message, companions=[loaded.card.metadata], history=[message])
    await counting.decide_states(request)
    assert (counting.counts, counting.kinds) == ({message.params.id: 1}, {"decide_states": 1})


def test_readiness_names_what_is_missing() -> None:
    metrics = ProcessMetrics()
    metrics.expect(["companion_pim"])
    assert metrics.readiness() == ["no engine yet for companion_pim", "no node running yet"]
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain") and b"companion_build_info" in body
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def first_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 30) -> str:
    """The first line of ``proc``'s standard output that starts with ``prefix`` (the lines
    before it are read and left; a process that ends or stays silent fails the test)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line.rstrip("\n")
    raise AssertionError(f"no line starting with {prefix!r}")


def test_a_relay_serves_metrics_and_is_ready_once_it_listens(tmp_path: Path) -> None:
    """``companion relay --metrics``: ready once it listens; its metrics; a silent client is
    dropped after :data:`REQUEST_TIMEOUT`, garbage gets a 400, neither holds up the others."""
    argv = [sys.executable, "-m", "companion.cli.relay", "--listen", "/ip4/127.0.0.1/tcp/0"]
    argv += ["--data-dir", str(tmp_path), "--metrics", "127.0.0.1:0", "--log-format", "json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = first_line(proc, METRICS_LINE).split()[1]
        base = url.removesuffix("/metrics")
        for _attempt in range(100):  # ready once the relay's node listens (bounded: 10 s)
            if _get(f"{base}/readyz")[0] == 200:
                break
            time.sleep(0.1)
        assert _get(f"{base}/readyz") == (200, "ready\n")
        status, text = _get(url)
        assert status == 200
        assert 'companion_peers_connected{node="relay"} 0.0' in text
        assert "process_resident_memory_bytes" in text
        assert _get(f"{base}/nothing")[0] == 404
        # a client that connects and says nothing, and one that sends garbage: each is answered
        # or dropped within REQUEST_TIMEOUT, and others are served meanwhile
        host, port = url.split("/")[2].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as silent:
            with socket.create_connection((host, int(port)), timeout=5) as garbage:
                garbage.sendall(b"\x00\xff not http at all\r\n\r\n")
                assert garbage.recv(4096).startswith(b"HTTP/1.1 400 ")
            assert _get(f"{base}/healthz") == (200, "ok\n")
            silent.settimeout(REQUEST_TIMEOUT + 10)  # past it, recv raises: the test fails
            assert silent.recv(4096) == b""  # closed by the server, unanswered
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert '"level": "error"' not in err


@pytest.mark.parametrize("command", ["run", "relay"])
def test_a_metrics_address_in_use_exits_2_naming_it(tmp_path: Path, command: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = [command, "--metrics", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)]
        args += ["--listen", "/ip4/127.0.0.1/tcp/0"]
        if command == "run":
            args += ["pim", "--no-mdns"]
        done = run_companion(args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith(f"companion {command}:")]
    assert said == [
        f"companion {command}: --metrics 127.0.0.1:{port}: cannot listen there: Address already in use"
    ]
    assert "Traceback" not in done.stderr, done.stderr


def test_a_metrics_flag_that_is_no_address_exits_2(tmp_path: Path) -> None:
    done = run_companion(["run", "pim", "--metrics", "here:please"], cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "companion run: --metrics 'here:please': the port must be a number from 0 to 65535"
    )


@needs_local_model
async def test_a_real_model_servers_tokens_and_a_passed_deadline_are_counted() -> None:
    """The leader's call to a real server (``COMPANION_LOCAL_MODEL``, as test_models_local):
    its tokens as the server reported them, its duration under ``ok``; then the same call
    under a deadline that passes mid-request, under ``cancelled``."""
    name = local_model_name()
    served = make_model(f"openai:{name}", base_url=LOCAL_MODEL)
    await check_model(served)
    metrics = ProcessMetrics()
    model = metrics.metered("companion_pim", served)
    loaded = load_card(ROOT / "cards" / "pim.yaml")
    message = Message.create("user_mika", ["companion_pim"], "How is the sea?")
    request = StatesRequest(message=message, companions=[loaded.card.metadata], history=[message])
    with trio.fail_after(300):
        await model.decide_states(request)
    labels = {"companion": "companion_pim", "call": "states"}
    assert sample(metrics, "companion_model_request_duration_seconds_count", **labels, outcome="ok") == 1
    tokens = {"model": f"openai:{name}"}
    assert (sample(metrics, "companion_model_tokens_total", **tokens, direction="input") or 0) > 0
    assert (sample(metrics, "companion_model_tokens_total", **tokens, direction="output") or 0) > 0
    with trio.move_on_after(0.05):
        await model.decide_states(request)
    count = sample(metrics, "companion_model_request_duration_seconds_count", **labels, outcome="cancelled")
    assert count == 1, metrics.exposition()[0].decode()


def test_a_bridge_alone_is_alive_but_not_ready_and_says_why(tmp_path: Path) -> None:
    """``companion bridge`` with no peer: ``/healthz`` 200, ``/readyz`` 503 naming its node,
    ``/metrics`` on its port (no token on loopback) with its client count."""
    argv = [sys.executable, "-m", "companion", "bridge", "--ws", "127.0.0.1:0", "--no-mdns"]
    argv += ["--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path), "--no-webrtc"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = first_line(proc, "  ws://").strip().replace("ws://", "http://").rstrip("/")
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz") == (503, "not ready: node bridge has no connected peer\n")
        status, text = _get(f"{base}/metrics")
        assert status == 200 and "companion_bridge_clients 0.0" in text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
