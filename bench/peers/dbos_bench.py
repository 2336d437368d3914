"""DBOS (``pip install dbos``) on the benchmark workloads, one scenario per process.

``python -m bench.peers.dbos_bench SCENARIO --url SYSTEM_DB_URL ...`` prints one JSON
document. DBOS keeps its state in a system database (``sqlite:///FILE`` or
``postgresql://...``); a durable workflow (``@DBOS.workflow()``) records each
``@DBOS.step()``'s output before going on, and a process that launches DBOS recovers
the workflows its executor left pending. Only DBOS's documented public API is used:
``DBOS(config=...)``, ``DBOS.launch``, ``@DBOS.workflow``, ``@DBOS.step``,
``DBOS.start_workflow``, ``DBOS.recv``, ``DBOSClient.send``.

Scenarios: ``sequential``, ``concurrent``, ``start-result`` (one-step workflows started
and awaited one after another), ``idle`` (the process's CPU with DBOS launched and
nothing to do), ``recovery-child`` (one process of the
crash-recovery workload), ``wake`` (a sender process; the workflows run in a
``wake-child`` process; ``--budget S`` starts no new round of wakes after S seconds,
since with SQLite's default one-second polling each wake takes about a second),
``history-build`` and ``history-resume`` (the resume-cost workload; the parent kills
the build process once the workflow waits).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig, SetWorkflowID

STAMPS: list[float] = []


def _launch(url: str, poll: float = 0.0) -> None:
    config: DBOSConfig = {"name": "perdure-bench", "system_database_url": url,
                          "log_level": "ERROR"}
    if poll > 0:  # how often a waiting recv looks for messages (SQLite has no push)
        config["notification_listener_polling_interval_sec"] = poll
    DBOS(config=config)
    DBOS.launch()


# -- workflows (registered at import, before DBOS is configured) -------------------------


@DBOS.step()
def trivial(i: int) -> int:
    """Record when the step ran; return its argument."""
    STAMPS.append(time.perf_counter())
    return i


@DBOS.workflow()
def steps_workflow(n: int) -> int:
    """``n`` trivial steps one after another."""
    for i in range(n):
        trivial(i)
    return n


@DBOS.step()
def wall_time(i: int) -> float:
    """The wall-clock time at which the step ran (the start → result workload)."""
    return time.time()


@DBOS.workflow()
def one_step_workflow(i: int) -> float:
    """One step, then done; the result is when the step ran."""
    ran: float = wall_time(i)
    return ran


@DBOS.step()
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


@DBOS.workflow()
def paced_workflow(n: int, effects: str, pace: float) -> int:
    """``n`` paced steps."""
    for i in range(1, n + 1):
        paced(i, effects, pace)
    return n


@DBOS.step()
def wall_stamp(path: str) -> float:
    """Append the wall-clock time to ``path`` (the step after each wake)."""
    now = time.time()
    with open(path, "a") as out:
        out.write(f"{now}\n")
    return now


@DBOS.workflow()
def pinger(wakes: int, path: str) -> int:
    """Wait for a ``ping`` message, then a step stamping the time; ``wakes`` times."""
    for _ in range(wakes):
        DBOS.recv("ping", timeout_seconds=120)
        wall_stamp(path)
    return wakes


@DBOS.step()
def marker(path: str) -> None:
    """Say (in a file) that the history is written and the workflow is about to wait."""
    Path(path).write_text("ready")


@DBOS.step()
def resumed_stamp(i: int) -> float:
    """The first new step after the resume: when it ran."""
    STAMPS.append(time.perf_counter())
    return time.time()


@DBOS.workflow()
def history_workflow(n: int, marker_path: str) -> int:
    """``n`` trivial steps, wait for ``go``, one more step."""
    for i in range(n):
        trivial(i)
    marker(marker_path)
    DBOS.recv("go", timeout_seconds=300)
    resumed_stamp(n)
    return n


# -- scenarios -------------------------------------------------------------------------


def sequential(args: argparse.Namespace) -> dict[str, Any]:
    """One workflow of ``--steps`` trivial steps, timed inside the steps."""
    _launch(args.url)
    STAMPS.clear()
    result = DBOS.start_workflow(steps_workflow, args.steps).get_result()
    assert result == args.steps and len(STAMPS) == args.steps
    per_step = (STAMPS[-1] - STAMPS[0]) / (len(STAMPS) - 1)
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {"steps": args.steps, "us_per_step": per_step * 1e6,
            "us_per_step_median": statistics.median(gaps) * 1e6, "steps_per_s": 1 / per_step}


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """``--objects`` workflows of ``--steps`` steps started at once."""
    _launch(args.url)
    STAMPS.clear()
    handles = [DBOS.start_workflow(steps_workflow, args.steps) for _ in range(args.objects)]
    for handle in handles:
        assert handle.get_result() == args.steps
    total = args.objects * args.steps
    assert len(STAMPS) == total
    stamps = sorted(STAMPS)
    return {"objects": args.objects, "steps_per_object": args.steps,
            "steps_per_s": (total - 1) / (stamps[-1] - stamps[0])}


def start_result(args: argparse.Namespace) -> dict[str, Any]:
    """``--objects`` one-step workflows one after another, each started and its result
    awaited before the next; milliseconds per pair."""
    _launch(args.url)
    total, start_calls, to_step = [], [], []
    for i in range(args.objects):
        wall = time.time()
        began = time.perf_counter()
        handle = DBOS.start_workflow(one_step_workflow, i)
        called = time.perf_counter()
        ran = handle.get_result()
        total.append((time.perf_counter() - began) * 1e3)
        start_calls.append((called - began) * 1e3)
        to_step.append((ran - wall) * 1e3)
    return {"pairs": args.objects, "ms_values": total,
            "start_call_ms_median": statistics.median(start_calls),
            "start_to_step_ms_median": statistics.median(to_step)}


def idle(args: argparse.Namespace) -> dict[str, Any]:
    """Launch DBOS with no workflow, wait a second, then this process's CPU time over
    ``--pace`` seconds as a share of one core."""
    _launch(args.url)
    time.sleep(1.0)
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(args.pace)
    cpu1, wall1 = time.process_time(), time.monotonic()
    return {"seconds": wall1 - wall0, "cpu_seconds": cpu1 - cpu0,
            "percent_of_core": (cpu1 - cpu0) / (wall1 - wall0) * 100}


def recovery_child(args: argparse.Namespace) -> dict[str, Any]:
    """Launch DBOS; the first process starts the workflow, a later one recovers it."""
    _launch(args.url)
    if args.first:
        with SetWorkflowID("paced-1"):
            handle = DBOS.start_workflow(paced_workflow, args.steps, args.effects, args.pace)
    else:
        handle = DBOS.retrieve_workflow("paced-1")
    return {"result": handle.get_result()}


def _start_child(args: list[str], log: Path, env: dict[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "bench.peers.dbos_bench", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def wake_child(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``--objects`` pinger workflows until they finish."""
    _launch(args.url, args.poll)
    handles = []
    for j in range(args.objects):
        with SetWorkflowID(f"pinger-{j}"):
            handles.append(DBOS.start_workflow(pinger, args.wakes, f"{args.stamps}.{j}"))
    return {"results": [h.get_result() for h in handles]}


