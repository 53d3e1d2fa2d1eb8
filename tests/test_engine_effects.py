"""The driver's table of effects, the counterpart of the machine's table of handlers: every
effect type the machine may return has the driver's method that carries it out, and a type
without one fails at the driver's import, never silently at run time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from companion.conversation import events as ev
from companion.engine.driver import ConversationEngine
from companion.engine.effects import EFFECTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_effect_type_has_the_drivers_method() -> None:
    assert set(EFFECTS) == set(get_args(ev.Effect))
    assert (
        EFFECTS[ev.Withdraw] is ConversationEngine._withdraw and EFFECTS[ev.Lead] is ConversationEngine._lead
    )
    with pytest.raises(TypeError):
        EFFECTS[ev.Lead] = ConversationEngine._speak  # type: ignore[index]  # read-only once checked


def test_a_table_without_an_effect_or_with_a_stranger_is_refused() -> None:
    short = {kind: carry for kind, carry in EFFECTS.items() if kind is not ev.Prepare}
    with pytest.raises(TypeError, match="wrong: Prepare"):
        ev.effect_table(short)
    with pytest.raises(TypeError, match="wrong: Tick"):
        ev.effect_table({**EFFECTS, ev.Tick: ConversationEngine._withdraw})  # an event, not an effect


def test_a_new_effect_without_its_method_fails_at_the_drivers_import() -> None:
    """In a fresh interpreter: the machine's vocabulary gains an effect the driver does not know."""
    code = (
        "import dataclasses\n"
        "import companion.conversation.events as ev\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Sing:\n"
        "    message_id: str\n"
        "ev.Effect = ev.Effect | Sing\n"
        "import companion.engine.driver\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "TypeError: the table of effects must name every effect type and no other; wrong: Sing" in out.stderr
    )
