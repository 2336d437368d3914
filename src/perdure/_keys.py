"""A node's Ed25519 key pair, kept in a key directory and created on first use."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.errors import ConfigurationError

__all__ = ["default_key_dir", "load_or_create_key", "public_bytes"]

_KEY_FILE = "node.key"


def default_key_dir() -> Path:
    """``~/.perdure/keys``: where a node keeps its key pair unless told otherwise."""
    return Path.home() / ".perdure" / "keys"


def load_or_create_key(key_dir: Path) -> Ed25519PrivateKey:
    """Load ``key_dir/node.key``, creating the directory and key atomically if missing."""
    path = key_dir / _KEY_FILE
    try:
        key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            fd, tmp = tempfile.mkstemp(dir=key_dir, prefix=".node-", suffix=".tmp")
            try:
                os.write(fd, pem)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o600)
            # link() fails if another process created the key first; then we use theirs.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
            os.unlink(tmp)
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"key directory {key_dir} cannot be used ({exc}); pass key_dir= to App "
            "or set PERDURE_KEY_DIR to a writable folder"
        ) from exc
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise ConfigurationError(f"{path} is not a readable Ed25519 key: {exc}") from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ConfigurationError(f"{path} holds a key that is not Ed25519")
    return loaded


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key."""
    return key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def default_node_id(key: Ed25519PrivateKey) -> str:
    """``hostname-fingerprint``: stable for one key directory on one host."""
    import hashlib

    fingerprint = hashlib.sha256(public_bytes(key)).hexdigest()[:8]
    return f"{socket.gethostname()}-{fingerprint}"
