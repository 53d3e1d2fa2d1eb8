"""A real Prometheus server scrapes a live ``companion run``, and its HTTP API shows what a
conversation moved.

Debian's ``prometheus`` package (``scripts/system-deps.sh`` installs it; the test skips, saying
so, where it is not installed). One ``companion run`` process with two companions serves
``--metrics 127.0.0.1:0`` and a bridge (``--ws``); Prometheus scrapes the metrics port every
second; a Firehose client sends one message to both companions and waits for a reply; then
Prometheus' query API must report the reply, the speaker's model calls and the messages the
nodes received. The same endpoints answer on the bridge's port, ``/metrics`` there behind the
bridge's token; docs/operations.md names exactly the metrics the process exposes, and its
scrape configuration and alert rules pass ``promtool``.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.app.lines import BRIDGE_LINE
from companion.app.metrics_http import METRICS_LINE
from support.cards import speaking_card, write_card
from support.live import start_run, stdout_line
from support.live_bridge import blocking, message_frame, next_frame
from support.network import Network, Proc, network

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="Prometheus is not installed (scripts/system-deps.sh installs Debian's prometheus package)",
    ),
]

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
PIM = "companion_pim"
OSTRA = "companion_ostra"
TOKEN = "metrics-test-token"


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def free_port() -> int:
    """A port free now on 127.0.0.1 (Prometheus cannot be told to pick one and say which)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_prometheus(net: Network, target: str) -> str:
    """Prometheus scraping ``target`` (HOST:PORT) every second; returns its base URL once ready."""
    folder = net.tmp / "prometheus"
    folder.mkdir()
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: companion\n"
        f"    static_configs:\n      - targets: ['{target}']\n",
        encoding="utf-8",
    )
    port = free_port()
    argv = [
        str(shutil.which("prometheus")),
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    net.procs.append(Proc("prometheus", argv))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if http_get(f"{base}/-/ready", timeout=2)[0] == 200:
                return base
        except OSError:
            pass  # not listening yet
        time.sleep(0.2)
    raise AssertionError(f"Prometheus was not ready within 30 s\n{net.procs[-1].tail()}")


def query(base: str, promql: str) -> float | None:
    """The value of an instant query (one series, or summed by the query), ``None`` if empty."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    status, body = http_get(url)
    assert status == 200, body
    result: list[Any] = json.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def query_until(base: str, promql: str, at_least: float, timeout: float) -> float:
    """Poll the query until its value reaches ``at_least`` (scrapes come every second)."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = query(base, promql)
        if value is not None and value >= at_least:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{promql} = {value} after {timeout} s, wanted >= {at_least}")


def is_reply(frame: Any) -> bool:
    """A companion's ``message.send`` answering a message (``in_reply_to`` in its metadata)."""
    params = frame.get("params") if isinstance(frame, dict) else None
    return isinstance(params, dict) and bool((params.get("metadata") or {}).get("in_reply_to"))


async def test_prometheus_scrapes_a_live_node_and_sees_a_conversation(tmp_path: Path) -> None:
    cards = [
        write_card(tmp_path, "pim", speaking_card("pim", "Pim", "speak")),
        write_card(tmp_path, "ostra", speaking_card("ostra", "Ostra", "speak")),
    ]
    extra = ("--metrics", "127.0.0.1:0", "--ws", "127.0.0.1:0", "--no-webrtc", "--token", TOKEN)
    with network(tmp_path) as net:
        run = await blocking(start_run, net, "run", cards, extra=extra)
        metrics_url = (await blocking(stdout_line, run, lambda s: s.startswith(METRICS_LINE), 30)).split()[1]
        ws_url = (await blocking(stdout_line, run, lambda s: s.startswith(BRIDGE_LINE), 30)).split()[1]
        base = metrics_url.removesuffix("/metrics")
        # the companions have their engines and see each other: ready
        status, text = await blocking(http_get, f"{base}/readyz")
        assert (status, text.strip()) == (200, "ready")
        assert await blocking(http_get, f"{base}/healthz") == (200, "ok\n")

        prometheus = await blocking(start_prometheus, net, urllib.parse.urlsplit(metrics_url).netloc)
        await blocking(query_until, prometheus, 'up{job="companion"}', 1, 30)
        assert await blocking(query, prometheus, "sum(companion_replies_total)") == 0

        async with open_websocket_url(ws_url) as ws:  # the URL carries the token
            frame = message_frame("user_mika", [PIM, OSTRA], "How was the sea today?", "metrics-1")
            for _attempt in range(10):  # the clients' node joins the mesh on a heartbeat
                await ws.send_message(frame)
                with trio.move_on_after(3):
                    await next_frame(ws, is_reply, 60)
                    break
            else:
                raise AssertionError("no reply came back to the client")

        assert await blocking(query_until, prometheus, "sum(companion_replies_total)", 1, 30) >= 1
        speak_calls = 'sum(companion_model_request_duration_seconds_count{call="speak",outcome="ok"})'
        assert await blocking(query_until, prometheus, speak_calls, 1, 30) >= 1
        assert await blocking(query_until, prometheus, "sum(companion_turns_led_total)", 1, 30) >= 1
        received = f'companion_messages_received_total{{node="{PIM}",topic="messages"}}'
        assert await blocking(query_until, prometheus, received, 2, 30) >= 2  # the message, a reply
        assert await blocking(query, prometheus, f'companion_companions_present{{node="{PIM}"}}') == 2

        # the bridge's port serves the same registry; /metrics there wants the bridge's token
        bridge = ws_url.replace("ws://", "http://").split("?")[0].rstrip("/")
        assert (await blocking(http_get, f"{bridge}/metrics"))[0] == 401
        status, exposition = await blocking(
            http_get, f"{bridge}/metrics", {"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200 and "companion_replies_total" in exposition
        assert await blocking(http_get, f"{bridge}/readyz") == (200, "ready\n")

    # docs/operations.md names every metric the process exposes, and no other
    exposed = set(re.findall(r"^# TYPE (companion_\w+) ", exposition, re.M))
    documented = set(re.findall(r"`(companion_\w+)`", OPERATIONS.read_text(encoding="utf-8")))
    assert exposed == documented, (sorted(exposed - documented), sorted(documented - exposed))


def test_the_scrape_config_and_alert_rules_of_the_docs_are_valid(tmp_path: Path) -> None:
    """What docs/operations.md offers to copy passes Prometheus' own checker: every rule's
    expression parses, the scrape configuration is valid (its token file is the reader's)."""
    config, rules = re.findall(r"```yaml\n(.*?)```", OPERATIONS.read_text(encoding="utf-8"), re.S)
    (tmp_path / "prometheus.yml").write_text(config, encoding="utf-8")
    (tmp_path / "rules.yml").write_text(rules, encoding="utf-8")
    promtool = shutil.which("promtool") or "promtool"  # installed with prometheus
    for argv in (
        [promtool, "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml")],
        [promtool, "check", "rules", str(tmp_path / "rules.yml")],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout
