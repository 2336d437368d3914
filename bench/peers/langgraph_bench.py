"""LangGraph (functional API with ``SqliteSaver``) on the benchmark workloads.

``python -m bench.peers.langgraph_bench SCENARIO --db FILE ...`` prints one JSON
document. An ``@entrypoint`` function calls ``@task`` functions; with a checkpointer
each task's result is saved to the thread's checkpoint, and invoking the entrypoint
again on the same ``thread_id`` replays it, reusing saved task results. Runs use
``durability="sync"`` (each write is saved before the run goes on), the mode that
matches a durable step. Only documented public API is used: ``langgraph.func.entrypoint``
and ``task``, ``langgraph.types.interrupt`` and ``Command``,
``langgraph.checkpoint.sqlite.SqliteSaver``.

LangGraph has no worker that claims runs and no event delivery to a waiting run: the
caller resumes a run itself by invoking it. So "process start" in the recovery
workload is the caller's process starting and invoking the thread again, and the
wake-latency workload does not apply.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sqlite3
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.func import entrypoint, task
from langgraph.types import Command, interrupt

STAMPS: list[float] = []
_LOCK = threading.Lock()


def _saver(path: str) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


@task
def trivial(i: int) -> int:
    """Record when the task ran; return its argument."""
    with _LOCK:
        STAMPS.append(time.perf_counter())
    return i


@task
def paced(i: int, effects: str, pace: float) -> int:
    """A crash-recovery step: log start and end, sleep ``pace`` (see ``bench/recovery.py``)."""
    with open(effects, "a") as log:
        log.write(f"start {i} {os.getpid()} {time.time()}\n")
    if os.environ.get("PERDURE_BENCH_CRASH_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(pace)
    with open(effects, "a") as log:
        log.write(f"end {i} {os.getpid()} {time.time()}\n")
    return i


def _steps_entrypoint(saver: SqliteSaver) -> Any:
    @entrypoint(checkpointer=saver)
    def steps(n: int) -> int:
        for i in range(n):
            trivial(i).result()
        return n

    return steps


def sequential(args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``--steps`` tasks, one after another."""
    flow = _steps_entrypoint(_saver(args.db))
    STAMPS.clear()
    assert flow.invoke(args.steps, _config("seq"), durability="sync") == args.steps
    per_step = (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {"steps": args.steps, "us_per_step": per_step * 1e6,
            "us_per_step_median": statistics.median(gaps) * 1e6, "steps_per_s": 1 / per_step}


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """``--objects`` runs (threads) of ``--steps`` tasks at once, one saver."""
    flow = _steps_entrypoint(_saver(args.db))
    STAMPS.clear()
    with ThreadPoolExecutor(max_workers=args.objects) as pool:
        results = list(pool.map(
            lambda j: flow.invoke(args.steps, _config(f"conc-{j}"), durability="sync"),
            range(args.objects)))
    assert results == [args.steps] * args.objects
    total = args.objects * args.steps
    stamps = sorted(STAMPS)
    assert len(stamps) == total
    return {"objects": args.objects, "steps_per_object": args.steps,
            "steps_per_s": (total - 1) / (stamps[-1] - stamps[0])}


def recovery_child(args: argparse.Namespace) -> dict[str, Any]:
    """First process: start the run; later process: invoke the thread again (input None)."""

    @entrypoint(checkpointer=_saver(args.db))
    def paced_run(inputs: dict[str, Any]) -> int:
        for i in range(1, inputs["steps"] + 1):
            paced(i, inputs["effects"], inputs["pace"]).result()
        return int(inputs["steps"])

    inputs = {"steps": args.steps, "effects": args.effects, "pace": args.pace}
    result = paced_run.invoke(inputs if args.first else None, _config("paced-1"),
                              durability="sync")
    return {"result": result}


def _history_entrypoint(saver: SqliteSaver) -> Any:
    @entrypoint(checkpointer=saver)
    def history(n: int) -> int:
        for i in range(n):
            trivial(i).result()
        interrupt("go?")
        trivial(n).result()
        return n

    return history


def history(args: argparse.Namespace) -> dict[str, Any]:
    """Build a run with ``--steps`` tasks waiting at an interrupt; resume it, timed."""
    build = _history_entrypoint(_saver(args.db))
    build.invoke(args.steps, _config("history"), durability="sync")
    size = _file_bytes(args.db)
    flow = _history_entrypoint(_saver(args.db))  # a new connection, as a fresh caller
    STAMPS.clear()
    began = time.perf_counter()
    result = flow.invoke(Command(resume="go"), _config("history"), durability="sync")
    assert result == args.steps and len(STAMPS) == 1, (result, len(STAMPS))
    return {"steps": args.steps, "store_bytes": size,
            "ms_invoke_to_next_step": (STAMPS[0] - began) * 1e3}


def _file_bytes(path: str) -> int:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return int(pages * size)


SCENARIOS = {"sequential": sequential, "concurrent": concurrent,
             "recovery-child": recovery_child, "history": history}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario, print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--db", required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--objects", type=int, default=1)
    parser.add_argument("--effects", default="")
    parser.add_argument("--pace", type=float, default=0.005)
    parser.add_argument("--first", action="store_true")
    args = parser.parse_args(argv)
    json.dump(SCENARIOS[args.scenario](args), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
