"""What a node asks while idle or claiming does not grow with the objects that sleep.

A store gets a few real objects through its own API: one sleeping on a timer, one
waiting for an event, one paused while ready, one running under a lease. Then their rows
are copied thousands of times with fresh ids (plain SQL), as a store holding many dormant
objects would look. Each query a worker issues while idle or claiming (the claim, the next
due time, renewals, control flags, its own leases, an object's row, memory and inbox) must
do the same work with the copies as without them:

* SQLite: the same number of virtual-machine instructions (counted with a progress
  handler called at every one), and a plan that searches an index, never a ``SCAN`` of
  the objects table;
* PostgreSQL: no more ``objects`` rows read (returned or filtered out, from
  ``EXPLAIN ANALYZE``) than the four real objects, and no sequential scan of the
  table, planned by the server as it would plan them for a node (statistics up to
  date, nothing forced).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perdure.stores import Store, open_store
from perdure.stores.sqlite import _Q as SQLITE_Q
from tests.pg import fresh_database, needs_server
from tests.stores.builders import Chain, make_signer

#: Copies of each sleeping row: enough that a scan of them costs far more than a search.
COPIES = 3000
SLEEPERS = ("timer", "event", "paused")


def _seed(store: Store) -> float:
    """The four real objects (timer, event wait, paused, running); the time used."""
    signer = make_signer("node-a")
    now = time.time()
    chains = {oid: Chain(oid, signer) for oid in ("timer", "event", "running")}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=now - 1), now)
    claims = {c.object_id: c for c in store.claim("node-a/1", now, now + 600, 10)}
    assert set(claims) == set(chains)
    for oid, ready_at, event in (("timer", now + 1e6, None), ("event", None, "e")):
        chain = chains[oid]
        op = chain.append(claims[oid].epoch, chain.extend(), status="dormant",
                          phase="dormancy", ready_at=ready_at, waiting_event=event,
                          release=True)
        assert store.apply([op], now) == [None]
    paused = Chain("paused", signer)
    assert store.create(paused.new_object(ready_at=now - 1), now)
    store.control("paused", now, paused=True)
    return now


def _copy_sql(columns: list[str], fresh_id: str, numbers: str) -> str:
    """``INSERT ... SELECT``: the sleeping rows again, once per number, with fresh ids."""
    picked = ", ".join(fresh_id if c == "object_id" else c for c in columns)
    sleepers = ", ".join(f"'{oid}'" for oid in SLEEPERS)
    return (f"INSERT INTO objects ({', '.join(columns)}) SELECT {picked} "
            f"FROM objects, {numbers} WHERE object_id IN ({sleepers})")


# -- SQLite ----------------------------------------------------------------------------


def _sqlite_queries(now: float) -> dict[str, tuple[str, Any]]:
    serves = json.dumps(["agent@1"])
    candidates = {"now": now, "limit": 16, "serves": serves, "caps": "[]", "node": "node-a"}
    return {
        "claim_candidates": (SQLITE_Q["claim_candidates"], candidates),
        "claim_candidates, any agent": (SQLITE_Q["claim_candidates"],
                                        {**candidates, "serves": None}),
        "claim_one": (SQLITE_Q["claim_one"], {"owner": "node-a/2", "now": now,
                                              "lease_until": now + 30, "object_id": "timer"}),
        "next_ready_at": (SQLITE_Q["next_ready_at"], {}),
        "renew": (SQLITE_Q["renew"], {"lease_until": now + 30, "object_id": "running",
                                      "epoch": 1}),
        "control_flags": (SQLITE_Q["control_flags"].format(marks="?"), ("running",)),
        "leases_held": (SQLITE_Q["leases_held"], {"prefix": "node-a/%", "now": now}),
        "expire_lease": (SQLITE_Q["expire_lease"], {"now": now, "object_id": "running",
                                                    "epoch": -1, "owner": "node-a/9"}),
        "get_object": (SQLITE_Q["get_object"], ("running",)),
        "chain_after": (SQLITE_Q["chain_after"], ("running", 0)),
        "pending_events": (SQLITE_Q["pending_events"], ("running",)),
    }


def _sqlite_work(path: Path, now: float) -> dict[str, tuple[int, list[str]]]:
    """Each query's instruction count and plan, run in a transaction rolled back."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        found = {}
        for name, (sql, params) in _sqlite_queries(now).items():
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            conn.execute("BEGIN")
            steps[0] = 0
            conn.set_progress_handler(count, 1)
            try:
                conn.execute(sql, params).fetchall()
            finally:
                conn.set_progress_handler(None, 1)
                conn.execute("ROLLBACK")
            found[name] = (steps[0], plan)
        return found
    finally:
        conn.close()