def _pending(client: DBOSClient) -> list[Any]:
    try:
        return list(client.list_workflows(status="PENDING"))
    except Exception:  # the child has not created the system tables yet
        return []


def wake(args: argparse.Namespace) -> dict[str, Any]:
    """Send ``ping`` messages from this process to workflows in a ``wake-child`` process."""
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamps = folder / "stamps"
    child = _start_child(["wake-child", "--url", args.url, "--objects", str(args.objects),
                          "--wakes", str(args.wakes), "--stamps", str(stamps),
                          "--poll", str(args.poll)],
                         folder / "child.log")
    client = DBOSClient(system_database_url=args.url)
    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while len(_pending(client)) < args.objects:
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the DBOS wake child did not start its workflows")
            time.sleep(0.01)
        # Round by round over the workflows, so that a time budget that stops the run
        # early leaves every workflow with the same number of wakes.
        began = time.monotonic()
        for k in range(args.wakes):
            if args.budget > 0 and k > 0 and time.monotonic() - began > args.budget:
                break
            for j in range(args.objects):
                path, wf_id = Path(f"{stamps}.{j}"), f"pinger-{j}"
                time.sleep(0.05 + random.uniform(0, 0.02))  # it is waiting in recv again
                sent = time.time()
                client.send(wf_id, None, "ping")
                deadline = time.monotonic() + 60
                while True:
                    lines = [x for x in (path.read_text().split() if path.exists() else [])
                             if x]
                    if len(lines) > k:
                        latencies.append((float(lines[k]) - sent) * 1e3)
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("a DBOS workflow did not wake")
                    time.sleep(0.0005)
        seconds = time.monotonic() - began
    finally:
        child.terminate()
        child.wait(timeout=30)
        client.destroy()
    return {"wakes": len(latencies), "wakes_planned": args.objects * args.wakes,
            "objects": args.objects, "seconds": seconds, "budget_s": args.budget or None,
            "ms_p50": statistics.median(latencies), "ms_values": latencies}


