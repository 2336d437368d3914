"""Memory records: frozen, hash-chained, signed.

A record's hash is SHA-256 over a canonical header (format version, object id,
sequence, trace id, timestamp, origin node, policy reference, kind, previous
hash) followed by the canonical body bytes. The origin node signs the 32 hash
bytes with Ed25519. Records are built once and never changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perdure.core.codec import decode, encode
from perdure.errors import RecordDecodeError

__all__ = [
    "FORMAT_VERSION",
    "GENESIS_HASH",
    "Kind",
    "Record",
    "RecordDraft",
    "compute_hash",
    "decode_record",
]

FORMAT_VERSION = 1
GENESIS_HASH = "0" * 64


class Kind(StrEnum):
    """What a memory record says happened."""

    INSTANTIATED = "instantiated"  # body: intent, context
    STEP_STARTED = "step_started"  # non-idempotent step about to run
    STEP_DONE = "step_done"
    STEP_FAILED = "step_failed"
    STEP_IN_DOUBT = "step_in_doubt"
    VALUE = "value"  # run.now(), run.uuid(), run.random()
    DORMANT = "dormant"
    WOKE = "woke"
    EVENT_RECEIVED = "event_received"
    WAIT_TIMED_OUT = "wait_timed_out"
    INTENT_REFINED = "intent_refined"
    NONDETERMINISM = "nondeterminism"
    DELEGATED = "delegated"  # a child object was created
    CHILD_FINISHED = "child_finished"  # a child terminated; its result or error
    CAPABILITY_MISSING = "capability_missing"  # this node lacks what the next step needs
    PATCHED = "patched"  # run.patched(name): new code path taken
    PROGRESS = "progress"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class RecordDraft:
    """A record before it has a place in the chain: kind and body only."""

    kind: Kind
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Record:
    """One execution record in an object's memory."""

    object_id: str
    seq: int
    trace_id: str
    ts_us: int
    node_id: str
    policy_ref: str
    kind: str
    body_bytes: bytes
    prev_hash: str
    hash: str
    signature: bytes
    body: dict[str, Any]

    @property
    def ts(self) -> float:
        """Timestamp in seconds since the epoch."""
        return self.ts_us / 1_000_000


def compute_hash(
    *,
    object_id: str,
    seq: int,
    trace_id: str,
    ts_us: int,
    node_id: str,
    policy_ref: str,
    kind: str,
    body_bytes: bytes,
    prev_hash: str,
) -> str:
    """Return the hex SHA-256 of a record's canonical header and body bytes."""
    header = encode(
        [FORMAT_VERSION, object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, prev_hash]
    )
    digest = hashlib.sha256(header)
    digest.update(b"\n")
    digest.update(body_bytes)
    return digest.hexdigest()


def decode_record(
    *,
    object_id: str,
    seq: int,
    trace_id: str,
    ts_us: int,
    node_id: str,
    policy_ref: str,
    kind: str,
    body_bytes: bytes,
    prev_hash: str,
    hash: str,  # noqa: A002 - the record's field name
    signature: bytes,
) -> Record:
    """Build a ``Record`` from stored columns, failing closed on anything undecodable."""
    try:
        body = decode(body_bytes)
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise RecordDecodeError(object_id, seq, f"body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RecordDecodeError(object_id, seq, "body is not a JSON object")
    try:
        Kind(kind)
    except ValueError as exc:
        raise RecordDecodeError(object_id, seq, f"unknown record kind {kind!r}") from exc
    return Record(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=node_id,
        policy_ref=policy_ref,
        kind=kind,
        body_bytes=body_bytes,
        prev_hash=prev_hash,
        hash=hash,
        signature=signature,
        body=body,
    )
