"""The py-libp2p node: gossipsub with strict signing, the metadata protocol, membership,
sender authentication, replay and size guards, mDNS and bootstrap discovery."""

from companion.node.config import NodeConfig
from companion.node.drops import Drop, DropCounters
from companion.node.node import CompanionNode, InboundHandler, MembershipListener, NodeNotRunning

__all__ = [
    "CompanionNode",
    "Drop",
    "DropCounters",
    "InboundHandler",
    "MembershipListener",
    "NodeConfig",
    "NodeNotRunning",
]
