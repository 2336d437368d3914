"""Bytes on disk: how big a store is, for the storage-per-step figures.

SQLite: the database file after a ``wal_checkpoint(TRUNCATE)`` (every committed page
is in the main file, the WAL is empty). PostgreSQL: ``pg_total_relation_size`` (heap,
indexes, TOAST) summed over the tables of the given schemas.
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path


def sqlite_bytes(path: Path) -> int:
    """Size of the SQLite database at ``path`` with its WAL checkpointed into it."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return int(pages * size)


def pg_bytes(url: str, schemas: tuple[str, ...] = ("public",)) -> int:
    """Total size of the tables (with indexes and TOAST) in ``schemas`` of ``url``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname = ANY(%s)",
            (list(schemas),),
        ).fetchone()
    return int(row[0]) if row else 0


def per_step(sizes: dict[int, int]) -> dict[str, float | None]:
    """Bytes per step at each history length, and the marginal bytes per step between them.

    ``sizes`` maps a step count to the store's bytes holding that many steps. The
    marginal figure ``(bytes(b) - bytes(a)) / (b - a)`` leaves out the fixed cost of an
    empty store; it stays flat when storage grows linearly with history.
    """
    out: dict[str, float | None] = {}
    counts = sorted(sizes)
    for n in counts:
        out[f"bytes_per_step_at_{n}"] = sizes[n] / n
    for a, b in itertools.pairwise(counts):
        out[f"marginal_bytes_per_step_{a}_to_{b}"] = (sizes[b] - sizes[a]) / (b - a)
    return out
