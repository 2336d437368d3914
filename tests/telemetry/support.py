"""Agents for the telemetry tests' worker processes, and helpers to run and read them.

``app`` is what ``perdure --app tests.telemetry.support:app worker`` loads; the CLI
rebinds it to the test's store and key folder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import perdure
from tests.integration.engine_support import REPO_ROOT, wait_until

__all__ = ["REPO_ROOT", "app", "start_worker", "wait_for_line"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=1.0, poll_interval=0.01)
log = logging.getLogger("tests.telemetry")
FAST = perdure.RetryPolicy(max_attempts=3, base=0.02, cap=0.05)


def _pause(seconds: float, i: int, steps: int) -> float:
    time.sleep(seconds)
    log.warning("step %d of %d done", i + 1, steps, extra={"action": "test_step"})
    return seconds


def _flaky(marks: str) -> str:
    """Fails the first time (a connection reset: retried), then succeeds."""
    path = Path(marks)
    if not path.exists():
        path.write_text("failed once\n")
        raise ConnectionResetError("the first attempt fails")
    return "ok"


@app.agent(name="chain")
async def chain(run: perdure.Run, steps: int, seconds: float = 0.0) -> int:
    """``steps`` steps (each sleeping ``seconds`` on a code thread and logging)."""
    total = 0
    for i in range(steps):
        await run.step(_pause, seconds, i, steps, name=f"s{i % 4}")
        total += 1
    return total


@app.agent(name="flaky")
async def flaky(run: perdure.Run, marks: str) -> str:
    """One step that fails once and is retried, then a short sleep (dormancy, wake)."""
    out = await run.step(_flaky, marks, retry=FAST, name="flaky")
    await run.sleep(0.05)
    await asyncio.sleep(0)
    return str(out)


def start_worker(store_url: str, key_dir: Path, log_path: Path, *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``perdure worker`` on ``app`` in a child process, stdout and stderr to
    ``log_path``."""
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    with open(log_path, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir",
             str(key_dir), "--app", "tests.telemetry.support:app", "worker", "--lease", "1",
             "--poll", "0.01", "--concurrency", "4", "--drain", "2", *extra],
            cwd=REPO_ROOT, env=environ, stdout=sink, stderr=subprocess.STDOUT)


def wait_for_line(log_path: Path, pattern: str, proc: subprocess.Popen[bytes],
                  timeout: float = 30.0) -> re.Match[str]:
    """The first match of ``pattern`` in the process's log, once it is written."""
    found: list[re.Match[str]] = []

    def seen() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited: {log_path.read_text()[-2000:]}")
        match = re.search(pattern, log_path.read_text(errors="replace"))
        if match:
            found.append(match)
        return bool(match)

    assert wait_until(seen, timeout=timeout), log_path.read_text()[-2000:]
    return found[0]
