"""The test card and the test metadata: one factory for each, used by every test that needs a
companion it does not read from ``cards/``."""

from __future__ import annotations

from pathlib import Path

from companion.protocol import Metadata

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


def write_card(directory: Path, key: str, *, model: str | None = None) -> Path:
    """``directory/<key>.yaml``: the test card of ``companion_<key>``, naming ``model`` in its
    settings when given."""
    settings = f"settings:\n  model: {model!r}\n" if model else ""
    path = directory / f"{key}.yaml"
    path.write_text(CARD.format(key=key, settings=settings), encoding="utf-8")
    return path


def metadata(key: str, **changes: str) -> Metadata:
    """The metadata of ``companion_<key>`` named ``key``, with any field replaced by ``changes``."""
    fields = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
    fields.update(changes)
    return Metadata(**fields)
