"""scripts/bench_latency.py's token figures, without a model: llama-cpp-python's perf lines read
from a real process's stderr while it writes far more than a pipe holds, kept bounded, and
paired with the turn's requests; the fake sources' usage, with requests that reported none said
as such. (Its figures come from running it; nothing here is timed.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

SERVER_LOG = """\
INFO:     127.0.0.1:47266 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama.generate: 6 prefix-match hit, remaining 26 prompt tokens to eval
llama_perf_context_print:        load time =       0.26 ms
llama_perf_context_print: prompt eval time =      68.55 ms /    26 tokens (    2.64 ms per token,   379.30 tokens per second)
llama_perf_context_print:        eval time =     170.38 ms /    24 runs   (    7.10 ms per token,   140.86 tokens per second)
llama_perf_context_print:       total time =     267.20 ms /    50 tokens
llama_perf_context_print:    graphs reused =         23
Llama._create_completion: cache save
state_write_data: writing state
llama_perf_context_print:        load time =       0.26 ms
llama_perf_context_print: prompt eval time =       0.00 ms /     1 tokens (    0.00 ms per token,      inf tokens per second)
llama_perf_context_print:        eval time =     189.64 ms /    17 runs   (   11.16 ms per token,    89.64 tokens per second)
llama_perf_context_print:       total time =     197.39 ms /    18 tokens
"""  # noqa: E501
"""llama-cpp-python 0.3.36 serving SmolLM2 (measured): a streamed completion, then a whole one
whose prompt came from the cache but for its last token."""


def load(name: str) -> ModuleType:
    """A script as a module (registered, as its dataclasses need), with scripts/ importable."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


@pytest.fixture(scope="module")
def perf() -> ModuleType:
    return sys.modules.get("llama_perf") or load("llama_perf")


@pytest.fixture(scope="module")
def bench(perf: ModuleType) -> ModuleType:
    return load("bench_latency")


def test_a_completion_is_told_by_its_perf_block_and_nothing_else(perf: ModuleType) -> None:
    told = list(perf.completions_of(iter(SERVER_LOG.splitlines())))
    assert told == [perf.Completion(26, 24, 68.55, 170.38), perf.Completion(1, 17, 0.0, 189.64)]
    cut = SERVER_LOG.splitlines()[:5]  # a block whose total line never came (the server stopped)
    assert list(perf.completions_of(iter(cut))) == []


