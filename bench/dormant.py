"""Dormant objects: what an idle node costs, and how soon it runs new work, beside 0,
100,000 and 1,000,000 objects that sleep.

Half the dormant objects sleep on a timer a month ahead (``run.sleep``), half wait for an
event nobody sends (``run.wait_for``). Starting a million through ``app.start`` and a
worker would take hours, so the store is filled by copying: two real dormant objects,
one of each kind (started by the App and run by a worker in this process until they
sleep), are copied with plain SQL, their ``objects`` row and their records under fresh
ids, as many times as needed (in batches of 100,000), then flushed to disk (a checkpoint
and ``sync``) before anything is measured. The copies are never run: nothing
is due before a month and nobody sends the event. They are the rows a store holding that
many sleepers has. On PostgreSQL the tables are analysed after each fill, as autovacuum
would do; SQLite keeps no statistics unless asked, and perdure never asks.

For each count, on SQLite FULL and PostgreSQL, one database filled step by step:

* ``next_ready_at_us``, ``empty_claim_us``: median time of the two queries an idle node
  repeats (the next due time; a claim round that finds nothing due), from this process;
* ``idle_cpu_pct``: CPU time (user + system, from ``/proc/<pid>/stat``) of a real
  ``perdure worker`` process with default settings, over ``idle_s`` seconds while
  nothing is due, in percent of one core (SQLite workers poll; PostgreSQL ones wait for
  ``NOTIFY``);
* ``start_to_step_ms``, ``start_to_result_ms``: from ``app.start`` of a one-step object
  in this process to its step running in the worker (the claim as the caller feels it),
  and to the caller holding its result (``Handle.result`` polling every 2 ms), ``starts``
  objects one after another, each after a random pause of up to 0.1 s.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import perdure
from bench import agents
from bench.common import REPO, Backend, Database, fresh_database, percentile, progress
from perdure.stores import Store, open_store
from perdure.stores.base import Route

__all__ = ["BACKENDS", "FULL", "QUICK", "app", "measure", "table"]

QUICK = {"dormant": [0, 2_000, 10_000], "idle_s": 1.0, "starts": 3, "query_repeats": 20}
FULL = {"dormant": [0, 100_000, 1_000_000], "idle_s": 10.0, "starts": 20,
        "query_repeats": 200}
BACKENDS = ("sqlite_full", "postgresql")  # the part runs on these; others say n/a
MONTH = 30 * 86400.0
BATCH = 100_000
NODE = "bench-dormant"
TEMPLATES = ("dormant-timer", "dormant-event")


async def sleeper(run: Any) -> None:
    """Sleep a month: dormant on a timer."""
    await run.sleep(MONTH)


async def waiter(run: Any) -> Any:
    """Wait for an event nobody sends: dormant with no ready time."""
    return await run.wait_for("never")


def register(target: perdure.App) -> perdure.App:
    """The benchmark agents (``bench.agents``) and the two sleepers."""
    agents.register(target)
    target.agent(name="sleeper")(sleeper)
    target.agent(name="waiter")(waiter)
    return target


app = register(perdure.App(store="sqlite:///perdure-bench-unused.db", node_id="bench"))


# -- filling ---------------------------------------------------------------------------


def _make_templates(db: Database, key_dir: Path) -> None:
    """The two real dormant objects the copies are made of."""
    maker = register(perdure.App(store=db.url, key_dir=key_dir, node_id="bench-filler"))
    try:
        maker.options(object_id=TEMPLATES[0]).start("sleeper")
        maker.options(object_id=TEMPLATES[1]).start("waiter")

        def asleep() -> bool:
            return all(maker.get(oid, explain=False).status == "dormant" for oid in TEMPLATES)

        maker.run_worker(until=asleep, install_signals=False)
    finally:
        maker.close()


def _copy_statements(columns: dict[str, list[str]], fresh_id: str, numbers: str,
                     source: str) -> list[str]:
    """``INSERT ... SELECT`` of the templates' rows in ``source`` (a table prefix), once
    per number in ``numbers`` (a relation with a column ``n``), ids made by ``fresh_id``."""
    out = []
    for table in ("objects", "records"):
        picked = ", ".join(fresh_id if c == "object_id" else f"t.{c}" for c in columns[table])
        out.append(f"INSERT INTO {table} ({', '.join(columns[table])}) "
                   f"SELECT {picked} FROM {source}{table} t, {numbers}")
    return out


def _fill_sqlite(path: Path, first: int, last: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")  # the fill, not what is measured
        marks = ", ".join(f"'{oid}'" for oid in TEMPLATES)
        columns = {t: [row[1] for row in conn.execute(f"PRAGMA table_info({t})")]
                   for t in ("objects", "records")}
        for table in ("objects", "records"):
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS tpl_{table} AS "
                         f"SELECT * FROM {table} WHERE object_id IN ({marks})")
        for start in range(first, last + 1, BATCH):
            end = min(last, start + BATCH - 1)
            numbers = (f"(WITH RECURSIVE k(n) AS (SELECT {start} UNION ALL "
                       f"SELECT n + 1 FROM k WHERE n < {end}) SELECT n FROM k)")
            conn.execute("BEGIN IMMEDIATE")
            for sql in _copy_statements(columns, "printf('%s-%07d', t.object_id, n)",
                                        numbers, "temp.tpl_"):
                conn.execute(sql)
            conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    os.sync()  # the fill's pages reach the disk now, not during the measurements


def _fill_postgres(url: str, first: int, last: int) -> None:
    import psycopg

    marks = ", ".join(f"'{oid}'" for oid in TEMPLATES)
    with psycopg.connect(url, autocommit=True) as conn:
        columns = {t: [row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position", (t,))] for t in ("objects", "records")}
        for table in ("objects", "records"):
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS tpl_{table} AS "
                         f"SELECT * FROM {table} WHERE object_id IN ({marks})".encode())
        for start in range(first, last + 1, BATCH):
            end = min(last, start + BATCH - 1)
            with conn.transaction():
                for sql in _copy_statements(
                        columns, "t.object_id || '-' || lpad(n::text, 7, '0')",
                        f"generate_series({start}, {end}) AS n", "tpl_"):
                    conn.execute(sql.encode())
        conn.execute(b"ANALYZE objects")
        conn.execute(b"ANALYZE records")
        with contextlib.suppress(psycopg.Error):  # needs a superuser or pg_checkpoint
            conn.execute(b"CHECKPOINT")
    os.sync()


def _fill(db: Database, key_dir: Path, have: int, want: int) -> None:
    """From ``have`` dormant objects to ``want`` (half timers, half event waits)."""
    if want <= have:
        return
    if have == 0:
        _make_templates(db, key_dir)
        have = 2
    first, last = have // 2, want // 2 - 1  # copy numbers, per template
    if last < first:
        return
    if db.sqlite_path is not None:
        _fill_sqlite(db.sqlite_path, first, last)
    else:
        assert db.pg_url is not None
        _fill_postgres(db.pg_url, first, last)


# -- measuring ---------------------------------------------------------------------------


def _median_us(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def _query_costs(store: Store, repeats: int) -> dict[str, Any]:
    route = Route(node_id="bench-probe")

    def empty_claim() -> None:
        now = time.time()
        if store.claim("bench-probe/1", now, now + 30, 16, route):
            raise RuntimeError("something was due in a store of sleepers")

    store.next_ready_at()
    empty_claim()
    return {"next_ready_at_us": _median_us(store.next_ready_at, repeats),
            "empty_claim_us": _median_us(empty_claim, repeats)}


@contextlib.contextmanager
def _worker(db: Database, key_dir: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A ``perdure worker`` process with default settings, until the block ends."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PERDURE_BENCH_GATE", "PERDURE_POLL", "PERDURE_LEASE",
                        "PERDURE_CONCURRENCY")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "bench.dormant:app", "--store", db.url,
             "--key-dir", str(key_dir), "--node-id", NODE, "worker"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_up(db: Database, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker's heartbeat is in the store (it registers as it starts)."""
    deadline = time.monotonic() + 120
    with db.query(f"SELECT live_until FROM nodes WHERE node_id = '{NODE}'") as live_until:
        while (live_until() or 0) <= time.time():
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode} (see {log})")
            if time.monotonic() > deadline:
                raise TimeoutError("the worker did not start within 120 s")
            time.sleep(0.02)


