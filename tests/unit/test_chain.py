"""Sealing and verifying chains: the happy path, and every tampering caught at its seq."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.chain import (
    CommitSeal,
    VerifyReport,
    check_links,
    seal,
    seal_commit,
    seal_ref,
    seal_unsigned,
    sealed_by,
    verify_chain,
)
from perdure.core.records import GENESIS_HASH, Kind, Record, RecordDraft, compute_hash
from perdure.errors import IntegrityError
from tests.unit.builders import OBJECT_ID, PROFILE, chain, public_key, signer

SIG = signer("node-a", seed=1)
OTHER = signer("node-b", seed=2)
KEYS = {"node-a": public_key(SIG), "node-b": public_key(OTHER)}


def _records(n: int = 5) -> list[Record]:
    drafts = [(Kind.STEP_DONE, {"pos": i, "cmd": "step", "name": f"s{i}", "result": i})
              for i in range(n - 1)]
    return chain(drafts, sig=SIG)


def _reseal(rec: Record, **changes: object) -> Record:
    """``rec`` with ``changes``, hashed and signed again as an attacker with the key could."""
    changed = rec._replace(**changes)  # type: ignore[arg-type]
    digest = compute_hash(
        object_id=changed.object_id, seq=changed.seq, trace_id=changed.trace_id,
        ts_us=changed.ts_us, node_id=changed.node_id, policy_ref=changed.policy_ref,
        kind=changed.kind, body_bytes=changed.body_bytes, prev_hash=changed.prev_hash,
    )
    return changed._replace(hash=digest,
                               signature=SIG.sign(bytes.fromhex(digest)))


def _bad(report: VerifyReport) -> tuple[int | None, str]:
    assert not report.ok
    assert report.reason is not None
    return report.bad_seq, report.reason


def test_seal_links_hashes_and_signs() -> None:
    """Sealed records carry their seq, the previous hash, a matching hash and the node id."""
    records = _records(3)
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[0].prev_hash == GENESIS_HASH
    assert records[1].prev_hash == records[0].hash
    assert records[2].prev_hash == records[1].hash
    assert {r.node_id for r in records} == {"node-a"}
    assert records[1].body == {"pos": 0, "cmd": "step", "name": "s0", "result": 0}
    assert records[1].body_bytes == b'{"cmd":"step","name":"s0","pos":0,"result":0}'


def test_seal_is_deterministic() -> None:
    """Sealing the same draft at the same place twice gives the same hash and signature."""
    draft = RecordDraft(Kind.PROGRESS, {"fields": {"done": 1}})
    kwargs = dict(object_id=OBJECT_ID, seq=1, prev_hash=GENESIS_HASH, trace_id="t",
                  ts_us=1, policy_ref="p", signer=SIG)
    assert seal(draft, **kwargs) == seal(draft, **kwargs)  # type: ignore[arg-type]


def test_happy_path_verifies() -> None:
    """An untouched chain passes check_links and verify_chain with its head."""
    records = _records()
    check_links(OBJECT_ID, records)
    report = verify_chain(OBJECT_ID, records, KEYS, head_seq=5, head_hash=records[-1].hash)
    assert report.ok
    assert report.records == 5
    assert report.bad_seq is None
    assert report.head_hash == records[-1].hash
    assert "5 records verified" in str(report)


def test_chain_from_two_nodes_verifies() -> None:
    """Records sealed by different nodes verify against each node's own key."""
    first = _records(2)
    extra = seal(RecordDraft(Kind.PROGRESS, {"fields": {}}), object_id=OBJECT_ID, seq=3,
                 prev_hash=first[-1].hash, trace_id="t", ts_us=3, policy_ref="p", signer=OTHER)
    assert verify_chain(OBJECT_ID, [*first, extra], KEYS, head_seq=3).ok


