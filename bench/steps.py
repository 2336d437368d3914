"""Cost of a durable step: perdure against each backend's own floor commit.

Run ``python bench/steps.py`` (or ``--quick`` for a seconds-long smoke run; ``python -m
bench`` runs this and the wake and claim benchmarks together). It prints one JSON
document; nothing here asserts on speed. For each backend (SQLite ``synchronous=FULL``,
SQLite ``synchronous=NORMAL``, PostgreSQL), on fresh databases:

* ``floor``: one hand-written ``INSERT`` + ``COMMIT`` per iteration on a plain
  connection (``sqlite3`` with the store's pragmas: WAL, same ``synchronous``; or
  ``psycopg`` to a fresh PostgreSQL database on the same server);
* ``sequential``: one object running N trivial steps; time per step is taken from
  timestamps the step function records in memory, first step to last, so worker
  start-up and claiming are not counted;
* ``concurrent``: M objects of K trivial steps each on one worker; total steps per
  second from the first step to the last, and the group-commit factor (appends per
  commit, counted by a ``perdure.hooks.Counters`` told of commits and ends);
* ``group_floor``: the floor for many objects sharing commits: 25 hand-written
  ``INSERT``s per commit, rows of 50 objects in turn, into the floor's table (rows
  clustered by object, as memory is). Each commit then writes a page per object it
  touches, so this is the most a disk gives 50 objects at once, the ceiling for
  ``concurrent``.

Besides, ``baseline`` is the plain-Python cost of awaiting the trivial step function.
Each scenario runs ``--repeats`` times on a fresh database; figures are medians over runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perdure
from bench.common import (
    DEFAULT_PG,
    Backend,
    Database,
    floor,
    fresh_database,
    group_floor,
    machine,
    median_of,
    pick_backends,
)
from perdure.hooks import CommitBatch, Counters, ObjectTerminated


class Clock:
    """Timestamps taken inside step functions (perf_counter, seconds)."""

    stamps: ClassVar[list[float]] = []


async def trivial(i: int) -> int:
    """The step every scenario runs: record when it ran, return its argument."""
    Clock.stamps.append(time.perf_counter())
    return i


async def bare(i: int) -> int:
    """The same work as ``trivial`` without the timestamp (for the Python baseline)."""
    return i


# -- measurements --------------------------------------------------------------------


def python_baseline(calls: int) -> dict[str, Any]:
    """Awaiting the trivial step function ``calls`` times in a loop, no perdure."""

    async def loop() -> float:
        began = time.perf_counter()
        for i in range(calls):
            await bare(i)
        return time.perf_counter() - began

    elapsed = asyncio.run(loop())
    return {"calls": calls, "us_per_call": round(elapsed / calls * 1e6, 3)}


@contextlib.contextmanager
def _app(db: Database, folder: Path) -> Iterator[perdure.App]:
    app = perdure.App(store=db.url, key_dir=folder / "keys", node_id="bench", poll_interval=0.005)
    try:
        yield app
    finally:
        app.close()


def _register(app: perdure.App) -> Callable[..., Any]:
    @app.agent(name="steps")
    async def steps(run: Any, n: int) -> int:
        for i in range(n):
            await run.step(trivial, i)
        return n

    return steps


async def _drive(app: perdure.App, concurrency: int, objects: int, timeout: float) -> Any:
    """Run one worker on this loop until ``objects`` objects have finished."""
    worker = app.worker(concurrency=concurrency)
    # Told of ends and commits only: the steps themselves are measured with nobody
    # listening to them, as a node runs by default.
    counts = Counters()
    counts.attach(worker.hooks, ObjectTerminated, CommitBatch)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while counts.completed < objects:
            if task.done():
                task.result()
                raise RuntimeError("worker stopped before the objects finished")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{counts.completed}/{objects} objects finished in {timeout}s")
            await asyncio.sleep(0.002)
    finally:
        stop.set()
        await task
    return worker, counts


def _run_objects(
    db: Database, folder: Path, objects: int, steps: int, concurrency: int
) -> tuple[list[float], Any, bool]:
    """Start ``objects`` objects of ``steps`` steps, run them, return the step stamps."""
    with _app(db, folder) as app:
        agent = _register(app)
        handles = [app.start(agent, steps) for _ in range(objects)]
        Clock.stamps = []
        _worker, counts = asyncio.run(_drive(app, concurrency, objects, timeout=600))
        stamps = Clock.stamps
        for handle in handles:
            if handle.result(timeout=5) != steps:
                raise RuntimeError(f"object {handle.object_id} returned a wrong result")
        verified = bool(app.verify(handles[0].object_id).ok)
    if len(stamps) != objects * steps:
        raise RuntimeError(f"expected {objects * steps} steps to run, saw {len(stamps)}")
    return stamps, counts, verified


def sequential(db: Database, folder: Path, steps: int, floor: dict[str, Any]) -> dict[str, Any]:
    """One object, ``steps`` trivial steps, timed inside the agent."""
    stamps, _counts, verified = _run_objects(db, folder, 1, steps, concurrency=1)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return {
        "steps": steps,
        "us_per_step": per_step * 1e6,
        "us_per_step_median": statistics.median(gaps) * 1e6,
        "steps_per_s": 1 / per_step,
        "ratio_to_floor_commit": per_step * 1e6 / floor["us_per_commit"],
        "ratio_to_floor_commit_median": statistics.median(gaps)
        * 1e6
        / floor["us_per_commit_median"],
        "us_over_floor_commit": per_step * 1e6 - floor["us_per_commit"],
        "chain_verified": verified,
    }


def concurrent(
    db: Database, folder: Path, objects: int, steps: int, floor_rate: float
) -> dict[str, Any]:
    """``objects`` objects of ``steps`` steps each on one worker, all at once."""
    stamps, counts, verified = _run_objects(db, folder, objects, steps, concurrency=objects)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    commits, appends = counts.commits, counts.appends
    return {
        "objects": objects,
        "steps_per_object": steps,
        "steps_per_s": rate,
        "ratio_to_single_commit_rate": rate / floor_rate,
        "commits": commits,
        "appends": appends,
        "appends_per_commit": appends / commits if commits else None,
        "chain_verified": verified,
    }


QUICK_SIZES = {
    "floor_commits": 50,
    "seq_steps": 30,
    "objects": 5,
    "steps_per_object": 4,
    "baseline_calls": 1000,
    "repeats": 1,
}
FULL_SIZES = {
    "floor_commits": 1000,
    "seq_steps": 1000,
    "objects": 50,
    "steps_per_object": 20,
    "baseline_calls": 1000,
    "repeats": 3,
}


def measure_backend(
    backend: Backend, folder: Path, sizes: dict[str, int], admin_url: str
) -> dict[str, Any]:
    """Floor, sequential and concurrent figures for one backend (medians over repeats)."""
    floors, groups, seqs, concs = [], [], [], []
    for rep in range(sizes["repeats"]):
        base = folder / f"run{rep}"
        with fresh_database(backend, base / "floor", admin_url) as db:
            fl = floor(db, sizes["floor_commits"])
        floors.append(fl)
        with fresh_database(backend, base / "group-floor", admin_url) as db:
            groups.append(group_floor(db, sizes["objects"] * sizes["steps_per_object"]))
        with fresh_database(backend, base / "sequential", admin_url) as db:
            seqs.append(sequential(db, base / "sequential", sizes["seq_steps"], fl))
        with fresh_database(backend, base / "concurrent", admin_url) as db:
            concs.append(
                concurrent(
                    db,
                    base / "concurrent",
                    sizes["objects"],
                    sizes["steps_per_object"],
                    fl["commits_per_s"],
                )
            )
    concurrent_figures = median_of(concs)
    group = median_of(groups)
    concurrent_figures["ratio_to_group_floor"] = (
        concurrent_figures["steps_per_s"] / group["rows_per_s"])
    return {
        "store": backend.label,
        "floor": median_of(floors),
        "group_floor": group,
        "sequential": median_of(seqs),
        "concurrent": concurrent_figures,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every benchmark entry point shares."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI smoke runs")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 3, quick 1)")
    parser.add_argument(
        "--dir",
        type=Path,
        help="folder for SQLite files, keys and logs (default: a temporary folder, removed after)",
    )
    parser.add_argument(
        "--backends",
        help="comma-separated: sqlite_full, sqlite_normal, postgresql (default: all three)",
    )
    parser.add_argument(
        "--pg",
        default=DEFAULT_PG,
        help="PostgreSQL admin URL; a fresh database is created on that server for each "
        "scenario and dropped after (default: $PERDURE_BENCH_PG or %(default)s)",
    )


@contextlib.contextmanager
def bench_dir(given: Path | None) -> Iterator[Path]:
    """The folder for this run's files: ``given``, or a temporary one removed afterwards."""
    owned = given is None
    folder = Path(tempfile.mkdtemp(prefix="perdure-bench-")) if owned else given
    assert folder is not None
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Parse options, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.getLogger("perdure").setLevel(logging.ERROR)
    backends = pick_backends(args.backends)
    sizes = dict(QUICK_SIZES if args.quick else FULL_SIZES)
    if args.repeats is not None:
        sizes["repeats"] = max(1, args.repeats)
    uses_pg = any(b.kind == "postgresql" for b in backends)
    with bench_dir(args.dir) as db_dir:
        run_dir = db_dir / time.strftime("%Y%m%d-%H%M%S")
        report = {
            "bench": "steps",
            "quick": args.quick,
            "sizes": sizes,
            "machine": machine(db_dir, args.pg if uses_pg else None),
            "baseline": python_baseline(sizes["baseline_calls"]),
            "backends": {
                b.name: measure_backend(b, run_dir / b.name, sizes, args.pg) for b in backends
            },
        }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