def _run_one_count(db: Database, folder: Path, key_dir: Path, count: int,
                   sizes: dict[str, Any], client: perdure.App) -> dict[str, Any]:
    store = open_store(db.url)
    try:
        figures = _query_costs(store, sizes["query_repeats"])
    finally:
        store.close()
    log = folder / "logs" / f"worker-{count}.log"
    with _worker(db, key_dir, log) as proc:
        _wait_up(db, proc, log)
        time.sleep(1.0)  # start-up work (warming, anchors) is not idling
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(sizes["idle_s"])
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        to_step, to_result = [], []
        for i in range(sizes["starts"]):
            time.sleep(random.uniform(0, 0.1))
            oid = f"one-{count}-{i}"
            began = time.time()
            client.options(object_id=oid).start("one_step", i).result(timeout=120,
                                                                      poll=0.002)
            to_result.append((time.time() - began) * 1e3)
            step = next(r for r in client.store.records(oid) if r.kind == "step_done")
            to_step.append((float(step.body["result"]) - began) * 1e3)
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode} (see {log})")
    figures.update({
        "idle_cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "idle_s": round(t1 - t0, 2),
        "start_to_step_ms_p50": statistics.median(to_step),
        "start_to_step_ms_max": max(to_step),
        "start_to_result_ms_p50": statistics.median(to_result),
        "start_to_result_ms_p90": percentile(to_result, 0.90),
        "start_to_result_ms_max": max(to_result),
        "starts": len(to_result),
    })
    return figures


