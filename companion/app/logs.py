"""Logging for commands that run libp2p nodes: py-libp2p resets its loggers when first imported,
so it is imported before the ``companion`` loggers are set up (:func:`companion.log.configure_logging`)."""

from __future__ import annotations

from typing import Literal

from companion.log import configure_logging

__all__ = ["configure_node_logging"]


def configure_node_logging(level: str, fmt: Literal["text", "json"] = "text") -> None:
    """Import py-libp2p, then send the ``companion`` loggers to stderr at ``level`` in ``fmt``."""
    import companion.node.node  # noqa: F401  (py-libp2p, and its routine records named)

    configure_logging(level, fmt)
