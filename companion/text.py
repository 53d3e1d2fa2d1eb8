"""Text cut to fit on one line: what a prompt shows of a card's fields and a peer's message, what
a refusal quotes of a line, a model error's reason. One rule, so they all read alike.
"""

from __future__ import annotations

__all__ = ["clip"]


def clip(text: str, limit: int) -> str:
    """``text`` with its white space folded to single spaces, at most ``limit`` characters: an
    ellipsis ends it where it was cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
