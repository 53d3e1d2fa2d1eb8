"""Fixtures shared by the integration tests (helpers live in ``tests/support/``)."""

from collections.abc import Iterator

import pytest

from support.fake_llm_server import FakeLLMServer, running_server


@pytest.fixture
def hosted() -> Iterator[FakeLLMServer]:
    """The fake model server at a hosted model's pace: 0.4 s to the first token, 60 tokens a
    second (what the voice tests speak over)."""
    with running_server(ttft=0.4, token_rate=60) as server:
        yield server