def measure(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
            ) -> dict[str, Any]:
    """The figures for each dormant count, on one database filled step by step."""
    if backend.name not in BACKENDS:
        return {"na": "measured on SQLite FULL and PostgreSQL"}
    out: dict[str, Any] = {}
    key_dir = folder / "keys"
    with fresh_database(backend, folder, admin_url) as db:
        client = register(perdure.App(store=db.url, key_dir=key_dir, node_id="bench-client"))
        try:
            have = 0
            for count in sizes["dormant"]:
                began = time.monotonic()
                _fill(db, key_dir, have, count)
                filled = time.monotonic() - began
                have = max(have, count)
                figures = _run_one_count(db, folder, key_dir, count, sizes, client)
                with db.query("SELECT count(*) FROM objects WHERE status = 'dormant'") as rows:
                    figures["dormant_rows"] = int(rows() or 0)
                figures["fill_s"] = round(filled, 1)
                out[str(count)] = figures
                progress(f"{backend.name} dormant {count:,}: next_ready_at "
                         f"{figures['next_ready_at_us']:.0f} us, empty claim "
                         f"{figures['empty_claim_us']:.0f} us, idle CPU "
                         f"{figures['idle_cpu_pct']:.2f}%, start->result p50 "
                         f"{figures['start_to_result_ms_p50']:.1f} ms")
        finally:
            client.close()
    return out


# -- the table ---------------------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value:,.0f} µs" if value >= 100 else f"{value:.1f} µs"


def table(report: dict[str, Any]) -> str:
    """The figures as a Markdown table (``python -m bench --markdown``); empty when the
    part did not run."""
    rows = []
    for figures in report["backends"].values():
        got = figures.get("dormant")
        if not got or "na" in got:
            continue
        for count, f in got.items():
            rows.append(
                f"| {figures['store']} | {int(count):,} | {_us(f['next_ready_at_us'])} | "
                f"{_us(f['empty_claim_us'])} | {f['idle_cpu_pct']:.2f}% | "
                f"{f['start_to_step_ms_p50']:.1f} ms | {f['start_to_result_ms_p50']:.1f} ms "
                f"/ {f['start_to_result_ms_max']:.1f} ms |")
    if not rows:
        return ""
    head = ("| store | dormant objects | next due time | empty claim round | "
            "idle worker CPU | start → step p50 | start → result p50 / max |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n")
    return head + "\n".join(rows) + "\n"
