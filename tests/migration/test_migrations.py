"""SQLite migrations: they yield the checked-in schema, rerun as no-ops, and race safely."""

from __future__ import annotations

import json
import re
import sqlite3
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
from perdure.stores._rows import create_params, record_params
from perdure.stores._sql import load_migrations
from perdure.stores.sqlite import _Q
from tests.stores.builders import NOW, Chain, make_signer

SCHEMA = resources.files("perdure.stores") / "sql" / "sqlite" / "schema.sql"

Snapshot = tuple[int, list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]


def _normalise(sql: str) -> str:
    """One canonical spelling of a statement: no comments, single spaces, none by punctuation."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"\s+", " ", sql).strip()
    return re.sub(r"\s*([(),;])\s*", r"\1", sql)


def _snapshot(conn: sqlite3.Connection) -> Snapshot:
    """``user_version``, normalised ``sqlite_master``, and each table's column and index layout."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    master = sorted(
        (kind, name, table, _normalise(sql) if sql else None)
        for kind, name, table, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
        )
    )
    layout: dict[str, list[tuple[Any, ...]]] = {}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        layout[table] = list(conn.execute(f"PRAGMA table_xinfo('{table}')"))
        for index in conn.execute(f"PRAGMA index_list('{table}')").fetchall():
            layout[f"{table}.{index[1]}"] = [index[2:], *conn.execute(
                f"PRAGMA index_xinfo('{index[1]}')")]
    return version, master, layout


def _file_snapshot(path: Path) -> Snapshot:
    conn = sqlite3.connect(path)
    try:
        return _snapshot(conn)
    finally:
        conn.close()


def _expected() -> Snapshot:
    text = SCHEMA.read_text()
    match = re.search(r"^-- version: (\d+)$", text, re.MULTILINE)
    assert match, "schema.sql must state its version in a '-- version: N' line"
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(text)
        conn.execute(f"PRAGMA user_version={int(match.group(1))}")
        return _snapshot(conn)
    finally:
        conn.close()


def test_migration_files_are_numbered_in_order() -> None:
    """Migrations are ``NNNN_name.sql`` numbered 1, 2, 3 ... without gaps or repeats."""
    migrations = load_migrations("sqlite")
    assert [version for version, _, _ in migrations] == list(range(1, len(migrations) + 1))
    for version, name, _ in migrations:
        assert re.fullmatch(rf"{version:04d}_[a-z0-9_]+\.sql", name), name


def test_migrations_yield_the_checked_in_schema(tmp_path: Path) -> None:
    """Opening an empty file applies every migration and gives exactly ``schema.sql``."""
    path = tmp_path / "fresh.db"
    open_store(f"sqlite:///{path}").close()
    got = _file_snapshot(path)
    expected = _expected()
    assert got[0] == expected[0] == load_migrations("sqlite")[-1][0]
    assert got[1] == expected[1]
    assert got[2] == expected[2]


def test_opening_twice_is_a_no_op(tmp_path: Path) -> None:
    """Reopening a migrated store (also while it is open elsewhere) changes nothing."""
    path = tmp_path / "twice.db"
    url = f"sqlite:///{path}"
    signer = make_signer()
    first = open_store(url)
    first.heartbeat(signer.node_id, public_bytes(signer.private_key), [], [], NOW, NOW + 60)
    chain = Chain("obj-1", signer)
    assert first.create(chain.new_object(), NOW)
    before = _file_snapshot(path)

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
    assert _file_snapshot(path) == before == _expected()


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


def test_concurrent_first_opens_all_succeed(tmp_path: Path) -> None:
    """Several processes opening one fresh file at the same moment all succeed, schema intact."""
    path = tmp_path / "race.db"
    url = f"sqlite:///{path}"
    root = Path(__file__).resolve().parents[2]
    count = 6
    for attempt in range(2):  # two rounds: a fresh file each time
        if path.exists():
            for leftover in tmp_path.glob("race.db*"):
                leftover.unlink()
        start = time.time() + 1.5  # all children are started and imported by then
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, url, str(start), f"node-{attempt}-{k}"],
                cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for k in range(count)
        ]
        outcomes = [child.communicate(timeout=60) for child in children]
        for child, (out, err) in zip(children, outcomes, strict=True):
            assert child.returncode == 0, err
            assert out.strip() == "ok"
        assert _file_snapshot(path) == _expected()
        store = open_store(url)
        try:
            assert sorted(row.object_id for row in store.list()) == sorted(
                f"node-{attempt}-{k}" for k in range(count)
            )
            assert len(store.live_nodes(NOW)) == count
        finally:
            store.close()


def test_records_written_before_version_4_are_kept(tmp_path: Path) -> None:
    """A store at version 3 (records clustered by object) opened by this version: its
    records move to the version 4 table unchanged, in order, still one per seq."""
    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for version, _name, text in load_migrations("sqlite")[:3]:
        for statement in text.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version={version}")
    signer = make_signer()
    chains = [Chain(f"obj-{k}", signer) for k in range(3)]
    rows = []
    for n, chain in enumerate(chains):
        chain.extend(5 + n)
        rows += [record_params(rec) for rec in chain.records]
    conn.execute("BEGIN")
    for chain in chains:
        conn.execute(_Q["insert_object"], create_params(chain.new_object(), NOW, json.dumps))
    conn.executemany(_Q["insert_record"], rows[::-1])  # written in any order
    conn.execute("COMMIT")
    conn.close()

    store = open_store(f"sqlite:///{path}")
    try:
        for chain in chains:
            assert store.records(chain.object_id) == chain.records
            assert store.records(chain.object_id, 3) == chain.records[3:]
    finally:
        store.close()
    assert _file_snapshot(path) == _expected()
    conn = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.IntegrityError):  # still one record per seq
            conn.execute(_Q["insert_record"], rows[0])
    finally:
        conn.close()
