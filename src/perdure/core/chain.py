"""Sealing records into an object's chain, and verifying a chain.

Pure: keys come in as values, nothing here reads files or the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from perdure.core.codec import encode
from perdure.core.records import GENESIS_HASH, Record, RecordDraft, compute_hash
from perdure.errors import IntegrityError

__all__ = ["Signer", "VerifyReport", "check_links", "seal", "verify_chain"]


@dataclass(frozen=True, slots=True)
class Signer:
    """A node's identity: its id and Ed25519 private key."""

    node_id: str
    private_key: Ed25519PrivateKey

    def sign(self, digest: bytes) -> bytes:
        """Sign ``digest`` (the record hash bytes)."""
        return self.private_key.sign(digest)


def seal(
    draft: RecordDraft,
    *,
    object_id: str,
    seq: int,
    prev_hash: str,
    trace_id: str,
    ts_us: int,
    policy_ref: str,
    signer: Signer,
) -> Record:
    """Give ``draft`` its place after ``prev_hash``: hash it and sign it."""
    body_bytes = encode(draft.body, what=f"{draft.kind} record body")
    digest = compute_hash(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=signer.node_id,
        policy_ref=policy_ref,
        kind=str(draft.kind),
        body_bytes=body_bytes,
        prev_hash=prev_hash,
    )
    return Record(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=signer.node_id,
        policy_ref=policy_ref,
        kind=str(draft.kind),
        body_bytes=body_bytes,
        prev_hash=prev_hash,
        hash=digest,
        signature=signer.sign(bytes.fromhex(digest)),
        body=draft.body,
    )


def check_links(object_id: str, records: Sequence[Record], *, start_hash: str = GENESIS_HASH,
                start_seq: int = 1) -> None:
    """Check sequence numbers, hashes and links (not signatures); raise ``IntegrityError``."""
    prev = start_hash
    expected = start_seq
    for rec in records:
        if rec.seq != expected:
            raise IntegrityError(
                object_id, expected, f"sequence gap: expected #{expected}, found #{rec.seq}"
            )
        if rec.prev_hash != prev:
            raise IntegrityError(object_id, rec.seq, "previous-hash link is broken")
        actual = compute_hash(
            object_id=rec.object_id,
            seq=rec.seq,
            trace_id=rec.trace_id,
            ts_us=rec.ts_us,
            node_id=rec.node_id,
            policy_ref=rec.policy_ref,
            kind=rec.kind,
            body_bytes=rec.body_bytes,
            prev_hash=rec.prev_hash,
        )
        if actual != rec.hash:
            raise IntegrityError(object_id, rec.seq, "content does not match its hash")
        if rec.object_id != object_id:
            raise IntegrityError(object_id, rec.seq, f"record belongs to {rec.object_id!r}")
        prev = rec.hash
        expected += 1


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of ``verify_chain``: ``ok``, records checked, and the first failure if any."""

    object_id: str
    ok: bool
    records: int
    bad_seq: int | None = None
    reason: str | None = None
    head_hash: str | None = None

    def __str__(self) -> str:
        if self.ok:
            return f"{self.object_id}: {self.records} records verified (head {self.head_hash})"
        return f"{self.object_id}: record #{self.bad_seq} is bad: {self.reason}"


def verify_chain(
    object_id: str,
    records: Sequence[Record],
    public_keys: Mapping[str, bytes],
    *,
    head_seq: int | None = None,
    head_hash: str | None = None,
) -> VerifyReport:
    """Walk ``records`` and report the first bad one by sequence number and reason.

    ``head_seq``/``head_hash`` are what the object's row says the chain ends
    with; a chain that stops short of it (a deleted tail) fails too.
    """
    try:
        check_links(object_id, records)
    except IntegrityError as exc:
        return VerifyReport(object_id, False, len(records), exc.seq, exc.reason)
    keys: dict[str, Ed25519PublicKey] = {}
    for rec in records:
        key = keys.get(rec.node_id)
        if key is None:
            raw = public_keys.get(rec.node_id)
            if raw is None:
                return VerifyReport(
                    object_id, False, len(records), rec.seq,
                    f"origin node {rec.node_id!r} has no registered public key",
                )
            key = keys[rec.node_id] = Ed25519PublicKey.from_public_bytes(raw)
        try:
            key.verify(rec.signature, bytes.fromhex(rec.hash))
        except InvalidSignature:
            return VerifyReport(
                object_id, False, len(records), rec.seq,
                f"signature does not verify against node {rec.node_id!r}",
            )
    last = records[-1] if records else None
    if head_seq is not None and (last is None or last.seq != head_seq):
        got = last.seq if last else 0
        return VerifyReport(
            object_id, False, len(records), got + 1,
            f"chain ends at #{got} but the object's head is #{head_seq} (records missing)",
        )
    if head_hash is not None and last is not None and last.hash != head_hash:
        return VerifyReport(
            object_id, False, len(records), last.seq,
            "last record's hash differs from the object's recorded head",
        )
    if not records:
        return VerifyReport(object_id, False, 0, 1, "object has no records")
    return VerifyReport(object_id, True, len(records), head_hash=last.hash if last else None)
