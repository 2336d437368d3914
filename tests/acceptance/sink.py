"""An idempotent, fenced side-effect target on its own SQLite file (test code).

Steps of the acceptance agents deliver their effects here, the way a careful
external service would accept them:

- ``effects(key PRIMARY KEY, ...)``: written with ``INSERT ... ON CONFLICT DO
  NOTHING`` keyed by the step's idempotency key, so a re-executed step lands once;
- ``fence(object_id PRIMARY KEY, max_epoch)``: the highest fencing epoch seen per
  object; a write carrying a lower epoch is refused (``StaleEpochError``) and
  logged in ``refusals``;
- ``executions``: one row per step execution attempt, opened before the step body
  runs and closed (``finished_at``) when it is done, so a test can count
  executions and the ones a crash interrupted;
- ``deliveries``: one row per write attempt with what happened to it
  (``inserted``, ``duplicate`` or ``refused``).

Every call opens its own connection: worker processes are killed with SIGKILL at
any instant, and SQLite's WAL keeps each committed transaction intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Execution", "Sink", "StaleEpochError"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY,
    object_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    value TEXT NOT NULL,
    pid INTEGER NOT NULL,
    written_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fence (
    object_id TEXT PRIMARY KEY,
    max_epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    object_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    object_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    max_epoch INTEGER,
    at REAL NOT NULL
);
"""


class StaleEpochError(Exception):
    """A write carried a fencing epoch older than one the sink has already seen."""


@dataclass(frozen=True, slots=True)
class Execution:
    """One attempt at running a step body."""

    key: str
    object_id: str
    epoch: int
    pid: int
    started_at: float
    finished_at: float | None


class Sink:
    """The side-effect target on the SQLite file at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def create(self) -> None:
        """Create the file and its tables (idempotent)."""
        conn = sqlite3.connect(self.path, timeout=30.0)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)
        finally:
            conn.close()

    # -- called from inside steps ----------------------------------------------------

    def begin(self, key: str, object_id: str, epoch: int) -> int:
        """Log the start of a step execution; returns its row id for ``finish``."""
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO executions (key, object_id, epoch, pid, started_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, object_id, epoch, os.getpid(), time.time()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def finish(self, execution_id: int) -> None:
        """Mark a step execution's body as finished."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE executions SET finished_at = ? WHERE id = ?", (time.time(), execution_id)
            )

    def deliver(self, key: str, object_id: str, epoch: int, value: Any) -> bool:
        """Write an effect once per ``key``, fenced by ``epoch``; True if it was new.

        Raises ``StaleEpochError`` (after logging the refusal) when ``epoch`` is
        below the highest epoch already seen for ``object_id``.
        """
        text = json.dumps(value, sort_keys=True)
        pid, now = os.getpid(), time.time()
        refused_at: int | None = None
        with self._tx() as conn:
            row = conn.execute(
                "SELECT max_epoch FROM fence WHERE object_id = ?", (object_id,)
            ).fetchone()
            if row is not None and epoch < row[0]:
                refused_at = int(row[0])
                conn.execute(
                    "INSERT INTO deliveries (key, object_id, epoch, pid, outcome, max_epoch, at) "
                    "VALUES (?, ?, ?, ?, 'refused', ?, ?)",
                    (key, object_id, epoch, pid, refused_at, now),
                )
            else:
                conn.execute(
                    "INSERT INTO fence (object_id, max_epoch) VALUES (?, ?) "
                    "ON CONFLICT (object_id) DO UPDATE SET "
                    "max_epoch = MAX(max_epoch, excluded.max_epoch)",
                    (object_id, epoch),
                )
                cur = conn.execute(
                    "INSERT INTO effects (key, object_id, epoch, value, pid, written_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                    (key, object_id, epoch, text, pid, now),
                )
                fresh = cur.rowcount == 1
                conn.execute(
                    "INSERT INTO deliveries (key, object_id, epoch, pid, outcome, max_epoch, at) "
                    "VALUES (?, ?, ?, ?, ?, NULL, ?)",
                    (key, object_id, epoch, pid, "inserted" if fresh else "duplicate", now),
                )
        if refused_at is not None:
            raise StaleEpochError(
                f"{key}: epoch {epoch} is older than epoch {refused_at} already seen for "
                f"{object_id}; write refused"
            )
        return fresh

    # -- read by the tests -------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.path, timeout=30.0)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def effects(self) -> dict[str, tuple[int, Any]]:
        """Every delivered effect: key -> (epoch, value)."""
        rows = self._query("SELECT key, epoch, value FROM effects")
        return {key: (epoch, json.loads(value)) for key, epoch, value in rows}

    def executions(self) -> list[Execution]:
        """Every logged step execution, in start order."""
        rows = self._query(
            "SELECT key, object_id, epoch, pid, started_at, finished_at FROM executions "
            "ORDER BY id"
        )
        return [Execution(*row) for row in rows]

    def deliveries(self, outcome: str | None = None) -> list[tuple[Any, ...]]:
        """Write attempts as (key, object_id, epoch, pid, outcome), optionally one outcome."""
        sql = "SELECT key, object_id, epoch, pid, outcome FROM deliveries"
        if outcome is not None:
            return self._query(sql + " WHERE outcome = ? ORDER BY id", (outcome,))
        return self._query(sql + " ORDER BY id")

    def fence(self) -> dict[str, int]:
        """object_id -> highest epoch seen."""
        return dict(self._query("SELECT object_id, max_epoch FROM fence"))
