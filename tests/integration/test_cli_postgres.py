"""The ``perdure`` command line end to end on PostgreSQL, with real worker processes.

A worker started with ``perdure --app ... --store postgresql://... worker`` runs the
objects that ``perdure start`` creates; ``send``, ``ls``, ``show``, ``result`` and
``verify`` work against the same database. SIGTERM stops the worker cleanly (exit 0)
and lets its objects go: a second worker, on another node id and with a lease far
longer than the test, resumes them at once, and no step runs twice.

This module is also the ``--app`` of the worker processes (``app`` below); the store
comes from ``--store``, so the App's own URL is never opened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.core.records import Kind
from tests.cluster import one_root
from tests.pg import fresh_database, needs_server

pytestmark = needs_server

ROOT = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.integration.test_cli_postgres:app"
LEASE = "60"  # far longer than the test: a resume that waited for the lease would time out
STEPS = 30

app = perdure.App(store="sqlite:///not-opened-the-cli-passes-store.db")


def tick(i: int) -> int:
    """A step that takes 0.1 s and logs each time its body really runs."""
    info = perdure.current_step()
    with open(os.environ["PERDURE_TEST_EFFECTS"], "a", encoding="utf-8") as log:
        log.write(f"{info.idempotency_key} {os.getpid()}\n")
    time.sleep(0.1)
    return i


@app.agent()
async def approve(run: perdure.Run, who: str) -> dict[str, Any]:
    """One step, then wait for an approval, then for a go-ahead."""
    first = await run.step(tick, 1)
    answer = await run.wait_for("approval", timeout=60)
    await run.wait_for("finish", timeout=60)
    return {"who": who, "first": first, "answer": answer}


@app.agent()
async def count(run: perdure.Run, n: int) -> int:
    """``n`` recorded steps in a row: long enough to stop the worker in the middle."""
    total = 0
    for i in range(n):
        total += await run.step(tick, i)
    return total


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PERDURE_STORE=url, PERDURE_KEY_DIR=str(tmp_path / "keys-cli"),
               PERDURE_NODE_ID="cli", PERDURE_TEST_EFFECTS=str(tmp_path / "effects.log"))
    return env


def _cli(env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, app: bool = False, ok: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "perdure", *(["--app", APP_SPEC] if app else []), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                              cwd=ROOT)
        if ok:
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc

    return run


def _worker(env: dict[str, str], tmp_path: Path, node: str) -> subprocess.Popen[bytes]:
    with open(tmp_path / f"{node}.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", APP_SPEC, "--store",
             env["PERDURE_STORE"], "--key-dir", str(tmp_path / f"keys-{node}"),
             "--node-id", node, "worker", "--lease", LEASE, "--concurrency", "4"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes], tmp_path: Path, node: str) -> str:
    """SIGTERM a worker; it must exit 0 within the drain time, without a traceback."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    output = (tmp_path / f"{node}.log").read_text(encoding="utf-8", errors="replace")
    assert code == 0, output
    assert "Traceback" not in output, output
    return output


def test_cli_on_postgresql_and_sigterm_releases_objects(tmp_path: Path, pg_url: str) -> None:
    env = _env(tmp_path, pg_url)
    cli = _cli(env)
    (tmp_path / "effects.log").touch()
    # The CLI and the workers act as "cli", "node-a" and "node-b": certified under those.
    one_root(tmp_path / "keys-root", tmp_path / "keys-observer",
             *((tmp_path / f"keys-{name}", name) for name in ("cli", "node-a", "node-b")))
    observer = perdure.App(store=pg_url, key_dir=tmp_path / "keys-observer")
    worker_a = _worker(env, tmp_path, "node-a")
    worker_b: subprocess.Popen[bytes] | None = None
    try:
        # start, send (once per dedupe key), result, ls, show on PostgreSQL.
        assert cli("start", "approve", "--args", '"ana"', "--id", "pg-1",
                   app=True).stdout.strip() == "pg-1"
        _wait_for(lambda: observer.get("pg-1").waiting_event == "approval", 10,
                  "pg-1 to wait for its approval")
        assert "waiting for event 'approval'" in cli("show", "pg-1").stdout
        sent = cli("send", "pg-1", "approval", '{"ok": true}', "--dedupe-key", "k-1").stdout
        assert "sent 'approval' to pg-1" in sent
        _wait_for(lambda: observer.get("pg-1").waiting_event == "finish", 10,
                  "pg-1 to take its approval")
        again = cli("send", "pg-1", "approval", '{"ok": false}', "--dedupe-key", "k-1").stdout
        assert again.startswith("duplicate")
        cli("send", "pg-1", "finish")
        result = json.loads(cli("result", "pg-1", "--wait", "10").stdout)
        assert result == {"who": "ana", "first": 1, "answer": {"ok": True}}
        listed = cli("ls", "--status", "completed").stdout
        assert "pg-1" in listed and "approve@1" in listed

        # A long object; SIGTERM the worker in the middle of it.
        cli("start", "count", "--args", str(STEPS), "--id", "pg-2", app=True)
        _wait_for(lambda: sum(r.kind == Kind.STEP_DONE for r in observer.history("pg-2")) >= 3,
                  10, "pg-2 to record a few steps")
        _stop(worker_a, tmp_path, "node-a")
        row = observer.store.get("pg-2")
        assert row is not None
        assert row.status == "ready" and row.lease_owner is None, row  # let go, not abandoned
        assert "pg-2" in cli("ls", "--status", "ready").stdout

        # Another node resumes it at once: its lease is 60 s, the wait here is 15 s.
        stopped_at = time.time()
        worker_b = _worker(env, tmp_path, "node-b")
        assert cli("result", "pg-2", "--wait", "15").stdout.strip() == str(sum(range(STEPS)))
        assert time.time() - stopped_at < 15
        _stop(worker_b, tmp_path, "node-b")

        history = observer.history("pg-2")
        done = [r for r in history if r.kind == Kind.STEP_DONE]
        assert [r.body["pos"] for r in done] == list(range(STEPS))
        assert {r.node_id for r in done} == {"node-a", "node-b"}
        shown = cli("show", "pg-2").stdout
        assert "node-a" in shown and "node-b" in shown and "completed" in shown

        # A graceful stop finishes the running step and records it: nothing ran twice.
        runs = Counter(line.split()[0] for line in
                       (tmp_path / "effects.log").read_text(encoding="utf-8").splitlines())
        assert len(runs) == STEPS + 1 and set(runs.values()) == {1}, runs

        verified = cli("verify", "pg-1", "pg-2").stdout
        assert verified.count("ok") == 2, verified
        assert cli("verify", "--all").stdout.count("records verified") == 2
    finally:
        for proc in (worker_a, worker_b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        observer.close()
