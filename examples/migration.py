"""A 100-statement migration on PostgreSQL, killed at 60% and resumed from its markers.

Run it (PostgreSQL on 127.0.0.1:5432, user postgres): python examples/migration.py
[ADMIN_URL]; the migrations run in a scratch database, dropped at the end. Two run,
each in a worker process that is SIGKILLed after statement 60; a second worker takes
each one over:

- against a **non-transactional** target (autocommit DDL: every statement stands once
  run), the step records a durable progress marker after each statement; the retry reads
  ``current_step().last_checkpoint`` and resumes at statement 61, the first 60 recorded
  as applied (a statement run twice would fail: each creates a table);
- against a **transactional** target (all 100 in one transaction), each marker also
  names the transaction (``txid_current()``); the retry asks PostgreSQL for that
  transaction's fate (``txid_status``), learns it was rolled back with the dead
  connection, and starts again from statement 1.

Completion (``step_done``), idempotency (``current_step().idempotency_key``) and partial
progress (``step_checkpoint`` markers) are three different records: see
docs/howto/resources.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure

HERE = Path(__file__).resolve().parent
app = perdure.App(store=os.environ.get("MIGRATION_STORE", f"sqlite:///{HERE / 'migration.db'}"),
                  key_dir=os.environ.get("MIGRATION_KEYS", str(HERE / ".perdure-keys")),
                  lease_seconds=1.0, poll_interval=0.01)

STATEMENTS = 100


def statement(i: int, prefix: str) -> str:
    """Statement ``i`` of the migration: a new table (running it twice fails)."""
    return f"CREATE TABLE {prefix}_{i:03d} (id integer PRIMARY KEY, note text)"


def _stop_here(i: int) -> None:
    """For the demonstration and the tests: after statement ``MIGRATION_STOP_AT`` is
    applied and marked, say so in ``MIGRATION_SIGNAL`` and wait to be killed."""
    if os.environ.get("MIGRATION_STOP_AT") == str(i):
        Path(os.environ["MIGRATION_SIGNAL"]).write_text(str(i))
        time.sleep(120)


def migrate_autocommit(url: str, prefix: str, count: int) -> dict[str, Any]:
    """Each statement commits on its own: resume after the last one marked applied."""
    import psycopg

    step = perdure.current_step()
    done = int((step.last_checkpoint or {}).get("applied", 0))
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(done + 1, count + 1):
            conn.execute(statement(i, prefix))  # type: ignore[arg-type]
            step.checkpoint({"applied": i}, durable=True)  # durable before the next one
            _stop_here(i)
    return {"resumed_at": done + 1, "applied": count}


def _fate(conn: Any, txid: int) -> str:
    """What became of transaction ``txid``: committed, aborted (waits while PostgreSQL
    has not yet noticed its connection died)."""
    for _ in range(200):
        row = conn.execute("SELECT txid_status(%s)", (txid,)).fetchone()
        status = str(row[0]) if row and row[0] is not None else "aborted"
        if status != "in progress":
            return status
        time.sleep(0.05)
    raise TimeoutError(f"transaction {txid} is still in progress")


def migrate_in_transaction(url: str, prefix: str, count: int) -> dict[str, Any]:
    """All statements in one transaction: a crash rolls back all of them, so a retry
    checks the recorded transaction's fate and starts from statement 1."""
    import psycopg

    step = perdure.current_step()
    last = step.last_checkpoint
    earlier = None
    with psycopg.connect(url, autocommit=True) as conn:
        if last is not None:
            earlier = {"txid": last["txid"], "applied": last["applied"],
                       "fate": _fate(conn, int(last["txid"]))}
            if earlier["fate"] == "committed":
                return {"resumed_at": None, "applied": count, "earlier": earlier}
        with conn.transaction():
            txid = conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
            for i in range(1, count + 1):
                conn.execute(statement(i, prefix))  # type: ignore[arg-type]
                step.checkpoint({"txid": txid, "applied": i}, durable=True)
                _stop_here(i)
    return {"resumed_at": 1, "applied": count, "earlier": earlier}


@app.agent()
async def migrate(run: perdure.Run, url: str, prefix: str, transactional: bool,
                  count: int = STATEMENTS) -> dict[str, Any]:
    """Apply the migration as one long step that marks its progress."""
    fn = migrate_in_transaction if transactional else migrate_autocommit
    result: dict[str, Any] = await run.step(fn, url, prefix, count, name="migration")
    return result


def _worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "migration:app", "worker", "--lease", "1",
         "--poll", "0.01"], cwd=HERE, env=env)


def main(target: str) -> None:
    """Both migrations, each killed at 60% and finished by a second worker."""
    signal_file = Path("migration.stopped")
    for transactional in (False, True):
        prefix = f"demo_{'tx' if transactional else 'ac'}_{os.getpid()}"
        handle = app.start(migrate, target, prefix, transactional)
        signal_file.unlink(missing_ok=True)
        first = _worker({**os.environ, "MIGRATION_STOP_AT": "60",
                         "MIGRATION_SIGNAL": str(signal_file.absolute())})
        while not signal_file.exists():
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        print(f"{'transactional' if transactional else 'autocommit'}: killed after "
              f"statement 60")
        second = _worker(dict(os.environ))
        print("  result:", handle.result(timeout=120))
        second.terminate()
        second.wait()


def _scratch_database(admin_url: str) -> tuple[str, str]:
    """A new database on the server of ``admin_url`` for the demonstration: (name, URL)."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    name = f"perdure_migration_demo_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    return name, urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


if __name__ == "__main__":
    import psycopg

    admin = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:5432/postgres"
    scratch, url = _scratch_database(admin)
    try:
        main(url)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')  # type: ignore[arg-type]
