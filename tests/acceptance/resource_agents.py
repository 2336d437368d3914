"""Agents holding resources, for worker processes (``--app tests.acceptance.resource_agents:app``).

The CLI rebinds ``app`` to the test's store and key directory. ``RESOURCE_STOP``
(a path) makes the step ``pause_here`` write that file and wait to be killed.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import perdure
from perdure.resources import (
    Environment,
    OpenFile,
    PostgresSession,
    Subprocess,
    WorkingDirectory,
)

__all__ = ["app", "holder"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=1.0, poll_interval=0.01)


def pause_here(pid: int) -> int:
    """Say the resources are held (``RESOURCE_STOP``), then wait to be killed."""
    stop = os.environ.get("RESOURCE_STOP")
    if stop:
        Path(stop + ".tmp").write_text(str(pid))
        os.replace(stop + ".tmp", stop)  # whole when it appears
        time.sleep(120)
    return pid


def fetch(port: int) -> int:
    """The dev server's HTTP status for /."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
        return int(reply.status)


@app.agent(name="holder")
async def holder(run: perdure.Run, base: str, pg_url: str, port: int) -> dict[str, Any]:
    """Hold a directory, environment (with a secret), dev server, PostgreSQL session and
    a half-written file; be killed in ``pause_here``; report what the next worker has."""
    work = await run.resource("wd", WorkingDirectory(Path(base) / "work"))
    env = await run.resource("env", Environment({"APP_MODE": "dev", "API_KEY": "canary-7f3a"},
                                                secret=["API_KEY"]))
    server = await run.resource("server", Subprocess(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=work, env=env, ready={"http": f"http://127.0.0.1:{port}/"}))
    db = await run.resource("db", PostgresSession(
        pg_url, settings={"search_path": "app, public", "statement_timeout": "7s",
                          "application_name": "perdure-resource-test"}))
    out = await run.resource("out", OpenFile(work / "report.txt", "w"))
    if out.tell() == 0:  # code between recorded commands runs again on resume: the
        # restored file's position says whether this part is written
        out.write("part one\n")
        await run.checkpoint_resources()
        out.write("lost after the checkpoint\n")
        out.flush()
    first_pid = await run.step(pause_here, server.pid)
    out.write("part two\n")
    out.flush()
    status = await run.step(fetch, port)
    cur = await db.execute("SELECT current_setting('search_path'), "
                           "current_setting('statement_timeout')")
    row = await cur.fetchone()
    return {"first_server_pid": first_pid, "server_pid": server.pid, "status": status,
            "settings": list(row or ()), "env": env["APP_MODE"], "cwd": str(work),
            "file": (work / "report.txt").read_text()}
