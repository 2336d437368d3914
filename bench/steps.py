"""Cost of a durable step: perdure against one bare SQLite commit on the same disk.

Run ``python bench/steps.py`` (or ``--quick`` for a seconds-long smoke run). It prints
one JSON document; nothing here asserts on speed. For each SQLite durability mode
(``synchronous=FULL`` and ``NORMAL``), on fresh database files in one folder:

* ``floor``: one hand-written ``INSERT`` + ``COMMIT`` per iteration on a plain
  ``sqlite3`` connection with the store's pragmas (WAL, same ``synchronous``);
* ``sequential``: one object running N trivial steps; time per step is taken from
  timestamps the step function records in memory, first step to last, so worker
  start-up and claiming are not counted;
* ``concurrent``: M objects of K trivial steps each on one worker; total steps per
  second from the first step to the last, and the group-commit factor (appends per
  commit, counted by the worker's ``Committer``).

Besides, ``baseline`` is the plain-Python cost of awaiting the trivial step function.
Each scenario runs ``--repeats`` times on a fresh file; figures are medians over runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import perdure

MODES = ("full", "normal")


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


# -- machine facts -----------------------------------------------------------------


def _mount_of(path: Path) -> dict[str, str]:
    """Device, mount point and filesystem holding ``path`` (Linux; best effort)."""
    best: dict[str, str] = {}
    with contextlib.suppress(OSError):
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best.get("mount", "")):
                best = {"device": device, "mount": mount, "filesystem": fstype}
    device = best.get("device", "")
    if device.startswith("/dev/"):
        name = device.removeprefix("/dev/")
        rotational = Path(f"/sys/class/block/{name}/queue/rotational")
        with contextlib.suppress(OSError):
            best["rotational"] = rotational.read_text().strip()
    return best


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine(db_dir: Path) -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "db_dir": str(db_dir),
        "disk": _mount_of(db_dir),
    }


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


def floor(path: Path, mode: str, commits: int) -> dict[str, Any]:
    """One INSERT + COMMIT per iteration on a plain connection with the store's pragmas."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={mode.upper()}")
        conn.execute(
            "CREATE TABLE rows (object_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,"
            " hash BLOB NOT NULL, signature BLOB NOT NULL, PRIMARY KEY (object_id, seq))"
            " WITHOUT ROWID"
        )
        body, digest, signature = b"x" * 160, os.urandom(32), os.urandom(64)
        times: list[float] = []
        for seq in range(commits):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO rows VALUES (?, ?, ?, ?, ?)", ("object", seq, body, digest, signature)
            )
            conn.execute("COMMIT")
            times.append(time.perf_counter() - began)
    finally:
        conn.close()
    mean = statistics.fmean(times)
    return {
        "commits": commits,
        "us_per_commit": mean * 1e6,
        "us_per_commit_median": statistics.median(times) * 1e6,
        "commits_per_s": 1 / mean,
    }


@contextlib.contextmanager
def _app(folder: Path, mode: str) -> Iterator[perdure.App]:
    folder.mkdir(parents=True)
    app = perdure.App(
        store=f"sqlite:///{folder / 'store.db'}?synchronous={mode}",
        key_dir=folder / "keys",
        node_id="bench",
        poll_interval=0.005,
    )
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
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while worker.completed < objects:
            if task.done():
                task.result()
                raise RuntimeError("worker stopped before the objects finished")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{worker.completed}/{objects} objects finished in {timeout}s")
            await asyncio.sleep(0.002)
    finally:
        stop.set()
        await task
    return worker


def _run_objects(
    folder: Path, mode: str, objects: int, steps: int, concurrency: int
) -> tuple[list[float], Any, bool]:
    """Start ``objects`` objects of ``steps`` steps, run them, return the step stamps."""
    with _app(folder, mode) as app:
        agent = _register(app)
        handles = [app.start(agent, steps) for _ in range(objects)]
        Clock.stamps = []
        worker = asyncio.run(_drive(app, concurrency, objects, timeout=600))
        stamps = Clock.stamps
        for handle in handles:
            if handle.result(timeout=5) != steps:
                raise RuntimeError(f"object {handle.object_id} returned a wrong result")
        verified = bool(app.verify(handles[0].object_id).ok)
    if len(stamps) != objects * steps:
        raise RuntimeError(f"expected {objects * steps} steps to run, saw {len(stamps)}")
    return stamps, worker, verified


def sequential(folder: Path, mode: str, steps: int, floor: dict[str, Any]) -> dict[str, Any]:
    """One object, ``steps`` trivial steps, timed inside the agent."""
    stamps, _worker, verified = _run_objects(folder, mode, 1, steps, concurrency=1)
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
    folder: Path, mode: str, objects: int, steps: int, floor_rate: float
) -> dict[str, Any]:
    """``objects`` objects of ``steps`` steps each on one worker, all at once."""
    stamps, worker, verified = _run_objects(folder, mode, objects, steps, concurrency=objects)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    commits, appends = worker.committer.commits, worker.committer.appends
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


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field over runs (other fields from the first run)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = all(r[key] for r in runs) if isinstance(value, bool) else value
        else:
            med = statistics.median(r[key] for r in runs)
            out[key] = round(med, 3) if isinstance(med, float) else med
    return out


def measure(db_dir: Path, sizes: dict[str, int]) -> dict[str, Any]:
    """Every scenario in both durability modes."""
    result: dict[str, Any] = {}
    for mode in MODES:
        floors, seqs, concs = [], [], []
        for rep in range(sizes["repeats"]):
            base = db_dir / mode / f"run{rep}"
            base.mkdir(parents=True)
            fl = floor(base / "floor.db", mode, sizes["floor_commits"])
            floors.append(fl)
            seqs.append(sequential(base / "sequential", mode, sizes["seq_steps"], fl))
            concs.append(
                concurrent(
                    base / "concurrent",
                    mode,
                    sizes["objects"],
                    sizes["steps_per_object"],
                    fl["commits_per_s"],
                )
            )
        result[mode] = {
            "floor": _median_of(floors),
            "sequential": _median_of(seqs),
            "concurrent": _median_of(concs),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse options, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI smoke runs")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 3, quick 1)")
    parser.add_argument(
        "--dir",
        type=Path,
        help="folder for the database files (default: a fresh temporary folder, removed after)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("perdure").setLevel(logging.ERROR)
    sizes = (
        {
            "floor_commits": 50,
            "seq_steps": 30,
            "objects": 5,
            "steps_per_object": 4,
            "baseline_calls": 1000,
            "repeats": 1,
        }
        if args.quick
        else {
            "floor_commits": 1000,
            "seq_steps": 1000,
            "objects": 50,
            "steps_per_object": 20,
            "baseline_calls": 1000,
            "repeats": 3,
        }
    )
    if args.repeats is not None:
        sizes["repeats"] = max(1, args.repeats)
    owned = args.dir is None
    db_dir = Path(tempfile.mkdtemp(prefix="perdure-bench-")) if owned else args.dir
    db_dir = db_dir.resolve()
    db_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = {
            "bench": "steps",
            "quick": args.quick,
            "sizes": sizes,
            "machine": machine(db_dir),
            "baseline": python_baseline(sizes["baseline_calls"]),
            "modes": measure(db_dir / time.strftime("%Y%m%d-%H%M%S"), sizes),
        }
    finally:
        if owned:
            shutil.rmtree(db_dir, ignore_errors=True)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
