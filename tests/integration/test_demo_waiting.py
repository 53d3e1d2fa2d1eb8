"""What the demo's transcript shows while a real model works and when it fails, as a user
watching ``companion demo --model openai:...`` sees it: three companion processes on 127.0.0.1
behind an OpenAI-compatible server (the fake one, real HTTP) that takes 5 s over the first reply
and answers Ostra's replies with HTTP 500. The transcript says "Juniper is thinking… (3 s)" while
the slow reply is prepared, and Ostra's failure as one line with its reason, and goes on."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from support.cli import run_companion
from support.fake_llm_server import CooperativeModel, Reply, http_error, running_server

pytestmark = pytest.mark.integration

SLOW_FIRST_REPLY = 5.0


class SlowThenFailing:
    """The cooperative model, except that its first spoken reply takes 5 s and every reply
    Ostra asks for fails with HTTP 500 (the server's own words in the body)."""

    def __init__(self) -> None:
        self.inner = CooperativeModel()
        self.spoken = 0

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools") or []}
        prompt = "\n".join(str(m.get("content")) for m in body.get("messages") or [])
        if CooperativeModel._schema(body, tools, prompt) is not None:
            return self.inner(body)  # states and parameters: answered
        if "You are Ostra (id " in prompt:  # a reply, in whatever form the client tries
            return http_error(500, "CUDA out of memory while loading the model")
        self.spoken += 1
        if self.spoken == 1:
            time.sleep(SLOW_FIRST_REPLY)
        return self.inner(body)


def test_the_transcript_shows_a_slow_model_thinking_and_a_failure_with_its_reason(tmp_path: Path) -> None:
    model = SlowThenFailing()
    with running_server() as server:
        server.push(*([model] * 400))
        args = ["demo", "--model", "openai:fake-1", "--base-url", server.openai_base_url]
        args += ["--max-turns", "4", "--timeout", "150", "--pace", "0", "--keep", str(tmp_path / "run")]
        done = run_companion(args, cwd=tmp_path, timeout=240)
    out = done.stdout
    print(out)  # shown with -s: what the user saw
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    thinking = [line.strip() for line in out.splitlines() if "is thinking…" in line]
    assert thinking and thinking[0].endswith("is thinking… (3 s)"), out
    failed = [line.strip() for line in out.splitlines() if line.strip().startswith("Ostra could not answer")]
    assert failed, out
    assert failed[0].startswith("Ostra could not answer: the model failed (")
    assert "500" in failed[0] and failed[0].endswith("; the turn passes to the next companion")
    assert "— stopped (turn_cap)" in out or "— the conversation closed" in out
