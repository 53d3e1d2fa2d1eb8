"""What the demo's transcript shows while a real model works and when it fails, as a user
watching ``companion demo --model openai:...`` sees it: three companion processes on 127.0.0.1
behind an OpenAI-compatible server (the fake one, real HTTP) that holds the first reply back and
answers Ostra's replies with HTTP 500. The transcript says "Juniper is thinking… (3 s)" while
the slow reply is prepared, and Ostra's failure as one line with its reason, and goes on.

The first reply is held until the thinking line is on the demo's standard output (at most
:data:`HELD_AT_MOST` seconds), not for a fixed time: the line comes 3 s into the wait on a quiet
machine, later on a busy one, and a fixed pause either wasted seconds or ended before the line."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from support.cli import started_companion
from support.fake_llm_server import CooperativeModel, Reply, http_error, running_server

pytestmark = pytest.mark.integration

HELD_AT_MOST = 60.0
"""Seconds the first reply waits for the thinking line at most (then it is answered anyway, and
the test fails on the transcript without that line)."""


class SlowThenFailing:
    """The cooperative model, except that its first spoken reply is held until :attr:`release`
    is set (or :data:`HELD_AT_MOST` passed) and every reply Ostra asks for fails with HTTP 500
    (the server's own words in the body)."""

    def __init__(self) -> None:
        self.inner = CooperativeModel()
        self.spoken = 0
        self.release = threading.Event()

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools") or []}
        prompt = "\n".join(str(m.get("content")) for m in body.get("messages") or [])
        if CooperativeModel._schema(body, tools, prompt) is not None:
            return self.inner(body)  # states and parameters: answered
        if "You are Ostra (id " in prompt:  # a reply, in whatever form the client tries
            return http_error(500, "CUDA out of memory while loading the model")
        self.spoken += 1
        if self.spoken == 1:
            self.release.wait(HELD_AT_MOST)
        return self.inner(body)


def test_the_transcript_shows_a_slow_model_thinking_and_a_failure_with_its_reason(tmp_path: Path) -> None:
    model = SlowThenFailing()
    with running_server() as server:
        server.push(*([model] * 400))
        args = ["demo", "--model", "openai:fake-1", "--base-url", server.openai_base_url]
        args += ["--max-turns", "4", "--timeout", "150", "--pace", "0", "--keep", str(tmp_path / "run")]
        with started_companion(args, cwd=tmp_path, logs=tmp_path / "out", warm=True) as demo:
            try:
                demo.wait_for_output("is thinking…", HELD_AT_MOST)
            finally:
                model.release.set()  # the slow reply goes out now, seen or not
            returncode = demo.process.wait(timeout=240)
            out, err = demo.stdout(), demo.stderr()
    print(out)  # shown with -s: what the user saw
    assert returncode == 0, out[-3000:] + err[-3000:]
    thinking = [line.strip() for line in out.splitlines() if "is thinking…" in line]
    assert thinking and thinking[0].endswith("is thinking… (3 s)"), out
    failed = [line.strip() for line in out.splitlines() if line.strip().startswith("Ostra could not answer")]
    assert failed, out
    assert failed[0].startswith("Ostra could not answer: the model failed (")
    assert "500" in failed[0] and failed[0].endswith("; the turn passes to the next companion")
    assert "— stopped (turn_cap)" in out or "— the conversation closed" in out
