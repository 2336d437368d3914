"""Resources across a SIGKILL: another worker process restores everything, or nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import perdure
from perdure.describe import timeline
from tests.acceptance import resource_agents
from tests.pg import ADMIN_URL, needs_server

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(store_url: str, key_dir: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.acceptance.resource_agents:app", "worker", "--lease", "1",
             "--poll", "0.01"],
            cwd=REPO_ROOT, env=full, stdout=sink, stderr=subprocess.STDOUT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


@needs_server  # a PostgresSession resource, whatever the store
def test_everything_comes_back_on_another_worker(store_url: str, key_dir: Path,
                                                 tmp_path: Path) -> None:
    """Directory, environment with a secret, dev server, PostgreSQL session with settings
    and a half-written file, held by a worker that is SIGKILLed: the next worker process
    restores all five before the agent goes on, and the restore report says so."""
    app = resource_agents.app.with_settings(store=store_url, key_dir=key_dir)
    port = _free_port()
    handle = app.start("holder", str(tmp_path), ADMIN_URL, port)
    stop = tmp_path / "stop"
    first = _worker(store_url, key_dir, tmp_path / "w1.log", RESOURCE_STOP=str(stop))
    try:
        deadline = time.monotonic() + 60
        while not stop.exists():
            assert time.monotonic() < deadline and first.poll() is None, \
                (tmp_path / "w1.log").read_text()
            time.sleep(0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    old_server = int(stop.read_text())
    deadline = time.monotonic() + 10
    while _alive(old_server):  # it dies with its worker (parent-death signal)
        assert time.monotonic() < deadline, "the dev server outlived its worker"
        time.sleep(0.02)
    second = _worker(store_url, key_dir, tmp_path / "w2.log")
    try:
        result: dict[str, Any] = handle.result(timeout=60)
    finally:
        second.terminate()
        second.wait(timeout=20)
    assert result["status"] == 200 and result["server_pid"] != old_server
    assert result["settings"] == ["app, public", "7s"]
    assert result["env"] == "dev" and result["cwd"] == str(tmp_path / "work")
    assert result["file"] == "part one\npart two\n"
    reports = [r.body for r in app.history(handle.object_id)
               if r.kind == perdure.Kind.RESTORE_REPORT]
    assert [r["outcome"] for r in reports] == ["restored"]
    assert [(e["name"], e["status"]) for e in reports[0]["resources"]] == [
        ("wd", "restored"), ("env", "restored"), ("server", "restored"), ("db", "restored"),
        ("out", "restored")]
    shown = "\n".join(row.what for row in timeline(app.history(handle.object_id)))
    assert "restore restored" in shown and "server restored" in shown
    assert "canary-7f3a" not in shown
    app.verify(handle.object_id)
    app.close()


def _open_files(under: Path) -> list[str]:
    """Files under ``under`` this process holds open, but the store's own."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)) and "store.db" not in target:
            found.append(target)
    return found


def _pg_sessions(name: str) -> int:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (name,)).fetchone()
    return int(row[0]) if row else 0


@needs_server  # a PostgresSession resource, whatever the store
def test_rollback_when_the_third_of_four_fails_leaks_nothing(
        make_app: Any, tmp_path: Path) -> None:
    """The third of four resources (a file deleted while the object slept) cannot be
    restored: the dev server and the PostgreSQL session restored before it are closed
    again (no process, connection or file handle left), the fourth is never opened, and
    the report says which was which."""
    from perdure.resources import OpenFile, PostgresSession, Subprocess

    app = make_app()
    port = _free_port()
    appname = f"perdure-rollback-{os.getpid()}"
    doomed = tmp_path / "doomed.txt"
    pids: list[int] = []

    @app.agent(name="four")
    async def four(run: perdure.Run) -> str:
        server = await run.resource("server", Subprocess(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            ready={"tcp": ["127.0.0.1", port]}))
        pids.append(server.pid)
        await run.resource("db", PostgresSession(f"{ADMIN_URL}?application_name={appname}"))
        await run.resource("doomed", OpenFile(doomed, "w"))
        await run.resource("last", OpenFile(tmp_path / "last.txt", "w"))
        await run.sleep(0.05)
        return "unreachable"

    handle = app.options(object_id="four-rb").start("four")
    with app.background_worker():
        deadline = time.monotonic() + 20
        while not any(r.kind == perdure.Kind.DORMANT for r in app.history("four-rb")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        doomed.unlink()
        while not any(r.kind == perdure.Kind.RESTORE_REPORT for r in app.history("four-rb")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
    [report] = [r.body for r in app.history("four-rb") if r.kind == perdure.Kind.RESTORE_REPORT]
    assert report["outcome"] == "moved"
    assert [(e["name"], e["status"], e.get("rolled_back", False))
            for e in report["resources"]] == [
        ("server", "restored", True), ("db", "restored", True), ("doomed", "failed", False),
        ("last", "not restored", False)]
    assert "does not exist on this node" in report["resources"][2]["reason"]
    assert len(pids) == 1 and not _alive(pids[0])
    assert _pg_sessions(appname) == 0
    assert _open_files(tmp_path) == [], "no file handle of a resource left open"
    missing = [r.body for r in app.history("four-rb") if r.kind == perdure.Kind.CAPABILITY_MISSING]
    assert missing and missing[0]["cannot_do"] == "resource doomed"
    assert handle.object_id == "four-rb"