def test_tampered_body_is_caught_at_its_seq() -> None:
    """Editing a body without re-hashing fails at that record: content vs hash."""
    records = _records()
    records[2] = records[2]._replace(body_bytes=b'{"pos":1,"result":999}')
    with pytest.raises(IntegrityError) as info:
        check_links(OBJECT_ID, records)
    assert info.value.seq == 3
    assert _bad(verify_chain(OBJECT_ID, records, KEYS)) == (3, "content does not match its hash")


def test_rehashed_middle_record_breaks_the_next_link() -> None:
    """Re-hashing an edited middle record keeps its own hash right; the next link breaks."""
    records = _records()
    records[2] = _reseal(records[2], body_bytes=b"{}")._replace(signature=records[2].signature)
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 4
    assert "previous-hash link" in reason


def test_rehashed_last_record_without_the_key_fails_signature() -> None:
    """Editing and re-hashing the head without the node's key fails its signature."""
    records = _records()
    records[-1] = _reseal(records[-1], body_bytes=b"{}")._replace(signature=records[-1].signature)
    check_links(OBJECT_ID, records)  # hashes and links are consistent again
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 5
    assert "signature does not verify" in reason


def test_seq_gap_is_caught() -> None:
    """A missing middle record is reported at the first missing sequence number."""
    records = _records()
    del records[2]
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 3
    assert "sequence gap" in reason
    assert "expected #3, found #4" in reason


def test_swapped_order_is_caught() -> None:
    """Two records swapped are reported where the order first goes wrong."""
    records = _records()
    records[1], records[2] = records[2], records[1]
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 2
    assert "sequence gap" in reason


def test_broken_prev_link_is_caught() -> None:
    """A record re-hashed and re-signed onto the wrong predecessor fails its link."""
    records = _records()
    records[3] = _reseal(records[3], prev_hash=records[1].hash)
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 4
    assert reason == "previous-hash link is broken"


def test_bad_signature_is_caught() -> None:
    """A record signed by another key than its node's fails at that record."""
    records = _records()
    records[3] = records[3]._replace(signature=OTHER.sign(bytes.fromhex(records[3].hash))
    )
    check_links(OBJECT_ID, records)  # links alone do not cover signatures
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS))
    assert seq == 4
    assert "signature does not verify" in reason
    assert "node-a" in reason


def test_garbage_signature_is_caught() -> None:
    """A signature of the right length but wrong bytes fails verification."""
    records = _records()
    records[0] = records[0]._replace(signature=b"\x01" * 64)
    assert _bad(verify_chain(OBJECT_ID, records, KEYS))[0] == 1


def test_unknown_node_key_is_caught() -> None:
    """A record from a node with no registered public key is reported."""
    records = _records()
    seq, reason = _bad(verify_chain(OBJECT_ID, records, {"node-b": KEYS["node-b"]}))
    assert seq == 1
    assert "no registered public key" in reason


def test_truncated_tail_is_caught_against_head_seq() -> None:
    """A chain shorter than the object's head fails at the first missing seq."""
    records = _records()
    head = records[-1]
    del records[-2:]
    assert verify_chain(OBJECT_ID, records, KEYS).ok  # alone it looks fine
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS, head_seq=head.seq))
    assert seq == 4
    assert "records missing" in reason


def test_head_hash_mismatch_is_caught() -> None:
    """A last record whose hash differs from the object's head hash is reported."""
    records = _records()
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS, head_seq=5,
                                    head_hash=records[0].hash))
    assert seq == 5
    assert "differs" in reason


def test_empty_chain_is_not_ok() -> None:
    """An object with no records does not verify."""
    assert _bad(verify_chain(OBJECT_ID, [], KEYS)) == (1, "object has no records")
    assert _bad(verify_chain(OBJECT_ID, [], KEYS, head_seq=3))[0] == 1


def test_record_of_another_object_is_caught() -> None:
    """A valid record from another object's chain does not pass in this one."""
    foreign = chain([], sig=SIG, object_id="obj-other")
    seq, reason = _bad(verify_chain(OBJECT_ID, foreign, KEYS))
    assert seq == 1
    assert "obj-other" in reason


