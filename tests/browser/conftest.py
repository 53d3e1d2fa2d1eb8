"""Browser tests need the distribution's Chromium; the set-up installs it when it can."""

from __future__ import annotations

import pytest
from browser_cdp import ensure_chromium


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = ensure_chromium()
    if path is None:
        pytest.skip("Chromium is not installed and could not be installed (needs root and apt-get)")
    return path
