"""Step appends: the records a running object adds, on every backend.

Most appends only add a record while the node keeps running the object. The stores
give those a narrower statement that moves only the head when the row already holds
everything the full update would set; these tests pin down that the row ends up
exactly as the full update leaves it, and that anything else takes the full path.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest

from perdure.core.chain import Signer
from perdure.errors import CancelRequestedError, LeaseLostError
from perdure.stores import Store
from perdure.stores._rows import record_params
from perdure.stores.base import Append
from perdure.stores.sqlite import SQLiteStore
from tests.stores.builders import NOW, Chain, sql_only

LEASE = NOW + 30.0


def _claimed(store: Store, signer: Signer, *object_ids: str) -> tuple[list[Chain], list[int]]:
    chains = [Chain(oid, signer) for oid in object_ids]
    for chain in chains:
        assert store.create(chain.new_object(ready_at=NOW), NOW)
    epochs = {c.object_id: c.epoch for c in store.claim("w1", NOW, LEASE, len(object_ids))}
    return chains, [epochs[oid] for oid in object_ids]


def test_step_appends_leave_the_row_as_the_full_update_does(store: Store,
                                                            signer: Signer) -> None:
    """A run of step appends moves the head and ``updated_at`` each time and keeps every
    other field; one with a new ready time (a later claim) changes it too."""
    (chain,), (epoch,) = _claimed(store, signer, "steps")
    for i in range(3):
        assert store.apply([chain.append(epoch, chain.extend(1), ready_at=NOW)],
                           NOW + 1 + i) == [None]
        row = store.get("steps")
        assert row is not None
        assert (row.head_seq, row.head_hash) == (chain.head.seq, chain.head.hash)
        assert (row.status, row.phase, row.ready_at, row.updated_at) == (
            "running", "execution", NOW, NOW + 1 + i)
        assert (row.lease_owner, row.waiting_event, row.note, row.parked) == (
            "w1", None, None, False)
    assert store.apply([chain.append(epoch, chain.extend(2), ready_at=NOW + 9)],
                       NOW + 9) == [None]
    row = store.get("steps")
    assert row is not None
    assert (row.head_seq, row.ready_at, row.updated_at) == (chain.head.seq, NOW + 9, NOW + 9)
    assert store.records("steps") == chain.records


def test_a_step_append_after_a_cancel_request_keeps_the_object_claimable(
        store: Store, signer: Signer) -> None:
    """A cancel asked for while the object runs makes the next step append set the ready
    time to now (the full update's rule), so the cancel is seen when the node lets go.
    Running appends carry the claim time as ready time, which is already past: the
    cancel leaves it as it is, and only the cancel flag tells the two paths apart. The
    append is written and its outcome reports the cancel, so the node stops before its
    next step."""
    (chain,), (epoch,) = _claimed(store, signer, "cancel-me")
    claimed_at = NOW - 5
    assert store.apply([chain.append(epoch, chain.extend(1), ready_at=claimed_at)],
                       NOW) == [None]
    assert store.control("cancel-me", NOW + 1, cancel=True)
    row = store.get("cancel-me")
    assert row is not None and row.ready_at == claimed_at
    [outcome] = store.apply([chain.append(epoch, chain.extend(1), ready_at=claimed_at)],
                            NOW + 2)
    assert isinstance(outcome, CancelRequestedError)
    row = store.get("cancel-me")
    assert row is not None
    assert row.cancel_requested and row.ready_at == NOW + 2
    assert row.head_seq == chain.head.seq


def test_a_record_conflict_refuses_only_its_append(store: Store, signer: Signer,
                                                   place: str) -> None:
    """A record already stored at the seq an append brings (a stray row the head does not
    count) refuses that append alone; the rest of the batch is written."""
    sql_only(place, "the stray record is written with SQL, behind the store's back")
    (good, stray), (good_epoch, stray_epoch) = _claimed(store, signer, "good", "stray")
    squatter = stray.peek(1)[0]
    insert = ("INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, "
              "kind, body, prev_hash, hash, signature) VALUES ({})")
    if place.startswith("sqlite:///"):
        conn = sqlite3.connect(place.removeprefix("sqlite:///"))
        with conn:
            conn.execute(insert.format(", ".join("?" * 11)), record_params(squatter))
        conn.close()
    else:
        import psycopg

        with psycopg.connect(place) as pg:
            pg.execute(insert.format(", ".join(["%s"] * 11)).encode(), record_params(squatter))
    ops: list[Append] = [good.append(good_epoch, good.extend(1)),
                         stray.append(stray_epoch, stray.extend(1)),
                         good.append(good_epoch, good.extend(1))]
    results = store.apply(ops, NOW + 1)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLostError)
    assert store.records("good") == good.records
    row = store.get("stray")
    assert row is not None and row.head_seq == 1 and row.updated_at == NOW


def test_a_batch_of_step_appends_is_judged_append_by_append(store: Store,
                                                            signer: Signer) -> None:
    """Step appends of distinct objects in one batch (the shape of many objects sharing a
    commit) all land, heads and ``updated_at`` moved; when one of them is fenced out,
    only that one is refused and the others still land."""
    chains, epochs = _claimed(store, signer, "a", "b", "c")
    for chain, epoch in zip(chains, epochs, strict=True):
        assert store.apply([chain.append(epoch, chain.extend(1), ready_at=NOW)], NOW) == [None]
    ops = [chain.append(epoch, chain.extend(1), ready_at=NOW)
           for chain, epoch in zip(chains, epochs, strict=True)]
    assert store.apply(ops, NOW + 1) == [None, None, None]
    for chain in chains:
        row = store.get(chain.object_id)
        assert row is not None
        assert (row.head_seq, row.head_hash, row.updated_at) == (
            chain.head.seq, chain.head.hash, NOW + 1)
        assert store.records(chain.object_id) == chain.records

    a, b, c = chains
    stale = b.peek(1)
    results = store.apply([a.append(epochs[0], a.extend(1), ready_at=NOW),
                           b.append(epochs[1] - 1, stale, ready_at=NOW),
                           c.append(epochs[2], c.extend(1), ready_at=NOW)], NOW + 2)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLostError)
    for chain in chains:
        assert store.records(chain.object_id) == chain.records
        row = store.get(chain.object_id)
        assert row is not None and row.head_seq == chain.head.seq


def test_a_batch_mixing_first_and_later_step_appends_lands_whole(store: Store,
                                                                  signer: Signer) -> None:
    """The first step append after a claim finds the row still in the claim's phase, so
    it cannot just move the head; in a batch with later step appends of other objects
    it takes the full update on its own and every append lands, rows as the full update
    leaves them."""
    chains, epochs = _claimed(store, signer, "later-1", "first", "later-2")
    for chain, epoch in zip(chains, epochs, strict=True):
        if chain.object_id != "first":
            assert store.apply([chain.append(epoch, chain.extend(1), ready_at=NOW)],
                               NOW) == [None]
    claimed = store.get("first")
    assert claimed is not None and claimed.phase == "evaluation"
    ops = [chain.append(epoch, chain.extend(2), ready_at=NOW)
           for chain, epoch in zip(chains, epochs, strict=True)]
    assert store.apply(ops, NOW + 1) == [None, None, None]
    for chain in chains:
        row = store.get(chain.object_id)
        assert row is not None
        assert (row.head_seq, row.head_hash, row.phase, row.status, row.updated_at) == (
            chain.head.seq, chain.head.hash, "execution", "running", NOW + 1)
        assert store.records(chain.object_id) == chain.records


def test_apply_now_commits_only_when_it_need_not_wait(store: Store, signer: Signer,
                                                      place: str) -> None:
    """SQLite's ``apply_now`` (what its writer commits with on the event loop) is
    ``apply`` when nobody else is writing. While another process holds the write lock it
    gives ``None`` at once and writes nothing."""
    if not place.startswith("sqlite:///"):
        pytest.skip("SQLite's commit on the caller's thread, and its file lock")
    assert isinstance(store, SQLiteStore)
    (chain,), (epoch,) = _claimed(store, signer, "now")
    op = chain.append(epoch, chain.extend(1), ready_at=NOW)
    assert store.apply_now([op], NOW) == [None]
    assert store.records("now") == chain.records
    other = sqlite3.connect(place.removeprefix("sqlite:///"), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        held = chain.append(epoch, chain.peek(1), ready_at=NOW)
        answers: list[object] = []
        caller = threading.Thread(target=lambda: answers.append(store.apply_now([held],
                                                                                NOW + 1)))
        caller.start()
        # The store's busy timeout is 30 s: a call that waited for the lock could not
        # answer before it is let go, below.
        caller.join(timeout=20)
        answered_while_locked = not caller.is_alive()
        other.execute("ROLLBACK")
        caller.join(timeout=60)
        assert answered_while_locked, "apply_now waited for another process's write lock"
        assert answers == [None]
    finally:
        other.close()
    assert store.records("now") == chain.records
    assert store.apply_now([chain.append(epoch, chain.extend(1), ready_at=NOW)],
                           NOW + 2) == [None]
    assert store.records("now") == chain.records


def test_a_batch_whose_heads_all_move_takes_two_statements(store: Store, signer: Signer,
                                                          place: str) -> None:
    """When every row of a batch of step appends moves, SQLite runs the head update and
    the record insert and nothing else: it counts the rows moved itself (a statement that
    opens with ``WITH`` has no ``rowcount``) rather than reading the heads back."""
    if not place.startswith("sqlite:///"):
        pytest.skip("SQLite's statements; PostgreSQL's rowcount counts any update")
    chains, epochs = _claimed(store, signer, "a", "b", "c")
    for chain, epoch in zip(chains, epochs, strict=True):
        assert store.apply([chain.append(epoch, chain.extend(1), ready_at=NOW)], NOW) == [None]
    ran: list[str] = []
    conn: sqlite3.Connection = store._w  # type: ignore[attr-defined]
    conn.set_trace_callback(ran.append)
    try:
        ops = [chain.append(epoch, chain.extend(1), ready_at=NOW)
               for chain, epoch in zip(chains, epochs, strict=True)]
        assert store.apply(ops, NOW + 1) == [None, None, None]
    finally:
        conn.set_trace_callback(None)
    words = [" ".join(sql.split()[:2]) for sql in ran]
    assert words == ["BEGIN IMMEDIATE", "WITH v", "INSERT INTO", "COMMIT"], ran
    for chain in chains:
        assert store.records(chain.object_id) == chain.records


def test_nothing_is_appended_after_the_terminal_record(store: Store, signer: Signer) -> None:
    """Once an append has made the object terminal, a later append with records is
    refused (nothing written), even under the same epoch and head; a row-only update
    (no records) still goes through."""
    (chain,), (epoch,) = _claimed(store, signer, "ended")
    done = chain.extend(1)
    assert store.apply([chain.append(epoch, done, status="completed", phase="termination",
                                     ready_at=None, release=True)], NOW + 1) == [None]
    [refused] = store.apply([chain.append(epoch, chain.peek(1))], NOW + 2)
    assert isinstance(refused, LeaseLostError)
    assert store.records("ended") == chain.records
    assert store.apply([chain.append(epoch, [], status="completed", phase="termination",
                                     ready_at=None, release=True)], NOW + 3) == [None]