def history_build(args: argparse.Namespace) -> dict[str, Any]:
    """Start the history workflow; the parent SIGKILLs this process once it waits."""
    _launch(args.url)
    DBOS.start_workflow(history_workflow, args.steps, args.marker).get_result()
    return {}


def history_resume(args: argparse.Namespace) -> dict[str, Any]:
    """Send ``go`` to the pending workflow, launch DBOS (which recovers it), time it."""
    client = DBOSClient(system_database_url=args.url)
    pending = client.list_workflows(status="PENDING")
    assert len(pending) == 1, pending
    client.send(pending[0].workflow_id, "go", "go")
    client.destroy()
    STAMPS.clear()
    began = time.perf_counter()
    _launch(args.url)
    launched = time.perf_counter()
    deadline = time.monotonic() + 600
    while not STAMPS:
        if time.monotonic() > deadline:
            raise TimeoutError("the recovered workflow did not take its next step")
        time.sleep(0.0005)
    result: int = DBOS.retrieve_workflow(pending[0].workflow_id).get_result()
    assert result == args.steps
    return {"steps": args.steps, "ms_launch_to_next_step": (STAMPS[0] - began) * 1e3,
            "ms_launch_call": (launched - began) * 1e3}


SCENARIOS = {
    "sequential": sequential, "concurrent": concurrent, "start-result": start_result,
    "idle": idle,
    "recovery-child": recovery_child,
    "wake": wake, "wake-child": wake_child, "history-build": history_build,
    "history-resume": history_resume,
}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario, print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--objects", type=int, default=1)
    parser.add_argument("--wakes", type=int, default=1)
    parser.add_argument("--effects", default="")
    parser.add_argument("--pace", type=float, default=0.005)
    parser.add_argument("--first", action="store_true")
    parser.add_argument("--stamps", default="")
    parser.add_argument("--folder", default="")
    parser.add_argument("--marker", default="")
    parser.add_argument("--poll", type=float, default=0.0)
    parser.add_argument("--budget", type=float, default=0.0,
                        help="wake: stop starting new rounds of wakes after this many seconds")
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.ERROR)
    try:
        figures = SCENARIOS[args.scenario](args)
    finally:
        if args.scenario not in ("wake", "history-build"):
            DBOS.destroy(destroy_registry=False)
    json.dump(figures, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    os._exit(0)  # do not wait for DBOS's background threads


if __name__ == "__main__":
    sys.exit(main())
