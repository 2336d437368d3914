"""The migration example end to end: 100 statements on PostgreSQL, a worker process
SIGKILLed after statement 60, another worker finishing from the step's progress markers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from examples import migration

import perdure
from tests.pg import fresh_database, needs_server

REPO_ROOT = Path(__file__).resolve().parents[2]


pytestmark = needs_server  # the migrations' target is a PostgreSQL database


@pytest.fixture
def target() -> Iterator[str]:
    """A private PostgreSQL database the migration runs against."""
    with fresh_database(migrated=False) as url:
        yield url


def _worker(store_url: str, key_dir: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "examples.migration:app", "worker", "--lease", "1", "--poll", "0.01"],
            cwd=REPO_ROOT, env=full, stdout=sink, stderr=subprocess.STDOUT)


def _tables(url: str, prefix: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE %s",
                           (f"{prefix}_%",)).fetchone()
    return int(row[0]) if row else 0


def _killed_at_60(store_url: str, key_dir: Path, tmp_path: Path, target: str,
                  transactional: bool) -> tuple[perdure.App, str, Any]:
    app = migration.app.with_settings(store=store_url, key_dir=key_dir)
    prefix = "tx" if transactional else "ac"
    handle = app.start("migrate", target, prefix, transactional)
    stopped = tmp_path / "stopped"
    first = _worker(store_url, key_dir, tmp_path / "w1.log", MIGRATION_STOP_AT="60",
                    MIGRATION_SIGNAL=str(stopped))
    try:
        deadline = time.monotonic() + 60
        while not stopped.exists():
            assert time.monotonic() < deadline, (tmp_path / "w1.log").read_text()
            assert first.poll() is None, (tmp_path / "w1.log").read_text()
            time.sleep(0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    second = _worker(store_url, key_dir, tmp_path / "w2.log")
    try:
        result = handle.result(timeout=90)
    finally:
        second.terminate()
        second.wait(timeout=20)
    return app, handle.object_id, result


def _no_markers_left(app: perdure.App, object_id: str) -> bool:
    """Progress markers live in the step's checkpoint slot (outside the chain), which
    the step's outcome deletes: none in memory, none left in the store."""
    return (perdure.Kind.STEP_CHECKPOINT not in [r.kind for r in app.history(object_id)]
            and app.store.checkpoints(object_id) == [])


def test_non_transactional_migration_resumes_at_statement_61(
        store_url: str, key_dir: Path, tmp_path: Path, target: str) -> None:
    """Autocommit DDL: the retry resumes at 61; the last marker of the killed attempt (the
    step's slot keeps only the latest) says the first 60 were applied; every table exists
    once (a statement run twice would fail)."""
    app, oid, result = _killed_at_60(store_url, key_dir, tmp_path, target, False)
    assert result == {"resumed_at": 61, "applied": 100}
    assert _no_markers_left(app, oid)
    assert _tables(target, "ac") == 100
    assert perdure.Kind.STEP_DONE in [r.kind for r in app.history(oid)]
    app.verify(oid)
    app.close()


def test_transactional_migration_knows_it_rolled_back_and_starts_over(
        store_url: str, key_dir: Path, tmp_path: Path, target: str) -> None:
    """One transaction: the dead connection's transaction was rolled back; the retry
    learns that from the recorded transaction id and applies all 100 from statement 1."""
    app, oid, result = _killed_at_60(store_url, key_dir, tmp_path, target, True)
    assert result["resumed_at"] == 1 and result["applied"] == 100
    assert result["earlier"]["applied"] == 60 and result["earlier"]["fate"] == "aborted"
    assert _no_markers_left(app, oid)
    assert _tables(target, "tx") == 100
    app.close()
