"""``chain_from_rows``: the claim-time read decodes and checks a chain in one pass.

It must give exactly the records ``record_from_columns`` and ``check_links`` give for an
intact chain, and decline (``None``) anything else, so that the slow path names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.chain import chain_from_rows, check_links, seal
from perdure.core.records import GENESIS_HASH, Kind, Record, RecordDraft, has_long_digits
from perdure.errors import IntegrityError
from perdure.stores._rows import checked_chain
from tests.unit.builders import OBJECT_ID, PROFILE, chain, signer

SIG = signer("node-a", seed=1)

Row = tuple[Any, ...]


def _row(rec: Record) -> Row:
    """A record as the compact claim-time row the stores select."""
    names = orjson.dumps([rec.trace_id, rec.node_id, rec.policy_ref, rec.kind]).decode()
    return (rec.seq, rec.ts_us, names, rec.body_bytes, bytes.fromhex(rec.prev_hash),
            bytes.fromhex(rec.hash), rec.signature)


def _checked(rows: list[Row], full: Callable[[], list[Record]]) -> list[Record]:
    """What a store's ``chain`` does with compact rows and its full read."""
    return checked_chain(OBJECT_ID, chain_from_rows(OBJECT_ID, rows), 0, "0" * 64, full)


def _records(n: int = 6, result: Any = None) -> list[Record]:
    return chain([(Kind.STEP_DONE, {"pos": i, "cmd": "step", "name": f"s{i}",
                                    "result": i if result is None else result})
                  for i in range(n - 1)], sig=SIG)


def test_intact_chain_gives_the_records() -> None:
    """Every field equals the record as sealed, the body decoded the same."""
    records = _records()
    got = chain_from_rows(OBJECT_ID, [_row(r) for r in records])
    assert got == records
    assert got is not None and all(type(r) is Record for r in got)


def test_tail_starts_from_the_hash_it_follows() -> None:
    records = _records()
    tail = [_row(r) for r in records[3:]]
    assert chain_from_rows(OBJECT_ID, tail, start_hash=records[2].hash,
                           start_seq=4) == records[3:]
    assert chain_from_rows(OBJECT_ID, tail, start_hash=records[1].hash, start_seq=4) is None
    assert chain_from_rows(OBJECT_ID, tail, start_hash=records[2].hash, start_seq=3) is None
    assert chain_from_rows(OBJECT_ID, [], start_hash="not hex", start_seq=1) is None


def _set(row: Row, at: int, value: Any) -> Row:
    return (*row[:at], value, *row[at + 1:])


