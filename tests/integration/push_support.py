"""Agents and helpers for the pushed wake-up tests, run by worker subprocesses.

``perdure --app tests.integration.push_support:app worker`` loads ``app``; the CLI
rebinds it to the test's store and key folder.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import perdure
from perdure.stores import sqlite_file
from tests.integration.engine_support import REPO_ROOT

__all__ = ["app", "nudge", "start_worker", "wake_folder"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=5.0)


@app.agent(name="push_waiter")
async def push_waiter(run: perdure.Run) -> object:
    """Wait for ``go``; return its payload."""
    return await run.wait_for("go")


@app.agent(name="push_emitter")
async def push_emitter(run: perdure.Run) -> str:
    """Wait for ``go``, emit ``hello``, then wait for ``stop``."""
    await run.wait_for("go")
    await run.emit("hello", 1)
    await run.wait_for("stop")
    return "stopped"


@app.agent(name="push_quick")
async def push_quick(run: perdure.Run) -> str:
    """End at once."""
    return "quick"


@app.agent(name="push_sleeper")
async def push_sleeper(run: perdure.Run, seconds: float) -> float:
    """Sleep ``seconds`` (released with a timer), then return the time it ran again."""
    await run.sleep(seconds)
    return await run.step(time.time, name="woke")


def start_worker(store_url: str, key_dir: Path, log: Path, *, poll: float
                 ) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` in a child process polling every ``poll``
    seconds where it cannot be pushed (its idle safety look too), logging to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.push_support:app", "worker", "--lease", "5",
             "--poll", f"{poll:g}", "--concurrency", "4"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )


def wake_folder(store_url: str) -> Path:
    """The folder of wake-up sockets beside a SQLite store's file."""
    path = sqlite_file(store_url)
    assert path is not None, store_url
    return Path(f"{path}.wake")


def nudge(store_url: str) -> None:
    """Push "look again" to every idle node of the store, from outside perdure: a
    ``NOTIFY`` on PostgreSQL, a datagram to each socket of the folder on SQLite."""
    if store_url.startswith(("postgresql:", "postgres:")):
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('perdure_wake', '')")
        return
    folder = wake_folder(store_url)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for name in os.listdir(folder) if folder.is_dir() else ():
            if "w" in name.split(".")[0]:
                with contextlib.suppress(OSError):  # its owner is gone
                    sender.sendto(b"w", str(folder / name))
