"""PostgreSQL-only store behaviour the protocol-level contract cannot show.

Claims skip rows another transaction has locked instead of waiting for it, and
lease expiry is decided by the database clock, not by the ``now`` a node passes.
A group commit that hits a record row it did not expect refuses only that append,
and it wakes idle nodes (``NOTIFY``) for exactly the objects it makes runnable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from perdure.errors import LeaseLostError
from perdure.stores import Claim, Store, open_store
from tests.pg import fresh_database, needs_server
from tests.stores.builders import Chain, make_signer

pytestmark = needs_server


@pytest.fixture
def pg() -> Iterator[tuple[str, Store]]:
    """A private migrated database: its URL and a store open on it."""
    with fresh_database() as url:
        store = open_store(url)
        try:
            yield url, store
        finally:
            store.close()


def _fill(store: Store, count: int) -> list[str]:
    signer = make_signer("node-a")
    base = time.time() - 60
    ids = [f"obj-{index:02d}" for index in range(count)]
    for index, object_id in enumerate(ids):
        chain = Chain(object_id, signer)
        assert store.create(chain.new_object(ready_at=base + index), time.time())
    return ids


def test_claim_skips_rows_locked_by_another_transaction(pg: tuple[str, Store]) -> None:
    """While another transaction holds row locks on half the ready objects, a claim
    returns the other half at once instead of waiting; afterwards the rest is claimable."""
    import psycopg

    url, store = pg
    ids = _fill(store, 10)
    locked, free = ids[:5], ids[5:]
    with psycopg.connect(url) as conn:  # a transaction stays open until the block ends
        rows = conn.execute(
            "SELECT object_id FROM objects WHERE object_id = ANY(%s) FOR UPDATE", (locked,)
        ).fetchall()
        assert len(rows) == len(locked)
        result: list[Claim] = []
        took: list[float] = []

        def claim() -> None:
            began = time.monotonic()
            now = time.time()
            result.extend(store.claim("w1", now, now + 30, len(ids)))
            took.append(time.monotonic() - began)

        thread = threading.Thread(target=claim)
        thread.start()
        thread.join(timeout=3)
        assert not thread.is_alive(), "the claim waited on the other transaction's locks"
        assert sorted(c.object_id for c in result) == free
        assert took[0] < 1.0, took
        conn.rollback()
    now = time.time()
    assert sorted(c.object_id for c in store.claim("w2", now, now + 30, len(ids))) == locked


def test_lease_expiry_follows_the_database_clock(pg: tuple[str, Store]) -> None:
    """A node whose clock runs an hour ahead cannot take over a live lease, and sees it
    as held; the lease expiry is the database's time plus the lease length."""
    import psycopg

    url, store = pg
    (object_id,) = _fill(store, 1)
    now = time.time()
    (claim,) = store.claim("node-a/1", now, now + 30, 1)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    assert claim.lease_expires == pytest.approx(row[0] + 30, abs=1.0)
    ahead = time.time() + 3600
    assert store.claim("node-b/1", ahead, ahead + 30, 1) == []
    assert store.leases_held("node-a/", ahead) == [(object_id, "node-a/1", claim.epoch)]
    behind = time.time() - 3600  # ended at the database's now, whatever the node's clock
    assert store.expire_lease(object_id, "node-a/1", claim.epoch, behind)
    now = time.time()
    assert [c.epoch for c in store.claim("node-b/1", now, now + 30, 1)] == [claim.epoch + 1]


def test_a_duplicate_record_refuses_only_its_append(pg: tuple[str, Store]) -> None:
    """A record row already there (which aborts the batch's transaction) refuses only the
    append that collides with it: the batch is retried append by append, with or without
    an event consumer among the appends."""
    import psycopg

    from perdure.stores._rows import record_params

    url, store = pg
    signer = make_signer("node-a")
    now = time.time()
    chains = {oid: Chain(oid, signer) for oid in ("a", "dup", "c", "eater")}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=now - 1), now)
    store.send("eater", "go", b"1", None, now)
    (event,) = store.pending_events("eater")
    epochs = {c.object_id: c.epoch for c in store.claim("w1", now, now + 30, 10)}
    dup = chains["dup"]
    (taken,) = dup.peek(1)
    with psycopg.connect(url, autocommit=True) as conn:  # a row the store does not expect
        conn.execute(
            "INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, "
            "body, prev_hash, hash, signature) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s)", record_params(taken))
    a, c, eater = chains["a"], chains["c"], chains["eater"]

    results = store.apply([a.append(epochs["a"], a.extend()),
                           dup.append(epochs["dup"], [taken]),
                           c.append(epochs["c"], c.extend())], now)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLostError)
    results = store.apply([a.append(epochs["a"], a.extend()),
                           eater.append(epochs["eater"], eater.extend(),
                                        consume_event_ids=(event.event_id,)),
                           dup.append(epochs["dup"], [taken])], now)
    assert results[0] is None and results[1] is None
    assert isinstance(results[2], LeaseLostError)
    for chain in (a, c, eater):
        assert store.records(chain.object_id) == chain.records
    assert store.pending_events("eater") == []
    row = store.get("dup")
    assert row is not None and row.head_seq == 1


