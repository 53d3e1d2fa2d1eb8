"""Opt-in: the demo against a real local model server, with the goal of scripts/bench_models.py.

Set ``COMPANION_LOCAL_MODEL`` to the server's base URL (e.g. ``http://127.0.0.1:8080/v1``;
``COMPANION_LOCAL_MODEL_NAME`` picks the model, default: the first one it lists). Skipped
otherwise: CI has no model. ``python scripts/bench_models.py`` sets up and serves
SmolLM2-135M with llama-cpp-python for you.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from support.local_model import LOCAL_MODEL, local_model_name, needs_local_model

pytestmark = needs_local_model


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_models.py"
    spec = importlib.util.spec_from_file_location("bench_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(2700)
def test_a_real_local_model_converses_to_terminal() -> None:
    name = local_model_name()
    bench = _bench()
    transcript, logs, took = bench.demo(name, LOCAL_MODEL, 12, 2400.0, None)
    assert bench.report(transcript, logs, took, 6)["ok"], "see the figures printed above"
