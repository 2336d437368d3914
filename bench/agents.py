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


def register(target: perdure.App) -> perdure.App:
    """Register the benchmark agents with ``target`` (by name: ``pinger``, ``one_step``)."""
    target.agent(name="pinger")(pinger)
    target.agent(name="one_step")(one_step)
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