DAMAGE: dict[str, Callable[[list[Row]], object]] = {
    "gap": lambda rows: rows.pop(2),
    "swapped": lambda rows: rows.insert(1, rows.pop(2)),
    "edited body": lambda rows: rows.__setitem__(
        2, _set(rows[2], 3, rows[2][3].replace(b'"s1"', b'"s9"'))),
    "edited prev_hash column": lambda rows: rows.__setitem__(2, _set(rows[2], 4, b"\1" * 32)),
    "edited hash column": lambda rows: rows.__setitem__(2, _set(rows[2], 5, b"\1" * 32)),
    "edited ts": lambda rows: rows.__setitem__(2, _set(rows[2], 1, rows[2][1] + 1)),
    "edited names": lambda rows: rows.__setitem__(
        2, _set(rows[2], 2, rows[2][2].replace("node-a", "node-b"))),
    "body as text": lambda rows: rows.__setitem__(2, _set(rows[2], 3, rows[2][3].decode())),
    "seq as text": lambda rows: rows.__setitem__(2, _set(rows[2], 0, "3")),
    "signature missing": lambda rows: rows.__setitem__(2, _set(rows[2], 6, None)),
    "names not an array": lambda rows: rows.__setitem__(2, _set(rows[2], 2, '{"a":1}')),
    "names hold a number": lambda rows: rows.__setitem__(
        2, _set(rows[2], 2, '["trace-1",5,"default@test","step_done"]')),
    "unknown kind": lambda rows: rows.__setitem__(
        2, _set(rows[2], 2, rows[2][2].replace("step_done", "made_up"))),
    "names not JSON": lambda rows: rows.__setitem__(2, _set(rows[2], 2, "[")),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_declined(damage: str) -> None:
    """Anything out of the ordinary gives ``None``, so the full read decides."""
    records = _records()
    rows = [_row(r) for r in records]
    DAMAGE[damage](rows)
    assert chain_from_rows(OBJECT_ID, rows) is None


def test_slow_path_names_what_is_wrong() -> None:
    """When the compact rows are declined, the full records go through ``check_links``."""
    records = _records()
    broken = [*records[:2], *records[3:]]
    with pytest.raises(IntegrityError) as info:
        _checked([_row(r) for r in broken], lambda: broken)
    assert info.value.seq == 3 and "sequence gap" in info.value.reason


@pytest.mark.parametrize("unusual", ['he said "hi"', "tab\there", 2**70, -(2**66)])
def test_unusual_but_intact_values_read_exactly(unusual: Any) -> None:
    """A result the fast parser would read differently (an integer beyond 64 bits) is
    parsed again exactly by the one-pass read, which gives what the full read gives;
    strings that need escaping in a body are parsed as they are."""
    records = chain([(Kind.STEP_DONE, {"pos": 0, "cmd": "step", "name": str(unusual),
                                       "result": unusual})], sig=SIG)
    rows = [_row(r) for r in records]
    got = _checked(rows, lambda: records)
    assert got == records and got[1].body["result"] == unusual
    assert type(got[1].body["result"]) is type(unusual)


@pytest.mark.parametrize("at", [0, 3, 7])
def test_a_long_integer_anywhere_in_the_chain_is_read_exactly(at: int) -> None:
    """The 19-digit look covers every body of the chain, not only the last: the body
    holding one is parsed again exactly (an int, not a float); 18 digits in every body
    are read by the fast parser as they are."""
    near = 10**17 + 1  # 18 digits
    steps = [(Kind.STEP_DONE, {"pos": i, "cmd": "step", "name": "s",
                               "result": 2**70 if i == at else near}) for i in range(8)]
    records = chain(steps, sig=SIG)
    rows = [_row(r) for r in records]
    got = chain_from_rows(OBJECT_ID, rows)
    assert got == records and got is not None and got[at + 1].body["result"] == 2**70
    assert type(got[at + 1].body["result"]) is int
    assert _checked(rows, lambda: records) == records
    plain = chain([(kind, {**body, "result": near}) for kind, body in steps], sig=SIG)
    got = chain_from_rows(OBJECT_ID, [_row(r) for r in plain])
    assert got == plain and got is not None and got[at + 1].body["result"] == near


def test_trace_that_needs_escaping_takes_the_full_read() -> None:
    """An intact chain whose trace id holds a quote: the one-pass read declines it (its
    header would need escaping) and the full read accepts it as it is."""
    records: list[Record] = []
    prev = GENESIS_HASH
    for seq, kind in enumerate([Kind.INSTANTIATED, Kind.PROGRESS], start=1):
        rec = seal(RecordDraft(kind, {"n": seq}), object_id=OBJECT_ID, seq=seq, prev_hash=prev,
                   trace_id='t"1', ts_us=seq, policy_ref="p", signer=SIG)
        records.append(rec)
        prev = rec.hash
    check_links(OBJECT_ID, records)
    rows = [_row(r) for r in records]
    assert chain_from_rows(OBJECT_ID, rows) is None
    assert _checked(rows, lambda: records) == records


@given(st.binary(max_size=200))
@PROFILE
def test_long_digit_check_matches_a_regex(body: bytes) -> None:
    import re

    assert has_long_digits(body) == (re.search(rb"[0-9]{19}", body) is not None)
    padded = b"x" + b"7" * 19 + body
    assert has_long_digits(padded)


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8))
@PROFILE
def test_any_result_decodes_as_the_records_do(result: Any) -> None:
    """Whatever a step returned, the one-pass read gives the same records as the full
    read and the links check (declining only what the slow path then accepts)."""
    records = _records(3, result=result)
    check_links(OBJECT_ID, records)
    rows = [_row(r) for r in records]
    got = chain_from_rows(OBJECT_ID, rows)
    assert got is None or got == records
    assert _checked(rows, lambda: records) == records


def test_digits_inside_a_string_keep_the_one_pass_read() -> None:
    """A hex trace id (or any string) with a run of 19 decimal digits is no reason to
    leave the one-pass read: the body is parsed again exactly and the pass goes on."""
    draft = RecordDraft(Kind.INSTANTIATED, {"context": {"trace_id": "a" + "7" * 25}})
    records = chain([(Kind.PROGRESS, {"n": 1})], sig=SIG, first=draft)
    got = chain_from_rows(OBJECT_ID, [_row(r) for r in records])
    assert got == records
