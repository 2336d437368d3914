"""Record hashing covers every header field and body byte; decoding fails closed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from perdure.core.records import GENESIS_HASH, Kind, Record, compute_hash, decode_record
from perdure.errors import RecordDecodeError

BASE: dict[str, Any] = {
    "object_id": "obj-1",
    "seq": 3,
    "trace_id": "trace-1",
    "ts_us": 1_700_000_000_000_000,
    "node_id": "node-a",
    "policy_ref": "default@abc",
    "kind": "step_done",
    "body_bytes": b'{"pos":0,"result":1}',
    "prev_hash": GENESIS_HASH,
}

CHANGED: dict[str, Any] = {
    "object_id": "obj-2",
    "seq": 4,
    "trace_id": "trace-2",
    "ts_us": 1_700_000_000_000_001,
    "node_id": "node-b",
    "policy_ref": "default@abd",
    "kind": "step_failed",
    "body_bytes": b'{"pos":0,"result":2}',
    "prev_hash": "1" + GENESIS_HASH[1:],
}


def test_hash_is_stable_hex_sha256() -> None:
    """The same fields always give the same 64-character hex digest."""
    digest = compute_hash(**BASE)
    assert digest == compute_hash(**BASE)
    assert len(digest) == 64
    int(digest, 16)


@pytest.mark.parametrize("field", sorted(BASE))
def test_hash_changes_with_every_field(field: str) -> None:
    """Changing any one header field or the body changes the hash."""
    assert compute_hash(**{**BASE, field: CHANGED[field]}) != compute_hash(**BASE)


def test_hash_changes_with_every_body_byte() -> None:
    """Flipping any single bit of any body byte changes the hash."""
    original = compute_hash(**BASE)
    body = BASE["body_bytes"]
    for index in range(len(body)):
        for bit in (0x01, 0x80):
            flipped = bytearray(body)
            flipped[index] ^= bit
            assert compute_hash(**{**BASE, "body_bytes": bytes(flipped)}) != original


def test_header_and_body_cannot_trade_bytes() -> None:
    """Moving characters between header fields and body does not collide."""
    a = compute_hash(**{**BASE, "node_id": "ab", "body_bytes": b"{}"})
    b = compute_hash(**{**BASE, "node_id": "a", "body_bytes": b"b{}"})
    c = compute_hash(**{**BASE, "trace_id": "x", "policy_ref": "yz"})
    d = compute_hash(**{**BASE, "trace_id": "xy", "policy_ref": "z"})
    assert a != b
    assert c != d


def _stored(**overrides: Any) -> dict[str, Any]:
    columns = {**BASE, "hash": compute_hash(**BASE), "signature": b"\x00" * 64}
    columns.update(overrides)
    return columns


def test_decode_record_builds_a_frozen_record() -> None:
    """Good columns decode into a Record with the parsed body; the record is immutable."""
    rec = decode_record(**_stored())
    assert isinstance(rec, Record)
    assert rec.body == {"pos": 0, "result": 1}
    assert rec.kind == Kind.STEP_DONE
    assert rec.ts == pytest.approx(1_700_000_000.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.seq = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b'{"a":1', "not valid JSON"),
        (b"[1,2]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'"text"', "not a JSON object"),
        (b"42", "not a JSON object"),
    ],
)
def test_decode_record_fails_closed_on_bad_body(body: bytes, reason: str) -> None:
    """An undecodable or non-object body raises RecordDecodeError naming object and seq."""
    with pytest.raises(RecordDecodeError) as info:
        decode_record(**_stored(body_bytes=body, object_id="obj-9", seq=7))
    err = info.value
    assert (err.object_id, err.seq) == ("obj-9", 7)
    assert reason in err.reason
    assert "'obj-9'" in str(err)
    assert "#7" in str(err)


def test_decode_record_refuses_unknown_kind() -> None:
    """A kind this version does not know is an error, never silently accepted."""
    with pytest.raises(RecordDecodeError) as info:
        decode_record(**_stored(kind="teleported", seq=5))
    assert info.value.seq == 5
    assert info.value.object_id == "obj-1"
    assert "teleported" in info.value.reason


def test_every_kind_decodes() -> None:
    """Every Kind value is accepted by the decoder."""
    for kind in Kind:
        assert decode_record(**_stored(kind=str(kind))).kind == kind