def test_check_links_can_start_mid_chain() -> None:
    """check_links verifies a tail given the hash and seq it follows."""
    records = _records()
    check_links(OBJECT_ID, records[2:], start_hash=records[1].hash, start_seq=3)
    with pytest.raises(IntegrityError) as info:
        check_links(OBJECT_ID, records[2:], start_hash=records[0].hash, start_seq=3)
    assert info.value.seq == 3


def test_failed_report_reads_well() -> None:
    """A failed report's text names the bad record and the reason."""
    records = _records()
    del records[1]
    assert str(verify_chain(OBJECT_ID, records, KEYS)) == (
        f"{OBJECT_ID}: record #2 is bad: sequence gap: expected #2, found #3"
    )


def test_sealed_unsigned_then_signed_equals_sealed_and_signed() -> None:
    """A record sealed without a signature and signed afterwards (as the engine's write
    thread does) is exactly the record ``seal`` signs at once, and it verifies."""
    from perdure.core.chain import signed

    draft = RecordDraft(Kind.PROGRESS, {"fields": {"n": 1}})
    common: dict[str, object] = {"object_id": OBJECT_ID, "seq": 1, "prev_hash": GENESIS_HASH,
                                 "trace_id": "t", "ts_us": 1, "policy_ref": "p", "signer": SIG}
    at_once = seal(draft, **common)  # type: ignore[arg-type]
    later = seal(draft, sign=False, **common)  # type: ignore[arg-type]
    assert later.signature == b""
    assert signed(later, SIG) == at_once
    with pytest.raises(ValueError, match="names node"):
        signed(later, signer("node-b", seed=2))


# -- commit seals: one signature over the records of one commit ---------------------------


def _sealed(n: int = 5) -> tuple[list[Record], dict[bytes, CommitSeal]]:
    """A chain whose records after the first share one commit seal (as a group commit)."""
    records = _records(n)
    commit_seal, refs = seal_commit(records[1:], SIG)
    return [records[0], *refs], {commit_seal.digest: commit_seal}


def test_sealed_records_verify_and_carry_a_reference() -> None:
    """Records under a commit seal verify; each stores a 33-byte reference, not a signature."""
    records, seals = _sealed()
    assert all(len(r.signature) == 33 and sealed_by(r) in seals for r in records[1:])
    assert sealed_by(records[0]) is None and len(records[0].signature) == 64
    assert verify_chain(OBJECT_ID, records, KEYS, seals=seals).ok


def test_a_missing_seal_fails_the_first_record_it_covered() -> None:
    """Without the seal row, the first sealed record is named."""
    records, _ = _sealed()
    assert _bad(verify_chain(OBJECT_ID, records, KEYS, seals={})) == (
        2, f"its commit seal {sealed_by(records[1]).hex()[:16]}… is missing from the store")
    assert _bad(verify_chain(OBJECT_ID, records, KEYS))[0] == 2


def test_a_seal_with_an_edited_hash_list_is_altered() -> None:
    """Changing the seal's hash list (to cover a forged record) breaks its digest."""
    records, seals = _sealed()
    (digest, real), = seals.items()
    forged = CommitSeal(digest, real.node_id, bytes(32) + real.hashes[32:], real.signature)
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS, seals={digest: forged}))
    assert seq == 2 and "was altered" in reason


def test_a_rehashed_record_is_not_covered_by_its_seal() -> None:
    """An attacker rewrites the last record (hash recomputed) and keeps its seal reference."""
    records, seals = _sealed()
    last = records[-1]
    changed = _reseal(last, body_bytes=b'{"result":1000}', body={"result": 1000})
    changed = changed._replace(signature=last.signature)
    seq, reason = _bad(verify_chain(OBJECT_ID, [*records[:-1], changed], KEYS, seals=seals))
    assert seq == len(records) and "does not cover this record's hash" in reason


