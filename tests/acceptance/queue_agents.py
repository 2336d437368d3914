"""Agents and queues of the queue acceptance tests (test code). Worker subprocesses load
``tests.acceptance.queue_agents:app``; the store and keys come from ``PERDURE_TEST_STORE``
and ``PERDURE_TEST_KEYS``; each step appends ``name time`` to ``PERDURE_TEST_DIR/starts``
as it begins."""

from __future__ import annotations

import os
import time
from pathlib import Path

import perdure

__all__ = ["QUEUES", "app", "build_app", "starts"]

QUEUES = [
    perdure.Queue("capped", concurrency=3),
    perdure.Queue("keyed", per_key=1),
    perdure.Queue("per-worker", worker_concurrency=2),
    perdure.Queue("ranked", concurrency=1, priority=True),
    perdure.Queue("paced", limiter={"limit": 3, "period": 1.0}),
]


def starts(folder: Path) -> list[tuple[str, float]]:
    """``(name, time)`` of every step begun, in the order they were written."""
    path = folder / "starts"
    if not path.exists():
        return []
    return [(name, float(at)) for name, at in
            (line.split() for line in path.read_text().splitlines() if line)]


def mark(name: str, seconds: float) -> str:
    """Note the step's start, then take ``seconds``."""
    with (Path(os.environ["PERDURE_TEST_DIR"]) / "starts").open("a") as f:
        f.write(f"{name} {time.time()}\n")
    time.sleep(seconds)
    return name


async def job(run: perdure.Run, name: str, seconds: float, naps: int = 0) -> str:
    """A step, then ``naps`` times a short sleep (dormant: no slot) and another step."""
    await run.step(mark, name, seconds)
    for n in range(naps):
        await run.sleep(0.05)
        await run.step(mark, f"{name}.{n}", seconds)
    return name


def build_app(store: str, key_dir: str | None) -> perdure.App:
    """An App on ``store`` with the queues and the agent."""
    new = perdure.App(store=store, key_dir=key_dir, lease_seconds=1.0, poll_interval=0.02)
    new.agent(name="job")(job)
    for queue in QUEUES:
        new.queue(queue)
    return new


app = build_app(os.environ.get("PERDURE_TEST_STORE", "sqlite:///perdure-acceptance.db"),
                os.environ.get("PERDURE_TEST_KEYS"))
