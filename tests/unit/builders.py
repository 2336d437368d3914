"""Pure builders for unit tests: deterministic signers and sealed chains, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, settings

from perdure.core.chain import Signer, seal
from perdure.core.intent import Context, Intent
from perdure.core.records import GENESIS_HASH, Kind, Record, RecordDraft

__all__ = [
    "OBJECT_ID",
    "PROFILE",
    "T0",
    "TRACE_ID",
    "chain",
    "instantiated",
    "public_key",
    "signer",
]

OBJECT_ID = "obj-1"
TRACE_ID = "trace-1"
T0 = 1_700_000_000.0  # a fixed "now" for pure tests

PROFILE = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Hypothesis settings for pure property tests: bounded, reproducible, no database files."""


def signer(node_id: str = "node-a", seed: int = 1) -> Signer:
    """A signer whose key is derived from ``seed`` (same seed, same key)."""
    return Signer(node_id, Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


def public_key(sig: Signer) -> bytes:
    """The raw public key of ``sig``."""
    return sig.private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def instantiated(intent: Intent | None = None, context: Context | None = None) -> RecordDraft:
    """The first record's draft for an object with ``intent`` and ``context``."""
    intent = intent or Intent(agent="demo", version="1")
    context = context or Context(object_id=OBJECT_ID, trace_id=TRACE_ID)
    return RecordDraft(
        Kind.INSTANTIATED, {"intent": intent.to_body(), "context": context.to_body()}
    )


def chain(
    drafts: Sequence[RecordDraft | tuple[Kind, dict[str, Any]]],
    *,
    sig: Signer | None = None,
    object_id: str = OBJECT_ID,
    first: RecordDraft | None = None,
) -> list[Record]:
    """Seal ``first`` (default: an instantiated record) then ``drafts`` into one chain."""
    sig = sig or signer()
    records: list[Record] = []
    prev = GENESIS_HASH
    items = [first or instantiated(), *drafts]
    for seq, item in enumerate(items, start=1):
        draft = item if isinstance(item, RecordDraft) else RecordDraft(item[0], item[1])
        rec = seal(
            draft,
            object_id=object_id,
            seq=seq,
            prev_hash=prev,
            trace_id=TRACE_ID,
            ts_us=int(T0 * 1_000_000) + seq,
            policy_ref="default@test",
            signer=sig,
        )
        records.append(rec)
        prev = rec.hash
    return records