def test_a_batch_notifies_the_objects_it_makes_runnable(pg: tuple[str, Store]) -> None:
    """Idle nodes hear of an object let go runnable now and of an object signalled, and
    of nothing else: not a later timer, not a held object, not a refused append."""
    from perdure.stores.base import Signal

    _url, store = pg
    signer = make_signer("node-a")
    now = time.time()
    names = ("now", "later", "held", "stale", "child", "parent")
    chains = {oid: Chain(oid, signer) for oid in names}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=now - 1), now)
    epochs = {c.object_id: c.epoch for c in store.claim("w1", now, now + 30, 10)}
    parent = chains["parent"]
    assert store.apply([parent.append(epochs["parent"], parent.extend(), status="dormant",
                                      phase="dormancy", ready_at=None, waiting_event="done",
                                      release=True)], now) == [None]
    heard: list[str] = []
    listening = threading.Event()

    def hear(object_id: str) -> None:
        if object_id:
            heard.append(object_id)
        listening.set()

    stop = store.subscribe(hear)
    assert stop is not None
    try:
        assert listening.wait(5)
        c = chains
        results = store.apply([
            c["now"].append(epochs["now"], c["now"].extend(), ready_at=now, release=True),
            c["later"].append(epochs["later"], c["later"].extend(), ready_at=now + 60,
                              release=True),
            c["held"].append(epochs["held"], c["held"].extend(), ready_at=now),
            c["stale"].append(epochs["stale"] - 1, c["stale"].peek(1), ready_at=now,
                              release=True),
            c["child"].append(epochs["child"], c["child"].extend(), status="completed",
                              phase="termination", ready_at=None, release=True,
                              signal=Signal("parent", "done", b"null", "child-done")),
        ], now)
        assert [r is None for r in results] == [True, True, True, False, True]
        deadline = time.monotonic() + 5
        while set(heard) != {"now", "parent"} and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # anything else would have arrived by now
    finally:
        stop()
    assert sorted(heard) == ["now", "parent"]


def test_a_chain_streamed_in_chunks_reads_whole_and_a_damaged_one_leaves_the_pool_usable(
        pg: tuple[str, Store]) -> None:
    """A claim streams a long chain in chunks: every record arrives, in order. When the
    pass gives up early on damage (the rest of the stream cancelled), the full read
    names the record, and the store's connections serve the next reads as before."""
    import psycopg

    from perdure.errors import IntegrityError

    url, store = pg
    signer = make_signer("node-a")
    now = time.time()
    length = 2_600  # more than two chunks
    chains = {oid: Chain(oid, signer) for oid in ("long", "damaged")}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=now - 1), now)
    epochs = {c.object_id: c.epoch for c in store.claim("w1", now, now + 30, 10)}
    for oid, chain in chains.items():
        assert store.apply([chain.append(epochs[oid], chain.extend(length - 1))], now) == [None]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE records SET body = convert_to('{\"n\":-1}', 'UTF8') "
                     "WHERE object_id = 'damaged' AND seq = 7")
    assert store.chain("long") == chains["long"].records
    for _ in range(3):  # more times than the pool has connections in use
        with pytest.raises(IntegrityError) as info:
            store.chain("damaged")
        assert info.value.seq == 7
        got = store.chain("long", 2_000, chains["long"].records[1_999].hash)
        assert got == chains["long"].records[2_000:]


def test_a_chain_read_without_chunked_rows_gives_the_same_records(
        pg: tuple[str, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """With a libpq older than 17 (no chunked rows mode) the claim read takes the whole
    result at once; the records and the checks are the same."""
    from perdure.errors import IntegrityError
    from perdure.stores import postgres

    _, store = pg
    signer = make_signer("node-a")
    now = time.time()
    chain = Chain("obj", signer)
    assert store.create(chain.new_object(ready_at=now - 1), now)
    (claim,) = store.claim("w1", now, now + 30, 1)
    assert store.apply([chain.append(claim.epoch, chain.extend(30))], now) == [None]
    monkeypatch.setattr(postgres, "_CHAIN_CHUNK", 0)
    assert store.chain("obj") == chain.records
    assert store.chain("obj", 20, chain.records[19].hash) == chain.records[20:]
    with pytest.raises(IntegrityError):
        store.chain("obj", 20, chain.records[18].hash)
