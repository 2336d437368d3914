"""Resume cost and storage versus history length.

For each history length N (10, 1,000 and 10,000 steps), in a fresh database: an object
of the ``history`` agent runs N trivial steps and then waits for the event ``go``; the
worker stops once the object is dormant. Then:

* ``storage``: the store's bytes (``bench/storage.py``) with that one object holding N
  steps, bytes per step, and the marginal bytes per step between lengths (flat when
  storage is linear in history). Beside it, the floor's table holding N rows of the
  floor's record-sized row.
* ``resume``: a new App (a new node) sends ``go`` and runs a worker. The time from its
  ``store.claim`` returning the object (timed by wrapping that call) to the next new
  step running (a ``perf_counter`` the step records): reading N records, replaying N
  steps from memory, consuming the event, appending. Also from the worker's start.
  Then the object waits for ``again``; once sent, the same node claims it a second
  time, holding its records: ``ms_claim_to_next_step_same_node`` reads only the tail
  and replays N + 1 steps.

The history is built once per length; each of ``resume_repeats`` resumes runs on its
own copy of the database as it stood (a SQLite backup, or a PostgreSQL database made
from it as a template), so every resume starts from the same state. The figures are
the medians; ``runs`` holds each resume's figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import perdure
from bench import storage
from bench.common import Backend, Database, fresh_database, median_of

QUICK = {"lengths": [10, 100, 300], "resume_repeats": 1}
FULL = {"lengths": [10, 1000, 10000], "resume_repeats": 3}


class _Stamps:
    resumed: ClassVar[list[float]] = []


async def _trivial(i: int) -> int:
    return i


async def _stamp(i: int) -> int:
    _Stamps.resumed.append(time.perf_counter())
    return i


def _register(app: perdure.App) -> None:
    @app.agent(name="history")
    async def history(run: Any, n: int) -> int:
        for i in range(n):
            await run.step(_trivial, i)
        await run.wait_for("go")
        await run.step(_stamp, n)
        await run.wait_for("again")
        await run.step(_stamp, n + 1)
        return n


async def _drive(app: perdure.App, done: Any, timeout: float) -> float:
    """Run one worker until ``done()``; the ``perf_counter`` at which the worker started."""
    worker = app.worker(concurrency=1)
    stop = asyncio.Event()
    began = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if task.done():
                task.result()
                raise RuntimeError("worker stopped early")
            if time.monotonic() > deadline:
                raise TimeoutError("object did not reach the expected state")
            await asyncio.sleep(0.002)
    finally:
        stop.set()
        await task
    return began


def _resumed_twice(app: perdure.App, oid: str) -> Any:
    """The stop test for the resume run: after the first resumed step, send ``again`` once
    (the same node claims the object a second time, holding its records), then wait for
    the object to complete. The store is read only once a stamp step has run, so the
    harness does not contend with the worker (for the read connection and the GIL) while
    it reads and replays the history being timed."""
    sent: list[bool] = []

    def done() -> bool:
        if not _Stamps.resumed:
            return False
        if not sent:
            info = app.get(oid)
            if info.status == "dormant" and info.waiting_event == "again":
                sent.append(True)
                app.send(oid, "again", None)
            return False
        return len(_Stamps.resumed) == 2 and app.get(oid).status == "completed"
    return done


def _bytes(db: Database) -> int:
    if db.sqlite_path is not None:
        return storage.sqlite_bytes(db.sqlite_path)
    assert db.pg_url is not None
    return storage.pg_bytes(db.pg_url)


def _floor_bytes(db: Database, rows: int) -> int:
    """Bytes of the floor's table holding ``rows`` record-sized rows (one transaction)."""
    from bench.common import _BODY, _HASH, _SIGNATURE, FLOOR_TABLE_PG, FLOOR_TABLE_SQLITE

    values = [("object", seq, _BODY, _HASH, _SIGNATURE) for seq in range(rows)]
    if db.sqlite_path is not None:
        import sqlite3

        path = db.sqlite_path.with_name("floor.db")
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(FLOOR_TABLE_SQLITE)
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", values)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return storage.sqlite_bytes(path)
    import psycopg

    assert db.pg_url is not None
    with psycopg.connect(db.pg_url) as conn:
        conn.execute(FLOOR_TABLE_PG.format(name="floor_rows"))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO floor_rows VALUES (%s, %s, %s, %s, %s)", values)
        conn.commit()
    return storage.pg_bytes(db.pg_url)