def test_the_servers_stderr_is_drained_and_only_its_completions_kept(
    perf: ModuleType, tmp_path: Path
) -> None:
    """A process that writes 7 MB of other lines (a pipe holds 64 KiB), some longer than a line
    is read at once, around its perf blocks: it is never blocked, so it ends, and the reader
    keeps the last ``keep`` completions, told in order."""
    log = tmp_path / "server.log"
    log.write_text(SERVER_LOG * 3)
    code = (
        "import sys\n"
        "noise = ('state_write_data: writing state ' * 4 + '\\n') * 2000\n"
        "long = 'Llama.generate: ' + 'x' * 100_000 + '\\n'\n"
        f"for block in open({str(log)!r}).read().split('llama_perf_context_print:    graphs'):\n"
        "    sys.stderr.write(noise + long + block)\n"
        "    sys.stderr.write('llama_perf_context_print:    graphs')\n"
        "sys.stderr.write(noise * 20)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        reader = perf.ServerPerf(proc.stderr, keep=4)
        assert proc.wait(timeout=60) == 0
        assert reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
    first, second = perf.Completion(26, 24, 68.55, 170.38), perf.Completion(1, 17, 0.0, 189.64)
    assert reader.count() == 6
    assert reader.since(0) == [first, second, first, second]  # the two oldest are gone
    assert reader.since(5) == [second]
    assert reader.since(6) == []


def requests(*purposes: str, tokens: tuple[int | None, int | None] = (None, None)) -> list[dict[str, Any]]:
    return [
        {"event": "model_request", "purpose": p, "input_tokens": tokens[0], "output_tokens": tokens[1]}
        for p in purposes
    ]


def test_smollm2_turns_say_the_servers_own_count_request_by_request(
    bench: ModuleType, perf: ModuleType
) -> None:
    turn = bench.Turn(1.0, 2.0, requests("params", "speak"))
    turn.completions = [perf.Completion(120, 9), perf.Completion(30, 41)]
    assert bench.tokens_of(turn) == (
        "prompt evaluated 150, generated 50 (from the server's own log: llama-cpp-python streams no "
        "usage); by request (evaluated+generated): params 120+9, speak 30+41"
    )
    # a whole answer reports usage: the completion paired with it must have generated as many
    whole = requests("params", tokens=(130, 30)) + requests("speak")
    turn.requests = whole
    assert bench.tokens_of(turn).endswith("; 1 of 1 whole answers' usage disagrees")
    turn.requests = whole[:1]
    assert bench.tokens_of(turn).endswith(
        "; 2 completions told for 1 requests answered (none is told for a stream the companion stopped early)"
    )


def test_the_fake_sources_say_their_usage_and_which_requests_reported_none(bench: ModuleType) -> None:
    turn = bench.Turn(1.0, 2.0, requests("states", "speak", tokens=(11, 4)))
    assert bench.tokens_of(turn) == "tokens prompt 22 completion 8"
    turn.requests = requests("states", tokens=(11, 4)) + requests("speak")
    assert bench.tokens_of(turn) == "tokens prompt 11 completion 4 (1 of 2 requests reported no usage)"


def test_the_servers_split_gives_the_least_ratio_streaming_could_reach(
    bench: ModuleType, perf: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line's request's prompt and writing; the least ratio only where one request said it."""
    one = bench.Turn(0.5, 1.0, requests("speak"))
    one.completions = [perf.Completion(100, 30, 300.0, 200.0)]  # 300 / 500
    two = bench.Turn(0.9, 1.0, requests("speak", "speak"))
    # a refused try, then the line's request: no bound (something of the first may be heard)
    two.completions = [perf.Completion(100, 30, 300.0, 200.0), perf.Completion(40, 30, 100.0, 400.0)]
    untold = bench.Turn(0.1, 1.0, requests("speak", "speak"))  # a stream stopped early: untold
    untold.completions = [perf.Completion(40, 30, 100.0, 400.0)]
    bench.print_server_split([one, two, untold, bench.Turn(1.0, 1.0)])  # nor a turn without the log
    out = capsys.readouterr().out
    assert "(2 turns of the model's own line)" in out
    assert "prompt in p50 200 ms and wrote in p50 300 ms" in out
    assert "in its 1 turns of one request" in out and "least ratio p50 0.60, measured p50 0.50" in out


def test_the_parameters_request_is_split_into_the_servers_work_and_the_rest(
    bench: ModuleType, perf: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reads-param``: what the companion waited for its parameters, and how much of it the
    server spent on the model."""
    turns = []
    for waited in (700, 900):
        turn = bench.Turn(1.2, 2.0, [{"purpose": "params", "ms": waited}, {"purpose": "speak", "ms": 800}])
        turn.completions = [perf.Completion(54, 10, 300.0, 150.0), perf.Completion(32, 40, 200.0, 600.0)]
        turns.append(turn)
    bench.print_server_split(turns)
    out = capsys.readouterr().out
    assert "the parameters request (2 turns): the companion waited p50 800 ms" in out
    assert "evaluated 54 prompt tokens in p50 300 ms and wrote 10 in p50 150 ms" in out
    assert "the server around the model) p50 350 ms" in out
    speech_only = bench.Turn(1.0, 1.0, requests("speak"))
    speech_only.completions = [perf.Completion(32, 40, 200.0, 600.0)]
    bench.print_server_split([speech_only])
    out = capsys.readouterr().out
    assert "the line's request" in out and "parameters request" not in out  # a card that reads none


def test_the_rounds_before_and_after_the_history_window_fills_are_apart(
    bench: ModuleType, perf: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long conversation's later turns, with the prompt tokens of each turn's first request
    where the server told every request of it; nothing when no turn is past the window."""
    turns = []
    for number, (first, evaluated) in enumerate([(0.4, 90), (0.5, 100), (1.2, 380), (0.6, 110)], start=1):
        turn = bench.Turn(first, 1.5, requests("speak"))
        turn.round = number if number < 3 else bench.WINDOW_FULL + number
        turn.completions = [perf.Completion(evaluated, 20)]
        turns.append(turn)
    turns[-1].requests = requests("speak", "speak")  # one of two told: left out of the tokens
    bench.print_by_round(turns[:2])
    assert capsys.readouterr().out == ""
    bench.print_by_round(turns)
    out = capsys.readouterr().out
    assert (
        f"rounds 1-{bench.WINDOW_FULL - 1}: first words p50 0.45 s, first request's prompt evaluated p50 95"
        in out
    )
    assert (
        f"rounds {bench.WINDOW_FULL}+: first words p50 0.90 s, first request's prompt evaluated p50 380"
        in out
    )


STUB_XLLAMACPP = """
import json, os


class _Group:
    pass


class CommonParams:
    def __init__(self):
        self.model, self.cpuparams, self.cpuparams_batch = _Group(), _Group(), _Group()
        self.cpuparams.n_threads = self.cpuparams_batch.n_threads = -1


class Server:
    def __init__(self, params):
        seen = {k: v for k, v in vars(params).items() if not isinstance(v, _Group)}
        seen.update(path=params.model.path, threads=params.cpuparams.n_threads)
        seen.update(batch_threads=params.cpuparams_batch.n_threads, model_alias=sorted(params.model_alias))
        with open(os.environ["STUB_OUT"], "w") as out:
            json.dump(seen, out)
"""
"""A stand-in for xllamacpp that writes down the parameters the server was started with."""


@pytest.mark.parametrize(
    ("slots", "threads", "unified", "ctx", "told"), [(1, 0, False, 4096, -1), (4, 2, True, 16384, 2)]
)
def test_llama_cpp_s_server_is_started_with_the_slots_and_threads_asked(
    bench: ModuleType, tmp_path: Path, slots: int, threads: int, unified: bool, ctx: int, told: int
) -> None:
    """The xllamacpp launcher both real-model benches share: one slot with its own KV cache, or
    several over one unified cache as ``llama-server`` runs without ``-np``; the threads given
    (0: the server's own choice); and it stops at SIGTERM with exit 0."""
    (tmp_path / "xllamacpp.py").write_text(STUB_XLLAMACPP)
    out = tmp_path / "params.json"
    argv = bench.llama_cpp_argv(Path(sys.executable), tmp_path / "m.gguf", 8123, slots, threads)
    env = {"PYTHONPATH": str(tmp_path), "STUB_OUT": str(out), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(argv, env=env)
    try:
        for _ in range(200):  # bounded: 10 s at most
            if out.exists() and out.stat().st_size:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        seen = json.loads(out.read_text())
    finally:
        proc.terminate()
        code = proc.wait(10)
    assert code == 0
    assert seen["path"] == str(tmp_path / "m.gguf") and seen["port"] == 8123
    assert seen["model_alias"] == [bench.ALIAS]
    assert (seen["n_parallel"], seen["kv_unified"], seen["n_ctx"]) == (slots, unified, ctx)
    assert seen["threads"] == seen["batch_threads"] == told
