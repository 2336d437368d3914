"""Agents for the schedule tests, also run by worker subprocesses.

``perdure --app tests.integration.schedule_support:app worker`` loads ``app``; the CLI
rebinds it to the test's store and key folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from perdure.core.records import Kind
from tests.integration.engine_support import REPO_ROOT, mark

__all__ = ["app", "delegated", "fires_of", "register", "start_worker"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)


async def tick(run: perdure.Run, marks: str) -> str:
    """Note that this run began (its id, in ``marks``) and end."""
    await run.step(mark, marks, run.object_id, name="mark")
    return run.object_id


async def hold(run: perdure.Run) -> Any:
    """Stay live until the event ``release`` comes."""
    return await run.wait_for("release")


async def clock(run: perdure.Run) -> float:
    """When the run first ran."""
    return float(await run.step(time.time, name="clock"))


def register(target: perdure.App) -> perdure.App:
    """Register the agents above on ``target``."""
    target.agent(name="tick")(tick)
    target.agent(name="hold")(hold)
    target.agent(name="clock")(clock)
    return target


register(app)


def start_worker(store_url: str, key_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """``perdure worker`` on ``app`` in a child process, logging to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.schedule_support:app", "worker", "--lease", "2",
             "--poll", "0.01", "--concurrency", "8"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)


def delegated(target: perdure.App, schedule: str) -> list[str]:
    """The runs the schedule's memory says it started, in order."""
    return [str(r.body["child_id"]) for r in target.history(f"schedule:{schedule}")
            if r.kind == Kind.DELEGATED]


def fires_of(target: perdure.App, schedule: str) -> list[str]:
    """The ids of the runs in the store that name ``schedule`` as parent, sorted."""
    return sorted(info.object_id for info in target.list(parent=f"schedule:{schedule}",
                                                         limit=10_000))
