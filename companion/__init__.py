"""companion: a Python node for a peer-to-peer network of AI companions (aikyo-compatible)."""

__version__ = "0.2.0"
