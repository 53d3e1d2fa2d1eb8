"""The test card and the test metadata: one factory for each, used by every test that needs a
companion it does not read from ``cards/``."""

from __future__ import annotations

from pathlib import Path

from companion.protocol import Metadata
from support.engines import STORIES

CARD = """\
metadata:
  id: companion_{key}
  name: {key}
  personality: calm
  story: a test companion
  sample: hello
role: test
actions: [speak]
events:
  params:
    type: object
    properties:
      mood: {{type: string}}
    required: [mood]
  conditions:
    - expression: "true"
      execute:
        - tool: speak
          instruction: reply
{settings}"""
"""A card that speaks and needs one parameter; ``{key}`` names it ``companion_{key}``."""


def write_card(directory: Path, key: str, text: str | None = None, *, model: str | None = None) -> Path:
    """``directory/<key>.yaml``, written as a user writes a card: ``text``, or else the test card
    of ``companion_<key>`` naming ``model`` in its settings when given."""
    if text is None:
        settings = f"settings:\n  model: {model!r}\n" if model else ""
        text = CARD.format(key=key, settings=settings)
    path = directory / f"{key}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


SPEAKING_CARD = """\
metadata:
  id: companion_{key}
  name: {name}
  personality: {personality}
  story: {name} {story}
  sample: "{sample}"
role: Keep replies to one or two sentences.
actions: [{tool}]
events:
  params:
    type: object
    properties:
      mood:
        type: string
        enum: [calm, curious]
    required: [mood]
  conditions:
{curious}    - expression: "true"
      execute:
        - tool: {tool}
          instruction: Reply briefly to what was just said.
"""
"""A card of ``companion_{key}`` that answers every message with ``{tool}``."""

CURIOUS = """\
    - expression: mood == "curious"
      execute:
        - tool: {tool}
          instruction: Ask one short question back.
"""
"""A condition that reads the ``mood`` parameter, so a model is asked for the parameters before
each reply (a card none of whose conditions reads one is never asked). ``bench_latency.py
--reads-param`` measured SmolLM2 with this card: its words are part of the figures."""


def speaking_card(key: str, name: str, tool: str, *, reads_param: bool = False) -> str:
    """The text of a card for ``companion_<key>`` named ``name`` that answers every message with
    ``tool`` (``speak`` or ``speak_with_voice``); each its own story (by name), as real
    companions have: companions sharing one would say one line, and a companion never says
    another's line (companion.lines.check). ``reads_param``: a condition reads a parameter
    (:data:`CURIOUS`), so each reply asks for the parameters first."""
    story = STORIES[sum(map(ord, name)) % len(STORIES)]
    return SPEAKING_CARD.format(
        key=key,
        name=name,
        tool=tool,
        curious=CURIOUS.format(tool=tool) if reads_param else "",
        personality="warm and curious",
        sample=f"Hello, I am {name}.",
        story=story,
    )


def metadata(key: str, **changes: str) -> Metadata:
    """The metadata of ``companion_<key>`` named ``key``, with any field replaced by ``changes``."""
    fields = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
    fields.update(changes)
    return Metadata(**fields)
