"""The opt-in real model server of the tests: ``COMPANION_LOCAL_MODEL`` is its base URL (e.g.
``http://127.0.0.1:8080/v1``, SmolLM2-135M behind llama-cpp-python as docs/models.md runs it),
``COMPANION_LOCAL_MODEL_NAME`` the model (default: the first the server lists). Tests that need
it are skipped without it: CI has no model server, and one takes minutes to build."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Final

import pytest

__all__ = ["LOCAL_MODEL", "local_model_name", "needs_local_model"]

LOCAL_MODEL: Final = os.environ.get("COMPANION_LOCAL_MODEL", "")

needs_local_model: Final = pytest.mark.skipif(
    not LOCAL_MODEL,
    reason="COMPANION_LOCAL_MODEL is not set (the base URL of a local OpenAI-compatible server)",
)
"""Marks a test (or, as ``pytestmark``, a module) that runs only with the real model server."""


def local_model_name() -> str:
    """The model to ask: ``COMPANION_LOCAL_MODEL_NAME``, else the first the server lists."""
    name = os.environ.get("COMPANION_LOCAL_MODEL_NAME")
    if name:
        return name
    with urllib.request.urlopen(f"{LOCAL_MODEL.rstrip('/')}/models", timeout=10) as answer:
        return str(json.loads(answer.read())["data"][0]["id"])
