"""The node's key, created once and kept in the data directory so the peer id survives restarts.

The file holds the libp2p protobuf encoding of the private key (the format every libp2p
implementation reads), written with owner-only permissions.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key

from companion.log import log_event

__all__ = ["IdentityError", "load_or_create_key_pair"]

logger = logging.getLogger("companion.node.identity")


class IdentityError(RuntimeError):
    """The key file exists but cannot be used (corrupt or unreadable); it is never overwritten."""


def load_or_create_key_pair(path: Path) -> KeyPair:
    """Read the key at ``path``, or create an ed25519 key there if the file does not exist."""
    if path.exists():
        try:
            private = deserialize_private_key(path.read_bytes())
        except Exception as exc:
            raise IdentityError(
                f"cannot read the node key {path}: {exc}; move it away to make a new one"
            ) from exc
        return KeyPair(private, private.get_public_key())
    pair = create_new_key_pair()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pair.private_key.serialize())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    log_event(logger, "identity_created", path=str(path))
    return pair
