"""What a real ``perdure worker`` process does when it is stopped, when it lacks what an
object needs, and when a resource it restores is not really its own.

- Ctrl-C (SIGINT) during a step that finishes within ``--drain``: the worker says what it
  waits for, the step is recorded once and never run again; a second Ctrl-C lets go at
  once (the process exits although its step still runs).
- A worker without the credential an object needs leaves it (a negative capability, a
  note saying why); a worker that has it finishes it; nothing is failed. A real failure
  is logged at WARNING with the object id and the reason.
- A dev server restored on a node where another program holds its port: the restore
  fails (never "restored"), and the object says no live node can take it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from tests.acceptance.harness import PERDURE_CMD, REPO_ROOT, Cluster, WorkerProc, wait_until
from tests.acceptance.node_agents import build_app, runs

APP_SPEC = "tests.acceptance.node_agents:app"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "work"
    made.mkdir()
    return made


@pytest.fixture
def app(cluster: Cluster) -> Iterator[perdure.App]:
    made = build_app(cluster.store_url, str(cluster.key_dir))
    yield made
    made.close()


def spawn(cluster: Cluster, folder: Path, *args: str, env: dict[str, str] | None = None,
          drop: tuple[str, ...] = ()) -> WorkerProc:
    """``perdure worker`` on the node agents, with its own node id and log."""
    node_id = f"n{len(cluster.workers):02d}"
    log_path = cluster.log_dir / f"{node_id}.log"
    environ = {**cluster.env(node_id), "PERDURE_TEST_DIR": str(folder), **(env or {})}
    for name in drop:
        environ.pop(name, None)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PERDURE_CMD, "--app", APP_SPEC, "--node-id", node_id, "worker", "--lease", "2",
             "--poll", "0.02", *args],
            cwd=REPO_ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    worker = WorkerProc(node_id, proc, log_path)
    cluster.workers.append(worker)
    return worker


def test_first_ctrl_c_records_the_running_step(cluster: Cluster, app: perdure.App,
                                              folder: Path) -> None:
    worker = spawn(cluster, folder, "--drain", "30")
    wait_until("the worker to start", worker.ready, 60)
    handle = app.options(object_id="drain-1").start("drained", "slow", 3.0)
    wait_until("the slow step to start", (folder / "slow.started").exists, 30)
    worker.proc.send_signal(signal.SIGINT)
    wait_until("the worker to say what it waits for",
               lambda: "waiting up to 30 s" in worker.log(), 10)
    assert "drain-1 (step 'slow'" in worker.log()
    assert worker.proc.wait(timeout=60) == 0, worker.log()
    assert runs(folder, "slow") == [str(worker.pid)]  # finished within the drain
    done = [r for r in app.history("drain-1") if r.kind == "step_done"]
    assert [r.body["name"] for r in done] == ["slow"]  # recorded before it let go
    assert app.get("drain-1").status is perdure.Status.READY
    second = spawn(cluster, folder)
    assert handle.result(timeout=60) == ["slow done", "slow-after done"]
    assert runs(folder, "slow") == [str(worker.pid)]  # never run again
    assert runs(folder, "slow-after") == [str(second.pid)]


def test_second_ctrl_c_lets_go_at_once(cluster: Cluster, app: perdure.App,
                                       folder: Path) -> None:
    worker = spawn(cluster, folder, "--drain", "120")
    wait_until("the worker to start", worker.ready, 60)
    handle = app.options(object_id="drain-2").start("drained", "endless", 600.0)
    wait_until("the long step to start", (folder / "endless.started").exists, 30)
    worker.proc.send_signal(signal.SIGINT)
    wait_until("the worker to say what it waits for",
               lambda: "drain-2 (step 'slow'" in worker.log(), 10)
    worker.proc.send_signal(signal.SIGINT)
    # Exits well before its 120 s drain and its 600 s step would have ended.
    assert worker.proc.wait(timeout=20) == 0, worker.log()
    assert "abandoned step 'slow'" in worker.log()
    assert runs(folder, "endless") == []
    info = app.get("drain-2")
    assert info.status is perdure.Status.READY and info.lease_owner is None  # let go
    assert handle.object_id == "drain-2"


def test_a_node_without_the_credential_leaves_the_object(cluster: Cluster, app: perdure.App,
                                                         folder: Path) -> None:
    lacking = spawn(cluster, folder, drop=("PERDURE_TEST_CREDENTIAL",))
    wait_until("the worker to start", lacking.ready, 60)
    handle = app.options(object_id="keyed-1").start("keyed")
    wait_until("the node to say it cannot",
               lambda: "no live node can take it" in (app.get("keyed-1").note or ""), 30)
    info = app.get("keyed-1")
    assert info.status is perdure.Status.READY, info
    assert "PERDURE_TEST_CREDENTIAL" in (info.note or "")
    shown = cluster.cli("show", "keyed-1")
    assert "no live node can take it" in shown.stdout, shown.stdout + shown.stderr
    kinds = [r.kind for r in app.history("keyed-1")]
    assert "capability_missing" in kinds and "terminated" not in kinds
    spawn(cluster, folder, env={"PERDURE_TEST_CREDENTIAL": "yes"})
    assert handle.result(timeout=60) == "keyed done"
    assert "failed" not in lacking.log()
    # A real failure is the object's: failed, and said at WARNING with the id and reason.
    broken = app.options(object_id="broken-1").start("broken")
    with pytest.raises(perdure.AgentFailedError):
        broken.result(timeout=60)
    wait_until("a worker to log the failure", lambda: any(
        "WARNING" in line and "broken-1 failed" in line and "the agent's own bug" in line
        for w in cluster.workers for line in w.log().splitlines()), 10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_restored_server_must_be_the_one_answering(cluster: Cluster, app: perdure.App,
                                                     folder: Path) -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("telling who holds a port needs /proc")
    port = _free_port()
    first = spawn(cluster, folder)
    wait_until("the worker to start", first.ready, 60)
    app.options(object_id="served-1").start("served", port)
    wait_until("the server to run", lambda: app.get("served-1").waiting_event == "go", 30)
    first.kill()
    # Another program takes the port (the server died with its worker).
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def other_serves() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until("the other program to serve the port", other_serves, 30)
        app.send("served-1", "go", None)
        second = spawn(cluster, folder)
        wait_until("the second node to give up on the resource",
                   lambda: "no live node can take it" in (app.get("served-1").note or ""), 60)
        reports = [r.body for r in app.history("served-1") if r.kind == "restore_report"]
        assert reports and all(b["outcome"] != "restored" for b in reports), reports
        assert "held by another process" in (app.get("served-1").note or "")
        assert other.poll() is None  # the other program was left alone
        kinds = [r.kind for r in app.history("served-1")]
        assert "terminated" not in kinds
        # Once the port is free, a restarted node restores it and the object goes on.
        other.terminate()
        other.wait(timeout=10)
        second.stop()
        spawn(cluster, folder)
        result = app.handle("served-1").result(timeout=60)
        assert result["alive"] is True
    finally:
        if other.poll() is None:
            other.kill()
        other.wait(timeout=10)


def test_drain_is_in_the_help() -> None:
    shown = subprocess.run([*PERDURE_CMD, "worker", "--help"], capture_output=True,
                           text=True, timeout=60, check=False, cwd=REPO_ROOT,
                           env={**os.environ, "COLUMNS": "200"})
    assert "--drain SECONDS" in shown.stdout and "Ctrl-C" in shown.stdout
