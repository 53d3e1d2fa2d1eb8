"""scripts/bench_models.py's own logic with real processes and no model: a server that dies is
said once, with its exit code and the end of its log, and the demo is stopped; the cache figures
are read from llama-cpp-python's log lines. (Its figures come from running it; nothing is timed.)"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_models", SCRIPTS / "bench_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_server_that_dies_is_said_once_and_stops_the_demo(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a native llama-cpp-python build did on a CPU advertising AMX: the model loads, the
    first completion dies with SIGILL. Before, the bench said "cannot reach ... is the server
    running?" on every turn and never that the server had died."""
    log = tmp_path / "server.log"
    code = (
        "import os, signal, sys, time; print('llama_model_loader: loaded'); sys.stdout.flush(); "
        "time.sleep(0.5); print('ggml_compute_forward: tileloadd'); sys.stdout.flush(); "
        "os.kill(os.getpid(), signal.SIGILL)"
    )
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    demo = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    try:
        with bench.Watch(server, log) as watch:
            watch.demo = demo
            demo.wait(timeout=30)
    finally:
        demo.kill()
        server.kill()
    assert demo.returncode == -signal.SIGTERM  # stopped, not left to run its course
    assert watch.message.startswith(f"the model server died: exit code -{int(signal.SIGILL)} (SIGILL)")
    assert "tileloadd" in watch.message and str(log) in watch.message
    assert capsys.readouterr().err.count("the model server died") == 1


LLAMA_CPP_PYTHON_LOG = """\
INFO:     127.0.0.1:50600 - "GET /v1/models HTTP/1.1" 200 OK
Llama._create_completion: cache miss
llama_perf_context_print: prompt eval time =       0.19 ms /   368 tokens (    0.00 ms per token)
llama_perf_context_print:       total time =   16587.58 ms /   489 tokens
INFO:     127.0.0.1:59484 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama._create_completion: cache hit
Llama.generate: 283 prefix-match hit, remaining 100 prompt tokens to eval
llama_perf_context_print: prompt eval time =    9456.39 ms /   100 tokens (   94.56 ms per token)
INFO:     127.0.0.1:56558 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama.generate: 35 prefix-match hit, remaining 1 prompt tokens to eval
llama_perf_context_print: prompt eval time =       0.00 ms /     1 tokens (    0.00 ms per token)
"""
"""llama-cpp-python 0.3.36's own lines (server with --cache true), as the bench reads them."""


def test_the_cache_figures_come_from_the_servers_log(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LLAMA_CPP_PYTHON_LOG)
    assert bench.cache_use(log) == [(0, 368), (283, 100), (35, 1)]
    assert bench.cache_use(tmp_path / "missing.log") == []


LLAMA_CPP_SERVER_LOG = """\
0.03.563.882 I srv          init: listening on http://127.0.0.1:44019
0.05.865.534 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.08.852.081 I slot print_timing: id  0 | task 0 | prompt eval time =    1757.75 ms /    47 tokens
0.08.852.087 I slot print_timing: id  0 | task 0 |        eval time =    1228.74 ms /    10 tokens
0.08.852.087 I slot print_timing: id  0 | task 0 |       total time =    2986.50 ms /    57 tokens
0.08.856.861 I slot      release: id  0 | task 0 | stop processing: n_tokens = 56, truncated = 0
0.08.877.268 I slot get_availabl: id  0 | task -1 | by LCP similarity, f_keep = 0.714
0.08.877.347 I slot launch_slot_: id  0 | task 11 | processing task, is_child = 0
0.16.084.137 I slot print_timing: id  0 | task 11 | prompt eval time =     493.08 ms /     9 tokens
0.16.084.143 I slot print_timing: id  0 | task 11 |        eval time =    6713.64 ms /    10 tokens
0.16.084.166 I slot      release: id  0 | task 11 | stop processing: n_tokens = 58, truncated = 0
"""
"""llama.cpp's server (through xllamacpp 2026.10.11549) on two requests that share 40 tokens:
the second's 49-token prompt (58 - 10 + 1) evaluated 9 of them (its slot kept 0.714 x 56 = 40)."""


def test_llama_cpp_servers_cache_figures_come_from_its_task_lines(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LLAMA_CPP_SERVER_LOG)
    assert bench.cache_use(log) == [(0, 47), (40, 9)]


def test_requests_without_usage_are_not_averaged_as_zero_tokens(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama-cpp-python streams no usage: its speak requests are logged with ``null`` tokens."""

    def request(purpose: str, ms: int, tokens: tuple[int, int] | None) -> dict[str, Any]:
        given, taken = tokens if tokens is not None else (None, None)
        return {
            "event": "model_request",
            "purpose": purpose,
            "ms": ms,
            "input_tokens": given,
            "output_tokens": taken,
        }

    logs = [
        request("states", 900, (300, 6)),
        request("params", 800, (200, 9)),
        request("params", 700, None),
        request("speak", 2000, None),
    ]
    bench.report([], logs, 10.0, 6)
    said = capsys.readouterr().out
    assert "    states: 1 answered, 0.9-0.9 s (median 0.9), 300 tokens in, 6 out\n" in said
    assert "params: 2 answered, 0.7-0.8 s (median 0.8), 200 tokens in, 9 out (averaged over the 1" in said
    assert "    speak: 1 answered, 2.0-2.0 s (median 2.0), tokens not reported\n" in said
