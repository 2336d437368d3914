"""LangGraph (functional API or ``StateGraph``; ``SqliteSaver`` or ``PostgresSaver``).

``python -m bench.peers.langgraph_bench SCENARIO (--db FILE | --url POSTGRES_URL)
[--api functional|graph] ...`` prints one JSON document. ``--db`` saves checkpoints
with ``SqliteSaver`` (``langgraph-checkpoint-sqlite``) in a SQLite file, ``--url`` with
``PostgresSaver`` (``langgraph-checkpoint-postgres``) in a PostgreSQL database, on one
connection opened as LangGraph's documentation says (``autocommit=True``,
``prepare_threshold=0``, ``row_factory=dict_row``) and ``setup()`` called first.

Two ways of writing the same durable steps:

* ``--api functional`` (the default): an ``@entrypoint`` function calls ``@task``
  functions; each task's result is saved to the thread's checkpoint, and invoking the
  entrypoint again on the same ``thread_id`` replays it, reusing saved task results.
* ``--api graph``: a ``StateGraph`` whose node ``step`` does one trivial step and
  loops back to itself through a conditional edge while the counter ``i`` in the state
  is below ``n``. Each iteration is one superstep, so each step's completion is one
  checkpoint; invoking the thread again (input ``None``) carries on from the latest
  checkpoint. ``recursion_limit`` (one superstep per step) is raised to ``n + 10``.

Runs use ``durability="sync"``, the mode that matches a durable step: the checkpoint
of each superstep is saved before the next superstep starts. A functional task's
result, though, is handed to the saver in the background (``put_writes`` submitted to
the run's executor) and the entrypoint goes on to its next task meanwhile; so the
functional API's step times do not wait for the save, and a process killed just after
a task returned can lose that result (the recovery workload's "finished before the
kill" column shows it when it happens). A StateGraph step is covered by the next
superstep's checkpoint, saved before the next step runs. Only documented public API
is used:
``langgraph.func.entrypoint`` and ``task``, ``langgraph.graph.StateGraph``, ``START``
and ``END``, ``langgraph.types.interrupt`` and ``Command``,
``langgraph.checkpoint.sqlite.SqliteSaver``, ``langgraph.checkpoint.postgres.PostgresSaver``.

Both savers are used by one thread at a time: ``SqliteSaver`` and the synchronous
``PostgresSaver`` hold a lock around each database call (``PostgresSaver`` even when
given a connection pool), so the concurrent workload's threads take turns at the store.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from bench import storage

STAMPS: list[float] = []
_LOCK = threading.Lock()

Saver = BaseCheckpointSaver[Any]
# How a scenario runs a flow: ``(input, thread_id, steps) -> result``; ``steps`` sizes
# StateGraph's recursion_limit.
Run = Callable[[Any, str, int], Any]


def _saver(args: argparse.Namespace) -> Saver:
    """A ``PostgresSaver`` on ``--url`` (after ``setup()``), else a ``SqliteSaver`` on ``--db``."""
    if args.url:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        conn = Connection.connect(args.url, autocommit=True, prepare_threshold=0,
                                  row_factory=dict_row)
        saver = PostgresSaver(conn)
        saver.setup()
        return saver
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver(sqlite3.connect(args.db, check_same_thread=False))


def _store_bytes(args: argparse.Namespace) -> int:
    if args.url:
        return storage.pg_bytes(args.url)
    return storage.sqlite_bytes(Path(args.db))


def _config(thread: str, steps: int) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}


def _invoker(flow: Any) -> Run:
    def run(value: Any, thread: str, steps: int) -> Any:
        return flow.invoke(value, _config(thread, steps), durability="sync")

    return run


# -- step bodies ---------------------------------------------------------------------------


def _stamp() -> None:
    """Record when a step ran."""
    with _LOCK:
        STAMPS.append(time.perf_counter())


def _paced_body(i: int, effects: str, pace: float) -> None:
    """A crash-recovery step: log start and end, sleep ``pace`` (see ``bench/recovery.py``)."""
    with open(effects, "a") as log:
        log.write(f"start {i} {os.getpid()} {time.time()}\n")
    if os.environ.get("PERDURE_BENCH_CRASH_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(pace)
    with open(effects, "a") as log:
        log.write(f"end {i} {os.getpid()} {time.time()}\n")


@task
def trivial(i: int) -> int:
    """Record when the task ran; return its argument."""
    _stamp()
    return i


@task
def paced(i: int, effects: str, pace: float) -> int:
    """The paced step as a task."""
    _paced_body(i, effects, pace)
    return i


# -- functional API ------------------------------------------------------------------------


def _functional_steps(saver: Saver) -> Run:
    @entrypoint(checkpointer=saver)
    def steps(n: int) -> int:
        for i in range(n):
            trivial(i).result()
        return n

    return _invoker(steps)


def _functional_paced(saver: Saver) -> Run:
    @entrypoint(checkpointer=saver)
    def paced_run(inputs: dict[str, Any]) -> int:
        for i in range(1, inputs["steps"] + 1):
            paced(i, inputs["effects"], inputs["pace"]).result()
        return int(inputs["steps"])

    return _invoker(paced_run)


def _functional_history(saver: Saver) -> Run:
    @entrypoint(checkpointer=saver)
    def history(n: int) -> int:
        for i in range(n):
            trivial(i).result()
        interrupt("go?")
        trivial(n).result()
        return n

    return _invoker(history)


# -- StateGraph ----------------------------------------------------------------------------


class Counter(TypedDict):
    """A StateGraph run's state: steps done and steps to do."""

    i: int
    n: int


class Paced(TypedDict):
    """The crash-recovery run's state: the counter and the paced step's settings."""

    i: int
    n: int
    effects: str
    pace: float


