"""Names a package exports but imports only on first use (PEP 562's module ``__getattr__``).

The front door, ``companion.actions`` and ``companion.node`` each name what they export beside
the module that defines it: importing the package stays as cheap as the package itself (the
runtime, the store and the node run on trio and libp2p; card loading and the core must not
load them), and the first use of a name imports its module once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``modules`` maps each exported name to the module
    that defines it; a name once imported is kept in ``namespace`` (the package's globals), so
    later lookups never come here."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
