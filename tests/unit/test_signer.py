"""A node's signatures: libsodium and OpenSSL give the same Ed25519 bytes."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core import chain
from perdure.core.chain import Signer


def test_the_fast_signature_is_the_one_openssl_gives() -> None:
    """Ed25519 is deterministic: signing through libsodium gives the same 64 bytes as
    ``cryptography``, and they verify under the node's public key."""
    pytest.importorskip("nacl")
    assert chain._sodium_sign is not None
    for seed in range(5):
        key = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
        signer = Signer("node", key)
        for n in range(20):
            digest = bytes([n]) * 32
            signature = signer.sign(digest)
            assert signature == key.sign(digest)
            key.public_key().verify(signature, digest)
