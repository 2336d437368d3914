"""Agents of the node-behaviour acceptance tests (test code): stopping a worker, a node
that lacks what an object needs, a restored server whose port someone else holds.

Worker subprocesses load ``tests.acceptance.node_agents:app``; the store and keys come
from ``PERDURE_TEST_STORE`` and ``PERDURE_TEST_KEYS``; ``PERDURE_TEST_DIR`` is a folder
where steps leave what the tests read (a line per run of a step, a file when a step
starts).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from perdure.resources import Subprocess

__all__ = ["app", "build_app", "runs"]


def _dir() -> Path:
    return Path(os.environ["PERDURE_TEST_DIR"])


def runs(folder: Path, name: str) -> list[str]:
    """The lines the runs of step ``name`` left in ``folder`` (one per run)."""
    path = folder / f"{name}.runs"
    return path.read_text().splitlines() if path.exists() else []


def slow(name: str, seconds: float) -> str:
    """Say it started (a file), take ``seconds``, then count the run (a line)."""
    folder = _dir()
    (folder / f"{name}.started").write_text(str(os.getpid()))
    time.sleep(seconds)
    with (folder / f"{name}.runs").open("a") as f:
        f.write(f"{os.getpid()}\n")
    return f"{name} done"


async def drained(run: perdure.Run, name: str, seconds: float) -> list[str]:
    """A slow step, then a quick one."""
    first = await run.step(slow, name, seconds)
    second = await run.step(slow, f"{name}-after", 0.0)
    return [first, second]


async def keyed(run: perdure.Run) -> str:
    """Needs ``PERDURE_TEST_CREDENTIAL`` on the node (as a model client needs its key)."""
    from perdure.errors import NodeLacksError

    if not os.environ.get("PERDURE_TEST_CREDENTIAL"):
        raise NodeLacksError("no credential: set PERDURE_TEST_CREDENTIAL on this node")
    return await run.step(slow, "keyed", 0.0)


async def broken(run: perdure.Run) -> str:
    """Fails for good: the agent's own bug."""
    raise ValueError("the agent's own bug")


async def served(run: perdure.Run, port: int) -> dict[str, Any]:
    """Hold a dev server on ``port``, then wait for an event (its worker is killed)."""
    server = await run.resource("server", Subprocess(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=str(_dir()), ready={"http": f"http://127.0.0.1:{port}/"}, ready_timeout=10))
    await run.wait_for("go")
    return {"pid": server.pid, "alive": server.alive()}


def build_app(store: str, key_dir: str | None) -> perdure.App:
    """An App on ``store`` with these agents."""
    new = perdure.App(store=store, key_dir=key_dir, lease_seconds=2.0, poll_interval=0.02)
    new.agent(name="drained")(drained)
    new.agent(name="keyed")(keyed)
    new.agent(name="broken")(broken)
    new.agent(name="served")(served)
    return new


app = build_app(os.environ.get("PERDURE_TEST_STORE", "sqlite:///perdure-acceptance.db"),
                os.environ.get("PERDURE_TEST_KEYS"))
