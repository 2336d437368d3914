"""Real ``perdure worker`` processes for the acceptance tests: start, kill, stop, inspect.

Each worker is a separate OS process running the console script, with its own
node id (so memory records name the process that wrote them) and its own log
file in the test's temporary folder. The ``cluster`` fixture attaches every log
to the report of a failing test.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import perdure
from tests.acceptance import agents
from tests.acceptance.sink import Sink

__all__ = [
    "Cluster",
    "WorkerProc",
    "soak_scale",
    "sqlite_write_free",
    "stop_outside_writes",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = Path(sys.executable).with_name("perdure")
PERDURE_CMD = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "perdure"]
APP_SPEC = "tests.acceptance.agents:app"


def soak_scale() -> float:
    """``PERDURE_SOAK_SCALE`` (default 1): multiplies the size of kill campaigns."""
    return float(os.environ.get("PERDURE_SOAK_SCALE", "1"))


def wait_until(what: str, check: Callable[[], bool], timeout: float, poll: float = 0.02) -> None:
    """Poll ``check`` until it is true; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


@dataclass
class WorkerProc:
    """One worker process and its log."""

    node_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    killed: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the worker wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ready(self) -> bool:
        """True once the worker logged ``node_up``: agents loaded, store open, claiming."""
        return "claiming work" in self.log()

    def alive(self) -> bool:
        """True while the process runs (stopped processes count as running)."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.killed = True

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful drain) and wait; returns the exit code."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


class Cluster:
    """The store, keys, sink and worker processes of one acceptance test.

    The store is the one ``store_url`` names (a SQLite file or a PostgreSQL
    database); the sink is always a SQLite file in ``tmp_path``.
    """

    def __init__(self, tmp_path: Path, store_url: str | None = None) -> None:
        self.tmp_path = tmp_path
        self.store_url = store_url or f"sqlite:///{tmp_path / 'store.db'}"
        self.backend = "postgresql" if self.store_url.startswith("postgres") else "sqlite"
        self.store_path: Path | None = None
        if self.backend == "sqlite":
            self.store_path = Path(self.store_url.removeprefix("sqlite:///").split("?")[0])
        self.key_dir = tmp_path / "keys"
        self.sink = Sink(tmp_path / "sink.db")
        self.sink.create()
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir()
        self.workers: list[WorkerProc] = []
        self._apps: list[perdure.App] = []

    def app(self) -> perdure.App:
        """An App on this cluster's store, for starting and inspecting objects."""
        new = agents.build_app(self.store_url, str(self.key_dir))
        self._apps.append(new)
        return new

    def sqlite_files(self) -> list[Path]:
        """The SQLite files worker processes write: the sink, and the store on SQLite."""
        return [self.sink.path] + ([self.store_path] if self.store_path is not None else [])

    def env(self, node_id: str = "cli") -> dict[str, str]:
        """Environment for processes that load the acceptance agents.

        ``PGAPPNAME`` (read by libpq) names the process's PostgreSQL sessions
        ``perdure-<node_id>``, so a test can find them in ``pg_stat_activity`` (with the
        test's own database: tests running in parallel reuse the same node ids).
        """
        env = dict(os.environ)
        env["PGAPPNAME"] = f"perdure-{node_id}"
        env.update(
            PERDURE_TEST_STORE=self.store_url,
            PERDURE_TEST_KEYS=str(self.key_dir),
            PERDURE_TEST_SINK=str(self.sink.path),
            PYTHONUNBUFFERED="1",
        )
        for name in ("PERDURE_STORE", "PERDURE_APP", "PERDURE_KEY_DIR", "PERDURE_NODE_ID"):
            env.pop(name, None)
        return env

    def spawn(self, *, concurrency: int = 4, lease: float = 1.0, poll: float = 0.01,
              idle: float | None = None) -> WorkerProc:
        """Start ``perdure worker`` as a new process with its own node id and log file
        (``idle``: how long it sleeps idle on a store that pushes wake-ups)."""
        node_id = f"w{len(self.workers):03d}"
        log_path = self.log_dir / f"{node_id}.log"
        env = self.env(node_id)
        if idle is not None:
            env["PERDURE_TEST_IDLE"] = f"{idle:g}"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*PERDURE_CMD, "--app", APP_SPEC, "--node-id", node_id, "worker",
                 "--concurrency", str(concurrency), "--lease", str(lease), "--poll", str(poll)],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        worker = WorkerProc(node_id, proc, log_path)
        self.workers.append(worker)
        return worker

    def pg_sessions(self, worker: WorkerProc) -> list[tuple[str, bool, str | None]]:
        """The worker's PostgreSQL sessions: (state, inside a transaction, lock it waits on)."""
        import psycopg

        with psycopg.connect(self.store_url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT state, xact_start IS NOT NULL, "
                "CASE WHEN wait_event_type = 'Lock' THEN wait_event END "
                "FROM pg_stat_activity "
                "WHERE application_name = %s AND datname = current_database() ORDER BY pid",
                (f"perdure-{worker.node_id}",),
            ).fetchall()
        return [(str(state), bool(in_tx), lock) for state, in_tx, lock in rows]

    def node_pids(self) -> dict[str, int]:
        """node id -> pid of every worker started so far."""
        return {w.node_id: w.pid for w in self.workers}

    def killed_pids(self) -> set[int]:
        """Pids of the workers that were SIGKILLed."""
        return {w.pid for w in self.workers if w.killed}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the ``perdure`` command line on this store."""
        return subprocess.run(
            [*PERDURE_CMD, "--store", self.store_url, "--key-dir", str(self.key_dir), *args],
            cwd=REPO_ROOT, env=self.env(), capture_output=True, text=True, timeout=60,
            check=False,
        )

    def logs(self) -> str:
        """All worker logs, each under a header."""
        parts = []
        for w in self.workers:
            state = "killed" if w.killed else f"exit {w.proc.poll()}"
            parts.append(f"===== {w.node_id} pid {w.pid} ({state}) =====\n{w.log()}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill whatever still runs (including stopped processes) and close the Apps."""
        for w in self.workers:
            if w.alive():
                os.kill(w.pid, signal.SIGCONT)
                os.kill(w.pid, signal.SIGKILL)
                w.proc.wait(timeout=10)
        for app in self._apps:
            app.close()


def sqlite_write_free(paths: Iterable[Path], timeout: float = 0.3) -> bool:
    """True if a write transaction can be taken on every SQLite file right now."""
    for path in paths:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    return True


def stop_outside_writes(worker: WorkerProc, paths: Iterable[Path], attempts: int = 50) -> None:
    """SIGSTOP ``worker`` at a moment it holds no SQLite write lock on ``paths``.

    A stopped process keeps its file locks; stopping it inside a write would
    block every other process, which is not the scenario under test.
    """
    files = list(paths)
    for _ in range(attempts):
        os.kill(worker.pid, signal.SIGSTOP)
        if sqlite_write_free(files):
            return
        os.kill(worker.pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"could not stop {worker.node_id} outside a write")