def test_a_seal_signed_by_another_key_fails() -> None:
    """A seal over the right hashes, with the right digest, signed with a forger's key."""
    records, seals = _sealed()
    forger = signer("node-a", seed=9)
    (digest, real), = seals.items()
    forged = CommitSeal(digest, real.node_id, real.hashes, forger.sign(digest))
    seq, reason = _bad(verify_chain(OBJECT_ID, records, KEYS, seals={digest: forged}))
    assert seq == 2 and "commit seal's signature does not verify" in reason


def test_a_seal_of_another_node_does_not_vouch() -> None:
    """A record naming node-a cannot borrow a seal node-b made over its hash."""
    records = _records(3)
    other_seal, _ = seal_commit([r._replace(node_id="node-b") for r in records[1:]], OTHER)
    # The hashes are node-a's records' hashes; the seal is node-b's, honestly signed.
    shared = CommitSeal(other_seal.digest, "node-b", other_seal.hashes, other_seal.signature)
    refs = [r._replace(signature=seal_ref(shared.digest)) for r in records[1:]]
    seq, reason = _bad(verify_chain(OBJECT_ID, [records[0], *refs], KEYS,
                                    seals={shared.digest: shared}))
    assert seq == 2 and "made by node 'node-b', not 'node-a'" in reason


def test_sealing_refuses_records_of_another_node() -> None:
    """A node seals only records that name it."""
    records = _records(3)
    with pytest.raises(ValueError, match="not the signer"):
        seal_commit(records, OTHER)


def test_seal_covers_only_whole_hashes() -> None:
    """``covers`` matches 32-byte hashes at their boundaries, not bytes straddling two."""
    a, b = bytes(range(32)), bytes(range(32, 64))
    commit_seal = CommitSeal(b"", "n", a + b, b"")
    assert commit_seal.covers(a) and commit_seal.covers(b)
    assert not commit_seal.covers((a + b)[16:48])


def _unsigned_by_seal(drafts: list[RecordDraft], **where: Any) -> list[Record]:
    out: list[Record] = []
    prev, seq = where.pop("prev_hash"), where.pop("seq")
    for draft in drafts:
        seq += 1
        rec = seal(draft, seq=seq, prev_hash=prev, signer=SIG, sign=False, **where)
        out.append(rec)
        prev = rec.hash
    return out


@given(st.lists(st.sampled_from(list(Kind)), min_size=1, max_size=4),
       st.lists(st.none() | st.integers() | st.text(max_size=6), min_size=4, max_size=4),
       st.integers(min_value=0, max_value=10**6))
@PROFILE
def test_seal_unsigned_gives_what_seal_gives(kinds: list[Kind], values: list[Any],
                                             seq: int) -> None:
    """The event loop's sealing path gives byte for byte the records ``seal`` gives."""
    drafts = [RecordDraft(kind, {"pos": i, "v": values[i % 4]}) for i, kind in enumerate(kinds)]
    where: dict[str, Any] = dict(object_id=OBJECT_ID, seq=seq, prev_hash="ab" * 32,
                                 trace_id="trace-1", ts_us=1_700_000_000_000_000,
                                 policy_ref="default@1")
    quick = seal_unsigned(drafts, node_id=SIG.node_id, **where)
    assert quick == _unsigned_by_seal(drafts, **where)
    assert quick is not None and all(type(r) is Record and r.signature == b"" for r in quick)


def test_seal_unsigned_leaves_strings_that_need_escaping_to_seal() -> None:
    drafts = [RecordDraft(Kind.PROGRESS, {"fields": {}})]
    where: dict[str, Any] = dict(seq=0, prev_hash=GENESIS_HASH, ts_us=1, node_id="node-a",
                                 policy_ref="p")
    assert seal_unsigned(drafts, object_id='a"b', trace_id="t", **where) is None
    assert seal_unsigned(drafts, object_id="a", trace_id="t\n", **where) is None
    assert seal_unsigned(drafts, object_id="a", trace_id="t", **where) is not None