def _step(state: Counter) -> dict[str, int]:
    """One trivial step: record when it ran, count it."""
    _stamp()
    return {"i": state["i"] + 1}


def _again(state: Counter) -> str:
    """Loop back to ``step`` until ``n`` steps are done."""
    return "step" if state["i"] < state["n"] else END


def _graph_steps(saver: Saver) -> Run:
    graph = StateGraph(Counter)
    graph.add_node("step", _step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _again, ["step", END])
    flow = graph.compile(checkpointer=saver)

    def run(n: int | None, thread: str, steps: int) -> int:
        got = flow.invoke(None if n is None else {"i": 0, "n": n}, _config(thread, steps),
                          durability="sync")
        return int(got["i"])

    return run


def _paced_step(state: Paced) -> dict[str, int]:
    """One paced step (numbered from 1), counted."""
    i = state["i"] + 1
    _paced_body(i, state["effects"], state["pace"])
    return {"i": i}


def _paced_again(state: Paced) -> str:
    """Loop back to ``step`` until ``n`` paced steps are done."""
    return "step" if state["i"] < state["n"] else END


def _graph_paced(saver: Saver) -> Run:
    graph = StateGraph(Paced)
    graph.add_node("step", _paced_step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _paced_again, ["step", END])
    flow = graph.compile(checkpointer=saver)

    def run(inputs: dict[str, Any] | None, thread: str, steps: int) -> int:
        value = None if inputs is None else Paced(i=0, n=inputs["steps"],
                                                  effects=inputs["effects"], pace=inputs["pace"])
        got = flow.invoke(value, _config(thread, steps), durability="sync")
        return int(got["i"])

    return run


def _finish(state: Counter) -> dict[str, int]:
    """Wait for the caller (``interrupt``), then one more trivial step (not counted in ``i``).

    On resume the node runs again from its start, and ``interrupt`` returns the value
    the caller resumed with.
    """
    interrupt("go?")
    _stamp()
    return {}


def _to_finish(state: Counter) -> str:
    """Loop back to ``step`` until ``n`` steps are done, then wait in ``finish``."""
    return "step" if state["i"] < state["n"] else "finish"


def _graph_history(saver: Saver) -> Run:
    graph = StateGraph(Counter)
    graph.add_node("step", _step)
    graph.add_node("finish", _finish)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _to_finish, ["step", "finish"])
    graph.add_edge("finish", END)
    flow = graph.compile(checkpointer=saver)

    def run(value: Any, thread: str, steps: int) -> int:
        got = flow.invoke({"i": 0, "n": value} if isinstance(value, int) else value,
                          _config(thread, steps), durability="sync")
        return int(got["i"])

    return run


FLOWS: dict[str, dict[str, Callable[[Saver], Run]]] = {
    "functional": {"steps": _functional_steps, "paced": _functional_paced,
                   "history": _functional_history},
    "graph": {"steps": _graph_steps, "paced": _graph_paced, "history": _graph_history},
}


def _flow(args: argparse.Namespace, kind: str) -> Run:
    """The ``--api`` flow of ``kind`` on a new saver (and connection) for ``--db``/``--url``."""
    return FLOWS[args.api][kind](_saver(args))


# -- scenarios -----------------------------------------------------------------------------


def sequential(args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``--steps`` steps, one after another."""
    run = _flow(args, "steps")
    STAMPS.clear()
    assert run(args.steps, "seq", args.steps) == args.steps
    per_step = (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {"steps": args.steps, "us_per_step": per_step * 1e6,
            "us_per_step_median": statistics.median(gaps) * 1e6, "steps_per_s": 1 / per_step}


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """``--objects`` runs (threads) of ``--steps`` steps at once, one saver."""
    run = _flow(args, "steps")
    STAMPS.clear()
    with ThreadPoolExecutor(max_workers=args.objects) as pool:
        results = list(pool.map(lambda j: run(args.steps, f"conc-{j}", args.steps),
                                range(args.objects)))
    assert results == [args.steps] * args.objects
    total = args.objects * args.steps
    stamps = sorted(STAMPS)
    assert len(stamps) == total
    return {"objects": args.objects, "steps_per_object": args.steps,
            "steps_per_s": (total - 1) / (stamps[-1] - stamps[0])}


def recovery_child(args: argparse.Namespace) -> dict[str, Any]:
    """First process: start the run; later process: invoke the thread again (input None)."""
    run = _flow(args, "paced")
    inputs = {"steps": args.steps, "effects": args.effects, "pace": args.pace}
    result = run(inputs if args.first else None, "paced-1", args.steps)
    assert result == args.steps, result
    return {"result": result}


def history(args: argparse.Namespace) -> dict[str, Any]:
    """Build a run with ``--steps`` steps waiting at an interrupt; resume it, timed."""
    build = _flow(args, "history")
    build(args.steps, "history", args.steps)
    size = _store_bytes(args)
    resume = _flow(args, "history")  # a new saver and connection, as a fresh caller
    STAMPS.clear()
    began = time.perf_counter()
    result = resume(Command(resume="go"), "history", args.steps)
    assert result == args.steps and len(STAMPS) == 1, (result, len(STAMPS))
    return {"steps": args.steps, "store_bytes": size,
            "ms_invoke_to_next_step": (STAMPS[0] - began) * 1e3}


SCENARIOS = {"sequential": sequential, "concurrent": concurrent,
             "recovery-child": recovery_child, "history": history}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario, print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    store = parser.add_mutually_exclusive_group(required=True)
    store.add_argument("--db", help="SQLite file (SqliteSaver)")
    store.add_argument("--url", help="PostgreSQL database URL (PostgresSaver)")
    parser.add_argument("--api", choices=sorted(FLOWS), default="functional")
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
