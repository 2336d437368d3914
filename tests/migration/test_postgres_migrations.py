"""PostgreSQL migrations: they yield the checked-in schema, rerun as no-ops, and race safely.

Schemas are compared through the catalog, normalised: every column's table, position,
name, type, nullability and default (``information_schema.columns``), every index's
definition (``pg_indexes``), the named constraints and the sequences.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from perdure.keys.folder import public_bytes
from perdure.stores import open_store
from perdure.stores._sql import load_migrations
from tests.pg import fresh_database, needs_server
from tests.stores.builders import NOW, Chain, make_signer

pytestmark = needs_server

SCHEMA = resources.files("perdure.stores") / "sql" / "postgres" / "schema.sql"

Catalog = dict[str, list[tuple[Any, ...]]]


def _catalog(url: str) -> Catalog:
    """The normalised layout of the ``public`` schema of the database at ``url``."""
    import psycopg

    queries = {
        "columns": """
            SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
                   column_default
            FROM information_schema.columns WHERE table_schema = 'public'
            ORDER BY table_name, ordinal_position""",
        "indexes": """
            SELECT tablename, indexname, indexdef FROM pg_indexes
            WHERE schemaname = 'public' ORDER BY tablename, indexname""",
        "constraints": """
            SELECT c.table_name, c.constraint_name, c.constraint_type,
                   string_agg(k.column_name, ',' ORDER BY k.ordinal_position)
            FROM information_schema.table_constraints c
            LEFT JOIN information_schema.key_column_usage k
              ON k.constraint_name = c.constraint_name AND k.table_schema = c.table_schema
            WHERE c.table_schema = 'public' AND c.constraint_type <> 'CHECK'
            GROUP BY c.table_name, c.constraint_name, c.constraint_type
            ORDER BY c.table_name, c.constraint_name""",
        "sequences": """
            SELECT sequence_name, data_type, start_value, increment
            FROM information_schema.sequences WHERE sequence_schema = 'public'
            ORDER BY sequence_name""",
        "tables": """
            SELECT table_name, table_type FROM information_schema.tables
            WHERE table_schema = 'public' ORDER BY table_name""",
    }
    with psycopg.connect(url) as conn:
        return {name: [tuple(row) for row in conn.execute(sql.encode()).fetchall()]
                for name, sql in queries.items()}


def _applied(url: str) -> list[tuple[int, str]]:
    """The rows of ``perdure_migrations``: ``(version, name)`` in order."""
    import psycopg

    with psycopg.connect(url) as conn:
        return [(int(row[0]), str(row[1])) for row in conn.execute(
            "SELECT version, name FROM perdure_migrations ORDER BY version").fetchall()]


def _expected() -> tuple[int, Catalog]:
    """The version ``schema.sql`` states and the catalog of an empty database given it."""
    import psycopg

    text = SCHEMA.read_text()
    match = re.search(r"^-- version: (\d+)$", text, re.MULTILINE)
    assert match, "schema.sql must state its version in a '-- version: N' line"
    with fresh_database(migrated=False) as url:
        with psycopg.connect(url) as conn:
            conn.execute(text.encode())
        return int(match.group(1)), _catalog(url)


@pytest.fixture(scope="module")
def expected() -> tuple[int, Catalog]:
    """``schema.sql``'s version and catalog, built once for this module."""
    return _expected()


def test_migration_files_are_numbered_in_order() -> None:
    """Migrations are ``NNNN_name.sql`` numbered 1, 2, 3 ... without gaps or repeats."""
    migrations = load_migrations("postgres")
    assert [version for version, _, _ in migrations] == list(range(1, len(migrations) + 1))
    for version, name, _ in migrations:
        assert re.fullmatch(rf"{version:04d}_[a-z0-9_]+\.sql", name), name


def test_migrations_yield_the_checked_in_schema(expected: tuple[int, Catalog]) -> None:
    """Opening an empty database applies every migration, records each one, and gives
    exactly the tables, columns, indexes and constraints of ``schema.sql``."""
    version, catalog = expected
    migrations = load_migrations("postgres")
    assert version == migrations[-1][0]
    assert {"objects", "records", "inbox", "nodes", "perdure_migrations"} <= {
        table for table, _ in catalog["tables"]}
    with fresh_database(migrated=False) as url:
        assert _catalog(url)["tables"] == []
        open_store(url).close()
        got = _catalog(url)
        assert _applied(url) == [(v, name) for v, name, _ in migrations]
    for part in catalog:
        assert got[part] == catalog[part], part


def test_opening_twice_is_a_no_op(expected: tuple[int, Catalog]) -> None:
    """Reopening a migrated database (also while it is open elsewhere) adds no
    ``perdure_migrations`` row, changes no schema and keeps the data."""
    signer = make_signer()
    with fresh_database(migrated=False) as url:
        first = open_store(url)
        first.heartbeat(signer.node_id, public_bytes(signer.private_key), [], [], NOW,
                        NOW + 60)
        chain = Chain("obj-1", signer)
        assert first.create(chain.new_object(), NOW)
        applied = _applied(url)
        before = _catalog(url)

        second = open_store(url)  # while the first is still open
        assert second.records("obj-1") == chain.records
        second.close()
        first.close()
        third = open_store(url)
        try:
            assert third.records("obj-1") == chain.records
            assert [n.node_id for n in third.live_nodes(NOW)] == [signer.node_id]
        finally:
            third.close()
        assert _applied(url) == applied == [(v, n) for v, n, _ in load_migrations("postgres")]
        assert _catalog(url) == before == expected[1]


CHILD = textwrap.dedent(
    """
    import sys, time
    from perdure.stores import open_store
    from tests.stores.builders import NOW, Chain, make_signer
    from perdure.keys.folder import public_bytes

    url, start, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    time.sleep(max(0.0, start - time.time()))
    store = open_store(url)
    signer = make_signer(name)
    store.heartbeat(name, public_bytes(signer.private_key), [], [], NOW, NOW + 60)
    assert store.create(Chain(name, signer).new_object(), NOW)
    store.close()
    print("ok")
    """
)


def test_concurrent_first_opens_all_succeed(expected: tuple[int, Catalog]) -> None:
    """Several processes opening one fresh, unmigrated database at the same moment all
    succeed; each migration is applied once and the schema is exactly ``schema.sql``."""
    root = Path(__file__).resolve().parents[2]
    count = 5
    with fresh_database(migrated=False) as url:
        start = time.time() + 1.5  # all children are started and imported by then
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, url, str(start), f"node-{k}"],
                cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for k in range(count)
        ]
        outcomes = [child.communicate(timeout=60) for child in children]
        for child, (out, err) in zip(children, outcomes, strict=True):
            assert child.returncode == 0, err
            assert out.strip() == "ok"
        assert _applied(url) == [(v, n) for v, n, _ in load_migrations("postgres")]
        assert _catalog(url) == expected[1]
        store = open_store(url)
        try:
            assert sorted(row.object_id for row in store.list()) == [
                f"node-{k}" for k in range(count)]
            assert len(store.live_nodes(NOW)) == count
        finally:
            store.close()
