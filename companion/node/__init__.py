"""The py-libp2p node: gossipsub with strict signing, the metadata protocol, membership,
sender authentication, replay and size guards, mDNS and bootstrap discovery.

Two of its modules are pure bookkeeping that the layer table puts in the core
(:mod:`.membership`, who may speak as whom; :mod:`.announcements`, presence announcements and
their deadlines), so this ``__init__`` loads the libp2p node only on first use of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from companion.lazy import lazy_exports

if TYPE_CHECKING:
    from companion.node.config import NodeConfig
    from companion.node.drops import Drop, DropCounters
    from companion.node.node import CompanionNode, InboundHandler, MembershipListener, NodeNotRunning

_LAZY = {
    "NodeConfig": "companion.node.config",
    "Drop": "companion.node.drops",
    "DropCounters": "companion.node.drops",
    **dict.fromkeys(
        ("CompanionNode", "InboundHandler", "MembershipListener", "NodeNotRunning"), "companion.node.node"
    ),
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "CompanionNode",
    "Drop",
    "DropCounters",
    "InboundHandler",
    "MembershipListener",
    "NodeConfig",
    "NodeNotRunning",
]
