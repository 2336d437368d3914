"""Agents for the asyncio client tests (``app.aio``), run by a worker subprocess:
``perdure --app tests.integration.aio_support:app worker`` (the CLI rebinds ``app`` to the
test's store and key folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import perdure
from tests.integration.engine_support import REPO_ROOT

__all__ = ["app", "register", "start_aio_worker"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=5.0)


def double(value: int) -> int:
    """A step: twice ``value``."""
    return 2 * value


def noop() -> str:
    """A step that does nothing."""
    return "ok"


async def aio_quick(run: perdure.Run, value: Any) -> Any:
    """End at once with ``value``."""
    return value


async def aio_waiter(run: perdure.Run, value: int) -> Any:
    """Double ``value`` in a step, emit it, then wait for ``go`` and return its payload."""
    doubled = await run.step(double, value)
    await run.emit("doubled", doubled)
    return await run.wait_for("go")


async def aio_asker(run: perdure.Run) -> Any:
    """Ask which colour; return the answer."""
    return await run.wait_for("colour", prompt="Which colour?", choices=["red", "blue"])


async def aio_failer(run: perdure.Run) -> Any:
    """Fail for good at once."""
    raise ValueError("no such luck")


async def aio_drifter(run: perdure.Run, flag: str) -> str:
    """Record a step whose name depends on whether the file ``flag`` exists (on purpose
    not recorded: with the file made after the first run, replay no longer matches
    memory and the object parks), then wait for ``go``."""
    await run.step(noop, name="drifted" if os.path.exists(flag) else "fixed")
    await run.wait_for("go")
    return "done"


def doubled_of(view: perdure.MemoryView) -> Any:
    """Query: the value the waiter emitted."""
    return view.last_emitted("doubled")


def register(target: perdure.App) -> perdure.App:
    """Register the agents and the query of this module with ``target``."""
    for fn in (aio_quick, aio_waiter, aio_asker, aio_failer, aio_drifter):
        target.agent(name=fn.__name__)(fn)
    target.define_query(agent="aio_waiter", name="doubled")(doubled_of)
    return target


register(app)


def start_aio_worker(store_url: str, key_dir: Path, log: Path, *, concurrency: int = 8
                     ) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` in a child process, logging to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.aio_support:app", "worker", "--lease", "5",
             "--poll", "0.5", "--concurrency", str(concurrency)],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
