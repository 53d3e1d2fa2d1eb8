"""Gossipsub message ids computed as js-libp2p computes them for signed messages.

js-libp2p (``@chainsafe/libp2p-gossipsub``, StrictSign) uses ``protobuf(public key) ‖ seqno``.
Using the same id lets IHAVE/IWANT/IDONTWANT line up with aikyo's JavaScript nodes; py-libp2p's
default (``from ‖ seqno``) differs by the two-byte multihash prefix.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["js_message_id"]

_IDENTITY_MULTIHASH: Final = 0x00


def _public_key_protobuf(from_id: bytes, key: bytes) -> bytes:
    """The signer's public key as a protobuf: inlined in an identity-multihash peer id (ed25519,
    secp256k1), else carried in the message's ``key`` field (RSA)."""
    if len(from_id) >= 2 and from_id[0] == _IDENTITY_MULTIHASH and from_id[1] == len(from_id) - 2:
        return from_id[2:]
    return key or from_id


def js_message_id(msg: Any) -> bytes:
    """The id of a pubsub ``rpc_pb2.Message``. Never raises: it runs on unverified input."""
    try:
        from_id = bytes(msg.from_id)
        return _public_key_protobuf(from_id, bytes(msg.key)) + bytes(msg.seqno)
    except Exception:
        return b"invalid:" + repr(msg).encode("utf-8", "replace")[:256]
