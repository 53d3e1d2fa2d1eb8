"""The front door: what card and action authors import from ``companion`` itself, and the test
doubles in ``companion.testing``."""

from __future__ import annotations

import subprocess
import sys

import pytest

import companion
import companion.testing


@pytest.mark.parametrize("name", companion.__all__)
def test_every_front_door_name_resolves(name: str) -> None:
    assert getattr(companion, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = companion.Nope


def test_the_front_door_names_are_the_modules_own() -> None:
    from companion.actions.definition import action
    from companion.card.model import load_card
    from companion.protocol import Message

    assert companion.action is action and companion.load_card is load_card
    assert companion.Message is Message


def test_importing_the_wire_models_loads_neither_cards_nor_actions() -> None:
    """The front door loads on first use: a client that needs only the protocol pays for it alone."""
    code = (
        "import sys, companion.protocol\n"
        "print(sorted(m for m in ('companion.card.model', 'companion.actions', 'cel_expr_python')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


async def test_the_memory_hub_follows_the_echo_rule() -> None:
    """A publisher receives its own publication back, as over gossipsub."""
    from companion.protocol import MESSAGES, Message, MessageParams

    hub = companion.testing.MemoryHub()
    one, two = hub.endpoint("one"), hub.endpoint("two")
    params = MessageParams.model_validate(
        {"id": "m1", "from": "user_a", "to": ["companion_b"], "message": "hi"}
    )
    message = Message(params=params)
    await one.publish(MESSAGES, message)
    for endpoint in (one, two):
        inbound = endpoint.receive_channel.receive_nowait()
        assert inbound.topic == MESSAGES and inbound.payload == message