@contextlib.contextmanager
def _copy_of(db: Database, folder: Path, index: int, admin_url: str) -> Iterator[str]:
    """A store URL for a copy of ``db`` as it stands now (no App may have it open)."""
    if db.sqlite_path is not None:
        import sqlite3

        path = folder / f"resume{index}.db"
        source, target = sqlite3.connect(db.sqlite_path), sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        try:
            yield db.url.replace(str(db.sqlite_path), str(path))
        finally:
            for extra in ("", "-wal", "-shm"):
                Path(f"{path}{extra}").unlink(missing_ok=True)
        return
    import psycopg

    assert db.pg_url is not None
    source_name = urlsplit(db.pg_url).path.lstrip("/")
    name = f"{source_name}_r{index}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source_name}"'.encode())
    try:
        yield urlunsplit(urlsplit(db.pg_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def _resume_once(url: str, keys: Path, oid: str, n: int) -> dict[str, Any]:
    """Resume the object built by ``one_length`` in the store at ``url``, as a new node."""
    # The resuming node stands for a fresh process: collect what building the history
    # (or an earlier resume) left behind, or the collector walks it during the resume.
    gc.collect()
    resume = perdure.App(store=url, key_dir=keys, node_id="bench-resume", poll_interval=0.005)
    try:
        _register(resume)
        resume.send(oid, "go", None)
        store = resume.store
        claimed: list[float] = []
        original = store.claim

        def timed_claim(*args: Any, **kwargs: Any) -> Any:
            got = original(*args, **kwargs)
            if got:
                claimed.append(time.perf_counter())
            return got

        store.claim = timed_claim  # type: ignore[method-assign]
        _Stamps.resumed = []
        began = asyncio.run(_drive(resume, _resumed_twice(resume, oid), 600))
        if resume.result_of(oid) != n or len(_Stamps.resumed) != 2 or len(claimed) < 2:
            raise RuntimeError(f"{oid} did not resume as expected")
        second_claim = max(t for t in claimed if t < _Stamps.resumed[1])
        records = resume.get(oid).records
        verified = bool(resume.verify(oid).ok)
    finally:
        resume.close()
    return {
        "records": records,
        "ms_claim_to_next_step": (_Stamps.resumed[0] - claimed[0]) * 1e3,
        "ms_worker_start_to_next_step": (_Stamps.resumed[0] - began) * 1e3,
        "ms_claim_to_next_step_same_node": (_Stamps.resumed[1] - second_claim) * 1e3,
        "chain_verified": verified,
    }


def one_length(db: Database, folder: Path, n: int, repeats: int = 1, admin_url: str = ""
               ) -> dict[str, Any]:
    """Build an object with ``n`` steps in ``db``, measure its bytes, resume copies of it
    ``repeats`` times (medians, and every run under ``runs``)."""
    oid = f"history-{n}"
    keys = folder / "keys"
    build = perdure.App(store=db.url, key_dir=keys, node_id="bench-build", poll_interval=0.005)
    try:
        _register(build)
        build.options(object_id=oid).start("history", n)

        def dormant() -> bool:
            info = build.get(oid)
            return info.status == "dormant" and info.waiting_event == "go"

        asyncio.run(_drive(build, dormant, timeout=600))
    finally:
        build.close()
    size = _bytes(db)
    runs = []
    for index in range(max(1, repeats)):
        # A new node each time, of the same cluster: a key folder of its own (no heads
        # seen before: each copy of the store is older than what an earlier resume saw),
        # certified by the building node's root under the node id it acts as.
        node_keys = folder / f"keys-resume{index}"
        perdure.KeyFolder(keys).admit(perdure.KeyFolder(node_keys), name="bench-resume")
        with _copy_of(db, folder, index, admin_url) as url:
            runs.append(_resume_once(url, node_keys, oid, n))
    return {"steps": n, "store_bytes": size, **median_of(runs), "runs": runs}


def measure(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
            ) -> dict[str, Any]:
    """Resume and storage figures for every history length on ``backend``."""
    lengths: dict[str, Any] = {}
    store_sizes: dict[int, int] = {}
    floor_sizes: dict[int, int] = {}
    for n in sizes["lengths"]:
        sub = folder / f"steps{n}"
        with fresh_database(backend, sub, admin_url) as db:
            lengths[str(n)] = one_length(db, sub, n, sizes.get("resume_repeats", 1), admin_url)
        store_sizes[n] = lengths[str(n)]["store_bytes"]
        with fresh_database(backend, sub / "floor", admin_url) as db:
            floor_sizes[n] = _floor_bytes(db, n)
    return {
        "resume": lengths,
        "storage": {
            "store_bytes": {str(n): b for n, b in store_sizes.items()},
            "floor_bytes": {str(n): b for n, b in floor_sizes.items()},
            "perdure": storage.per_step(store_sizes),
            "floor": storage.per_step(floor_sizes),
        },
    }
