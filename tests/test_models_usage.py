"""Token usage as the server reported it, and "not reported" kept apart from 0
(``companion/models/usage.py``): llama-cpp-python streams no usage even when asked, so its
streamed speech is logged with ``null`` tokens and left out of the token counters, while its
whole (unstreamed) answers and every stream of a server that reports usage count as before."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic_ai.usage import RequestUsage

from companion.app.metrics import ProcessMetrics
from companion.models.servers import ServerKind
from companion.models.usage import Tokens, reported_tokens
from support.fake_llm_server import PROFILES, CooperativeModel, running_server
from support.models import ToolRecorder, openai_model, speak_request, states_request


class Shown:
    """A live line that keeps nothing: the speak request streams only when it has one."""

    abandoned = False
    settled: str | None = None

    def grow(self, tool_id: str, text: str) -> None:
        pass


def requests_logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(getattr(record, "companion_fields", {}))
        for record in caplog.records
        if getattr(record, "companion_event", "") == "model_request"
    ]


def reported(metrics: ProcessMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_pydantic_ais_marker_decides_not_the_zeros() -> None:
    assert reported_tokens(RequestUsage(input_tokens=11, output_tokens=4)) == Tokens(11, 4)
    assert reported_tokens(RequestUsage()) == Tokens(0, 0)  # a server that reported 0 said 0
    assert reported_tokens(RequestUsage(unmeasured_requests=1)) is None


@pytest.mark.parametrize(("profile", "streamed_usage"), [("openai", True), ("llama-cpp-python", False)])
async def test_a_stream_without_usage_logs_null_tokens_and_counts_none(
    profile: ServerKind, streamed_usage: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader's states (a whole answer) and the speaker's line (streamed) through the
    process's metrics, as ``companion run --metrics`` wires a provider model."""
    caplog.set_level(logging.INFO, logger="companion.models")
    metrics = ProcessMetrics()
    with running_server(api_key="sk-test", profile=PROFILES[profile]) as srv:
        srv.push(CooperativeModel(), CooperativeModel())
        served = openai_model(srv)
        served.memory.identify(served.config, profile)
        model = metrics.metered("companion_ben", served)
        await model.decide_states(states_request())
        await model.speak(speak_request(live=Shown()), ToolRecorder())
        bodies = [r.body for r in srv.model_requests() if not r.refused]
    streamed = [b for b in bodies if b.get("stream")]
    assert streamed and all(b["stream_options"]["include_usage"] is True for b in streamed)

    states, speak = requests_logged(caplog)
    assert (states["purpose"], states["streamed"]) == ("states", False)
    assert (speak["purpose"], speak["streamed"]) == ("speak", True)
    assert states["input_tokens"] == 11 and states["output_tokens"] > 0  # the fake server's count
    labels = {"model": "openai:fake-1"}
    counted_in = reported(metrics, "companion_model_tokens_total", **labels, direction="input")
    counted_out = reported(metrics, "companion_model_tokens_total", **labels, direction="output")
    without = reported(metrics, "companion_model_requests_without_usage_total", **labels)
    if streamed_usage:
        assert speak["input_tokens"] == 11 and speak["output_tokens"] > 0
        assert (counted_in, without) == (22, 0)
        assert counted_out == states["output_tokens"] + speak["output_tokens"]
    else:
        assert (speak["input_tokens"], speak["output_tokens"]) == (None, None)
        assert (counted_in, counted_out, without) == (11, states["output_tokens"], 1)
