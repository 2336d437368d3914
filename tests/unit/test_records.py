"""Record hashing covers every header field and body byte; decoding fails closed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.codec import encode
from perdure.core.records import (
    FORMAT_VERSION,
    GENESIS_HASH,
    Kind,
    Record,
    compute_hash,
    decode_record,
    header_bytes,
    record_from_columns,
)
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
    with pytest.raises(AttributeError):
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


@given(
    texts=st.lists(st.text(max_size=12), min_size=6, max_size=6),
    seq=st.integers(min_value=0, max_value=2**70),
    ts_us=st.integers(min_value=-(2**63), max_value=2**70),
)
def test_header_matches_the_canonical_encoder(texts: list[str], seq: int, ts_us: int) -> None:
    """The directly formatted header is byte for byte the canonical JSON of the list,
    whatever the strings hold (quotes, backslashes, control and non-ASCII characters)."""
    object_id, trace_id, node_id, policy_ref, kind, prev_hash = texts
    expected = encode([FORMAT_VERSION, object_id, seq, trace_id, ts_us, node_id, policy_ref,
                       kind, prev_hash])
    assert header_bytes(object_id, seq, trace_id, ts_us, node_id, policy_ref, kind,
                        prev_hash) == expected


def _columns(**overrides: Any) -> tuple[Any, ...]:
    stored = _stored(**overrides)
    return (stored["object_id"], stored["seq"], stored["trace_id"], stored["ts_us"],
            stored["node_id"], stored["policy_ref"], stored["kind"], stored["body_bytes"],
            bytes.fromhex(stored["prev_hash"]), bytes.fromhex(stored["hash"]),
            stored["signature"])


@pytest.mark.parametrize("body", [
    b'{"pos":0,"result":1}',
    b'{"pos":0,"result":123456789012345678901234567890}',  # beyond 64 bits
    b'{"pos":0,"result":"\\ud800"}',  # an escaped lone surrogate
    b'{"pos":0,"result":[1.5,-0.0,1e-05,{"a":null}]}',
    '{"pos":0,"result":"héllo ☃"}'.encode(),
])
def test_row_decoding_agrees_with_the_checked_decoder(body: bytes) -> None:
    """The fast row path builds exactly what ``decode_record`` builds, including bodies
    the C parser declines and hands to the checked path."""
    fast = record_from_columns(*_columns(body_bytes=body))
    checked = decode_record(**_stored(body_bytes=body))
    assert fast == checked
    assert type(fast.body["result"]) is type(checked.body["result"])


@pytest.mark.parametrize(("index", "value", "column"), [
    (0, 7, "object_id"),
    (1, "3", "seq"),
    (1, True, "seq"),
    (3, 1.5, "ts_us"),
    (7, "{}", "body"),
    (9, "ab" * 32, "hash"),
])
def test_row_with_a_wrongly_typed_column_fails_closed(index: int, value: Any,
                                                      column: str) -> None:
    """A column holding the wrong storage type is damage, named by column."""
    columns = list(_columns())
    columns[index] = value
    with pytest.raises(RecordDecodeError) as info:
        record_from_columns(*columns)
    assert column in info.value.reason


@pytest.mark.parametrize(("body", "reason"), [
    (b"[1,2]", "not a JSON object"),
    (b'{"a":1', "not valid JSON"),
    (b"\xff{}", "not valid JSON"),
])
def test_row_with_a_bad_body_fails_closed(body: bytes, reason: str) -> None:
    """The row path refuses the bodies ``decode_record`` refuses, with the same reason."""
    with pytest.raises(RecordDecodeError) as info:
        record_from_columns(*_columns(body_bytes=body, seq=4))
    assert reason in info.value.reason
    assert info.value.seq == 4
