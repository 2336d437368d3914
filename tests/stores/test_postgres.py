"""PostgreSQL-only store behaviour the protocol-level contract cannot show.

Claims skip rows another transaction has locked instead of waiting for it, and
lease expiry is decided by the database clock, not by the ``now`` a node passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from perdure._keys import public_bytes
from perdure.stores import Claim, Store, open_store
from tests.pg import BACKENDS, fresh_database
from tests.stores.builders import Chain, make_signer

pytestmark = pytest.mark.skipif(
    "postgresql" not in BACKENDS, reason="PERDURE_TEST_BACKENDS leaves out postgresql"
)


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
    store.register_node("node-a", public_bytes(signer.private_key), time.time())
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
