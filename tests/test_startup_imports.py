"""Start-up work stays where the user does not wait for it (``companion run`` spawn -> first
connection, see ``scripts/bench_startup.py``): importing the command loads nothing that only
clients, provider models, the engine or the store need, and preparing the offline model does
not load the provider packages (it did: pydantic-ai, 1.2 s on a loaded machine, before the
first dial). Each check runs in a fresh interpreter, so nothing another test imported counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LATER: tuple[str, ...] = (
    "aiortc",  # WebRTC clients (--ws)
    "httpx",
    "pydantic_ai",  # provider models
    "openai",
    "anthropic",
    "companion.models.providers",
    "jsonschema",
    "companion.bridge",  # clients (--ws)
    "companion.rtc",
    "companion.voice",
    "companion.engine.driver",  # prepared while the node dials
    "companion.conversation.machine",
    "companion.store.sqlite",
    "sqlite3",
    "urllib.request",
    "libp2p",  # imported when the node starts, not by the command's modules
    "aioquic",
)
"""Modules none of the start-up modules may import when they are imported."""


def _loaded_after(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in {LATER!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("module", ["companion.cli", "companion.cli.run", "companion.app.run"])
def test_importing_the_run_command_loads_nothing_it_needs_later(module: str) -> None:
    assert _loaded_after(f"import {module}") == []


def test_the_run_commands_parser_loads_nothing_it_needs_later() -> None:
    """What ``companion run ...`` does before ``run_nodes``: only its own subcommand's parser."""
    code = "from companion.cli import build_parser\nbuild_parser('run').parse_args(['run', 'pim'])"
    assert _loaded_after(code) == []


def test_preparing_the_offline_model_loads_no_provider_package() -> None:
    card = str(ROOT / "cards" / "juniper.yaml")
    code = (
        "import trio\n"
        "from companion.app.engines import EngineOptions, prepare_models\n"
        "from companion.card.model import load_card\n"
        f"models = trio.run(prepare_models, [load_card({card!r})], EngineOptions())\n"
        "assert [m.spec for m in models.values()] == ['scripted'], models"
    )
    providers = {"httpx", "pydantic_ai", "openai", "anthropic", "companion.models.providers"}
    assert providers.isdisjoint(_loaded_after(code))
