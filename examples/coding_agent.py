"""A "coding agent" (no LLM) whose runtime comes back after its worker is killed.

Run it: python examples/coding_agent.py [FOLDER]   (default: ./coding-agent-demo)

The agent clones a local git repository (the example creates it), works in the clone,
holds an environment with a secret token, starts a dev server (``python -m http.server``)
with a readiness probe, and runs a 20-statement migration on a SQLite database with a
progress marker after each statement. Its first worker process is SIGKILLed after
statement 12; a second worker process restores the working directory, the environment
and the dev server (probed before the agent continues), validates that the clone's git
HEAD did not move, resumes the migration at statement 13, and runs the "tests" against
the dev server. The restore report in memory says what came back and how long it took.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import perdure
from perdure.describe import timeline
from perdure.resources import Environment, GitHead, Invalidate, Subprocess, WorkingDirectory

FOLDER = Path(os.environ.get("CODING_AGENT_DIR", "coding-agent-demo")).absolute()
app = perdure.App(store=f"sqlite:///{FOLDER / 'store.db'}", key_dir=str(FOLDER / "keys"),
                  lease_seconds=1.0, poll_interval=0.01)
STATEMENTS = 20
GIT = shutil.which("git") or "git"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run([GIT, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_source_repo(where: Path) -> Path:
    """A small repository to clone: a page the dev server serves, and a migration (made
    once; a later run clones the same one)."""
    if (where / ".git").exists():
        return where
    where.mkdir(parents=True, exist_ok=True)
    (where / "index.html").write_text("<h1>hello from the clone</h1>\n")
    (where / "migration.sql").write_text("".join(
        f"CREATE TABLE t{i:02d} (id INTEGER PRIMARY KEY);\n" for i in range(1, STATEMENTS + 1)))
    _git("init", "-q", cwd=where)
    _git("add", ".", cwd=where)
    _git("-c", "user.name=demo", "-c", "user.email=demo@example.org", "commit", "-qm",
         "initial", cwd=where)
    return where


def clone(source: str, target: str) -> str:
    """Clone ``source`` into ``target`` (kept if a crash left it complete); its HEAD."""
    if not (Path(target) / ".git").exists():
        subprocess.run([GIT, "clone", "-q", source, target], check=True)
    return _git("rev-parse", "HEAD", cwd=Path(target))


def migrate(repo: str) -> dict[str, Any]:
    """Apply migration.sql one statement at a time (each commits on its own), with a
    durable progress marker after each; a retry resumes after the last one."""
    step = perdure.current_step()
    done = int(step.last_checkpoint or 0)
    statements = [s for s in (Path(repo) / "migration.sql").read_text().split(";\n") if s]
    conn = sqlite3.connect(Path(repo) / "app.db", isolation_level=None)
    try:
        for i, sql in enumerate(statements[done:], start=done + 1):
            conn.execute(sql)
            step.checkpoint(i, durable=True)
            if os.environ.get("CODING_STOP_AT") == str(i):  # for the demonstration
                Path(os.environ["CODING_SIGNAL"]).write_text(str(i))
                time.sleep(120)
    finally:
        conn.close()
    return {"resumed_at": done + 1, "applied": len(statements)}


def run_tests(port: int) -> str:
    """The "test suite": the dev server serves the clone's page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=5) as reply:
        return reply.read().decode().strip()


@app.agent(name="coding_agent")
async def coding_agent(run: perdure.Run, source: str, port: int) -> dict[str, Any]:
    """Clone, hold the runtime, migrate, test (in a working directory of its own)."""
    work = await run.resource("work", WorkingDirectory(FOLDER / "work" / run.object_id))
    repo = str(work / "repo")
    head = await run.step(clone, source, repo)
    await run.resource("repo", WorkingDirectory(repo, create=False, checks=[GitHead(repo)],
                                                on_stale=Invalidate("run_tests")))
    env = await run.resource("env", Environment(
        {"APP_ENV": "dev", "DEPLOY_TOKEN": "tok-" + "x" * 16}, secret=["DEPLOY_TOKEN"]))
    server = await run.resource("server", Subprocess(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=repo,
        env=env, ready={"http": f"http://127.0.0.1:{port}/"}))
    migration = await run.step(migrate, repo)
    page = await run.step(run_tests, port, name="run_tests")
    return {"head": head[:12], "migration": migration, "page": page,
            "server_pid": server.pid}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    here = Path(__file__).resolve().parent
    return subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "coding_agent:app", "worker", "--lease",
         "1", "--poll", "0.01"], cwd=here, env={**env, "CODING_AGENT_DIR": str(FOLDER)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    """Create the repository, start the agent, kill its worker after statement 12, and
    let a second worker finish; print the result and the restore report."""
    source = make_source_repo(FOLDER / "source")
    handle = app.start(coding_agent, str(source), _free_port())
    signal_file = FOLDER / "stopped"
    signal_file.unlink(missing_ok=True)
    first = _worker({**os.environ, "CODING_STOP_AT": "12", "CODING_SIGNAL": str(signal_file)})
    deadline = time.monotonic() + 60
    while not signal_file.exists():
        if time.monotonic() > deadline or first.poll() is not None:
            raise SystemExit("the first worker did not reach statement 12")
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    print("worker killed after migration statement 12")
    second = _worker(dict(os.environ))
    try:
        result = handle.result(timeout=60)
    finally:
        second.terminate()
        second.wait()
    print("result:", result)
    for row in timeline(app.history(handle.object_id)):
        if row.kind in ("restore_report", "invalidated"):
            print(f"{row.kind}: {row.what}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["CODING_AGENT_DIR"] = sys.argv[1]
        FOLDER = Path(sys.argv[1]).absolute()
        app = app.with_settings(store=f"sqlite:///{FOLDER / 'store.db'}",
                                key_dir=str(FOLDER / "keys"))
    FOLDER.mkdir(parents=True, exist_ok=True)
    main()
