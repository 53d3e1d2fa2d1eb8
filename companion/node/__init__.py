"""The py-libp2p node: gossipsub with strict signing, the metadata protocol, membership,
sender authentication, replay and size guards, mDNS and bootstrap discovery."""

from .config import NodeConfig
from .drops import Drop, DropCounters
from .node import CompanionNode, InboundHandler, MembershipListener, NodeNotRunning

__all__ = [
    "CompanionNode",
    "Drop",
    "DropCounters",
    "InboundHandler",
    "MembershipListener",
    "NodeConfig",
    "NodeNotRunning",
]