def _sqlite_fill(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(objects)")]
        numbers = (f"(WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k "
                   f"WHERE n < {COPIES}) SELECT n FROM k)")
        conn.execute(_copy_sql(columns, "object_id || '~' || n", numbers))
        conn.execute("ANALYZE")
    finally:
        conn.close()


def test_sqlite_idle_and_claim_queries_do_not_grow_with_dormant_objects(
        tmp_path: Path) -> None:
    path = tmp_path / "dormant.db"
    store = open_store(f"sqlite:///{path}")
    try:
        now = _seed(store)
    finally:
        store.close()
    before = _sqlite_work(path, now)
    _sqlite_fill(path)
    after = _sqlite_work(path, now)
    for name, (steps, plan) in after.items():
        tables = [line for line in plan if line.startswith(("SEARCH", "SCAN"))
                  and "VIRTUAL TABLE" not in line]  # json_each over a parameter
        assert tables, (name, plan)
        for line in tables:
            # A search of an index, or a walk of the leases' partial index (held objects).
            assert line.startswith("SEARCH") or "INDEX objects_lease_owner" in line, (
                name, plan)
        assert steps == before[name][0], (name, before[name][0], steps, plan)
    assert any("objects_due" in line for line in after["next_ready_at"][1])
    assert any("objects_ready" in line for line in after["claim_candidates"][1])


# -- PostgreSQL --------------------------------------------------------------------------


def _pg_queries(now: float) -> dict[str, tuple[bytes, Any]]:
    from perdure.stores._postgres_db import Q

    return {
        "claim": (Q["claim"], {"now": now, "limit": 16, "serves": ["agent@1"], "caps": [],
                               "node": "node-a", "owner": "node-a/2", "lease": 30.0}),
        "claim, any agent": (Q["claim"], {"now": now, "limit": 16, "serves": None,
                                          "caps": [], "node": "node-a",
                                          "owner": "node-a/2", "lease": 30.0}),
        "next_ready_at": (Q["next_ready_at"], None),
        "renew": (Q["renew"], {"lease": 30.0, "object_id": "running", "epoch": 1}),
        "control_flags": (Q["control_flags"], (["running"],)),
        "leases_held": (Q["leases_held"], {"prefix": "node-a/%"}),
        "expire_lease": (Q["expire_lease"], {"now": now, "object_id": "running",
                                             "epoch": -1, "owner": "node-a/9"}),
        "get_object": (Q["get_object"], ("running",)),
        "chain_after": (Q["chain_after"], ("running", 0)),
        "pending_events": (Q["pending_events"], ("running",)),
    }


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


def _pg_work(url: str, now: float) -> dict[str, tuple[int, list[str]]]:
    """Each query's objects rows read and plan node types, run in a transaction rolled
    back."""
    import psycopg

    found = {}
    with psycopg.connect(url) as conn:
        for name, (sql, params) in _pg_queries(now).items():
            try:
                (doc,) = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + sql,
                                      params).fetchone() or (None,)
            finally:
                conn.rollback()
            rows = 0
            kinds = []
            for node in _plan_nodes(doc[0]["Plan"]):
                index = str(node.get("Index Name", ""))
                if node.get("Relation Name") != "objects" and not index.startswith("objects"):
                    continue
                kinds.append(f"{node['Node Type']} {index}".strip())
                if node.get("Relation Name") != "objects":
                    continue  # a bitmap index scan: its heap scan counts the rows
                rows += int(node["Actual Rows"]) * int(node["Actual Loops"])
                rows += int(node.get("Rows Removed by Filter", 0))
                rows += int(node.get("Rows Removed by Index Recheck", 0))
            found[name] = (rows, kinds)
    return found


@needs_server
def test_postgres_idle_and_claim_queries_do_not_grow_with_dormant_objects() -> None:
    import psycopg

    with fresh_database() as url:
        store = open_store(url)
        try:
            now = _seed(store)
        finally:
            store.close()
        before = _pg_work(url, now)
        with psycopg.connect(url, autocommit=True) as conn:
            columns = [row[0] for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'objects' ORDER BY ordinal_position")]
            conn.execute(_copy_sql(columns, "object_id || '~' || n",
                                   f"generate_series(1, {COPIES}) AS n").encode())
            conn.execute("ANALYZE objects")
        after = _pg_work(url, now)
    for name, (rows, kinds) in after.items():
        assert not any(kind.startswith("Seq Scan") for kind in kinds), (name, kinds)
        # Of the rows read, none is one of the copies: at most the four seeded.
        assert rows <= 4, (name, before[name][0], rows, kinds)
    assert any("objects_due" in kind for kind in after["next_ready_at"][1])
    assert any("objects_ready" in kind for kind in after["claim"][1])
