"""Agents the benchmarks run in separate worker processes (``--app bench.agents:app``).

The worker command line replaces the store and key folder
(``perdure --app bench.agents:app --store URL --key-dir DIR worker``).

When ``PERDURE_BENCH_GATE`` names a file, importing this module first writes
``<gate>.ready.<pid>`` and then waits until the gate file exists: the benchmark
starts several worker processes, waits until every one of them has loaded Python
and perdure, then opens the gate so that they all begin claiming at the same moment.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import perdure


async def stamp(i: int) -> float:
    """The step after each wake-up: the wall-clock time at which the agent ran again."""
    return time.time()


async def pinger(run: Any, wakes: int) -> int:
    """Wait for ``ping``, record when it woke, ``wakes`` times over."""
    for i in range(wakes):
        await run.wait_for("ping")
        await run.step(stamp, i)
    return wakes


async def one_step(run: Any, i: int) -> int:
    """One trivial step (it records when it ran), then done."""
    await run.step(stamp, i)
    return i


def paced(i: int, effects: str, pace: float) -> int:
    """A step of the crash-recovery workload: log its start and end to ``effects``, sleep.

    When ``PERDURE_BENCH_CRASH_AT`` equals ``i`` the process SIGKILLs itself after
    logging the start: the step is in flight when the process dies.
    """
    with open(effects, "a") as log:
        log.write(f"start {i} {os.getpid()} {time.time()}\n")
    if os.environ.get("PERDURE_BENCH_CRASH_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(pace)
    with open(effects, "a") as log:
        log.write(f"end {i} {os.getpid()} {time.time()}\n")
    return i


async def paced_steps(run: Any, steps: int, effects: str, pace: float) -> int:
    """``steps`` steps of ``pace`` seconds each (the crash-recovery workload)."""
    for i in range(1, steps + 1):
        await run.step(paced, i, effects, pace)
    return steps


def sync_stamp(i: int) -> float:
    """A plain ``def`` step (run on a code thread): the wall-clock time at which it ran."""
    return time.time()


async def sync_steps(run: Any, n: int) -> int:
    """``n`` plain ``def`` steps one after another (the end-to-end workloads)."""
    for i in range(n):
        await run.step(sync_stamp, i)
    return n


def sync_steps_def(run: Any, n: int) -> int:
    """The same as ``sync_steps``, written as a plain ``def`` agent (no ``await``)."""
    for i in range(n):
        run.step(sync_stamp, i)
    return n


async def one_sync_step(run: Any, i: int) -> float:
    """One plain ``def`` step, then done; the result is when the step ran."""
    ran: float = await run.step(sync_stamp, i)
    return ran


def register(target: perdure.App) -> perdure.App:
    """Register the benchmark agents with ``target`` (``pinger``, ``one_step``,
    ``paced_steps``, and the end-to-end ones: ``sync_steps``, ``sync_steps_def``,
    ``one_sync_step``)."""
    target.agent(name="pinger")(pinger)
    target.agent(name="one_step")(one_step)
    target.agent(name="paced_steps")(paced_steps)
    target.agent(name="sync_steps")(sync_steps)
    target.agent(name="sync_steps_def")(sync_steps_def)
    target.agent(name="one_sync_step")(one_sync_step)
    return target


app = register(perdure.App(store="sqlite:///perdure-bench-unused.db", node_id="bench"))


def _wait_at_gate() -> None:
    gate = os.environ.get("PERDURE_BENCH_GATE")
    if not gate:
        return
    gate_path = Path(gate)
    Path(f"{gate}.ready.{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while not gate_path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("benchmark gate never opened")
        time.sleep(0.002)


_wait_at_gate()
