"""Acceptance on PostgreSQL only: many nodes on one database, and the server restarting.

``test_multi_node_kill_campaign`` runs four ``perdure worker`` processes with
distinct node ids on one database and SIGKILLs them at random while events
arrive. ``test_server_restart`` runs its own PostgreSQL instance (never the
shared one) and crashes it with ``pg_ctl -m immediate`` under two running
workers, which must reconnect by themselves.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.errors import ObjectTerminatedError, StoreError
from tests.acceptance.checks import (
    Spec,
    all_terminal,
    assert_clean_logs,
    check_pipelines,
    cli_verify_all,
    start_pipelines,
)
from tests.acceptance.harness import (
    Cluster,
    WorkerProc,
    soak_scale,
    sqlite_write_free,
    wait_until,
)
from tests.acceptance.sink import Execution
from tests.pg import BACKENDS, NO_SERVER, pg_bin

PG_BIN = pg_bin()  # PostgreSQL's server programs, whichever version is installed


def _programs() -> Path:
    """``PG_BIN``, known to be there (``private_pg`` skipped otherwise)."""
    assert PG_BIN is not None
    return PG_BIN

# -- many nodes, one database ----------------------------------------------------------


def start_mixed(app: perdure.App, count: int, prefix: str) -> list[Spec]:
    """Start ``count`` pipelines of 1-5 work steps, async and sync agents alternating."""
    specs = []
    for n in range(count):
        agent = "pipeline" if n % 2 == 0 else "sync_pipeline"
        spec = Spec(f"{prefix}-{n:04d}", agent, n, 1 + (n * 7) % 5, 0.05 + 0.05 * (n % 4))
        app.options(object_id=spec.object_id).start(agent, spec.n, spec.steps, spec.nap)
        specs.append(spec)
    return specs


def terminal_count(app: perdure.App, specs: list[Spec]) -> int:
    """How many of ``specs`` have completed, failed or been cancelled (one query)."""
    wanted = {s.object_id for s in specs}
    infos = app.list(limit=len(specs) + 100)
    return sum(1 for info in infos if info.object_id in wanted and info.terminal)


@dataclass
class Approvals:
    """Approval events of a campaign: each sent once, re-sent with the same dedupe key."""

    app: perdure.App
    payloads: dict[str, dict[str, Any]]
    sent: set[str]
    refused: int = 0

    def send(self, oid: str) -> None:
        """Send the approval and at once a duplicate that must be refused."""
        assert self.app.send(oid, "approval", self.payloads[oid], dedupe_key=f"ok-{oid}")
        self.sent.add(oid)
        self.resend(oid)

    def resend(self, oid: str) -> None:
        """Send a different payload under the same dedupe key: never delivered."""
        try:
            fresh = self.app.send(oid, "approval", {"by": "duplicate"}, dedupe_key=f"ok-{oid}")
        except ObjectTerminatedError:
            return
        assert not fresh, f"{oid}: a duplicate approval was accepted"
        self.refused += 1


def run_multi_node(cluster: Cluster, *, objects: int, kills: int, seed: int) -> None:
    """Four workers on one database, SIGKILLed at random and replaced, events arriving.

    A third of the approvals go out before any worker runs (kept until the
    object waits), the rest at random moments of the run (some objects are
    already waiting, some not yet); every approval is re-sent at once with its
    dedupe key, and a quarter again later. Each worker is killed 0.3-1.2 s after
    it starts serving, ``kills`` times in all, and replaced by a new node.
    """
    rng = random.Random(seed)
    print(f"multi-node seed {seed}: {objects} objects, {kills} kills, 4 nodes")
    app = cluster.app()
    specs = start_mixed(app, objects, "mn")
    approvals = Approvals(app, {s.object_id: {"by": f"approver-{s.n}"} for s in specs}, set())
    early = [s.object_id for s in specs if s.n % 3 == 0]
    later = [s.object_id for s in specs if s.n % 3 != 0]
    rng.shuffle(later)
    for oid in early:
        approvals.send(oid)
    resend_at = {oid: rng.randrange(1, kills + 1)
                 for oid in rng.sample([s.object_id for s in specs], len(specs) // 4)}

    live: dict[int, float | None] = {}
    by_pid: dict[int, WorkerProc] = {}
    done_kills = 0
    started = time.monotonic()
    deadline = started + 120
    while True:
        now = time.monotonic()
        assert now < deadline, f"objects still running after 120 s: {terminal_count(app, specs)}"
        while len(live) < 4:
            w = cluster.spawn(concurrency=8, lease=1.0)
            by_pid[w.pid] = w
            live[w.pid] = None
        for pid, kill_at in list(live.items()):
            w = by_pid[pid]
            assert w.alive(), f"{w.node_id} exited by itself:\n{w.log()}"
            if kill_at is None:
                if w.ready():
                    live[pid] = now + rng.uniform(0.3, 1.2)
                else:
                    assert now - w.started_at < 30, f"{w.node_id} never started:\n{w.log()}"
            elif now >= kill_at and done_kills < kills:
                w.kill()
                del live[pid]
                done_kills += 1
                for oid, at in list(resend_at.items()):
                    if at <= done_kills and oid in approvals.sent:
                        approvals.resend(oid)
                        del resend_at[oid]
        # approvals trickle in over the first seconds of the run, duplicates among them
        due = min(len(later), int((now - started) / 4.0 * len(later)) + 1)
        for oid in later[:due]:
            if oid not in approvals.sent:
                approvals.send(oid)
        if done_kills >= kills and len(approvals.sent) == len(specs):
            if terminal_count(app, specs) == len(specs):
                break
            time.sleep(0.2)
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    for oid in resend_at:
        approvals.resend(oid)
    for pid in list(live):
        worker = by_pid[pid]
        wait_until(f"{worker.node_id} to serve", worker.ready, 30)
        assert worker.stop() == 0, worker.log()

    nodes = {w.node_id for w in cluster.workers}
    assert len(nodes) == len(cluster.workers) == 4 + done_kills
    audit = check_pipelines(cluster, app, specs, approvals.payloads, cluster.killed_pids())
    writers = {r.node_id for s in specs for r in app.history(s.object_id)[1:]}
    print(f"{done_kills} kills in {elapsed:.1f}s; {len(writers)} nodes wrote memory; {audit}; "
          f"duplicates refused: {approvals.refused}")
    assert approvals.refused >= len(specs)
    assert len(writers) >= 4, f"only {sorted(writers)} did any work"
    if done_kills >= 6:
        assert audit.unfinished >= 1, "no kill landed inside a step body; nothing was tested"
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


def test_multi_node_kill_campaign(pg_cluster: Cluster) -> None:
    """Four nodes on one PostgreSQL database, SIGKILLed at random: nothing lost or doubled.

    Every one of the objects (mixed step counts, async and sync agents, a sleep,
    an approval event) completes with the right result; each step's effect is
    in the sink exactly once; a step ran again only where a kill (or a lost
    lease) cut its earlier run short; each approval, sent before or during the
    wait and re-sent under the same dedupe key, is delivered once; memory
    verifies through the API and ``perdure verify --all``.
    """
    seed = int(os.environ.get("PERDURE_SOAK_SEED", str(random.randrange(1 << 30))))
    run_multi_node(pg_cluster, objects=round(200 * soak_scale()),
                   kills=max(4, round(10 * soak_scale())), seed=seed)


@pytest.mark.slow
def test_multi_node_kill_campaign_large(pg_cluster: Cluster) -> None:
    """The multi-node campaign at soak size: more objects and many more kills."""
    seed = int(os.environ.get("PERDURE_SOAK_SEED", str(random.randrange(1 << 30))))
    run_multi_node(pg_cluster, objects=round(800 * soak_scale()),
                   kills=max(20, round(60 * soak_scale())), seed=seed)


# -- a worker stopped inside a store transaction ----------------------------------------


def row_locked_objects(store_url: str) -> set[str]:
    """Object rows some open transaction holds a lock on right now."""
    import psycopg

    with psycopg.connect(store_url, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT object_id FROM objects WHERE object_id NOT IN "
            "(SELECT object_id FROM objects FOR UPDATE SKIP LOCKED)"
        ).fetchall()
        conn.rollback()
    return {str(row[0]) for row in rows}



def test_worker_stopped_inside_a_transaction(pg_cluster: Cluster) -> None:
    """A worker frozen (SIGSTOP) inside a store transaction does not stop the others.

    Worker A is stopped at a moment one of its PostgreSQL sessions is inside a
    transaction (and it holds no SQLite write lock on the sink). Worker B
    claims around the rows A's open transaction locks (``SKIP LOCKED``) and
    finishes every other object, including the ones A had claimed, once their
    leases lapse. Only rows A's open transaction locks wait for A (the
    database cannot hand them over while that transaction lives). When A
    continues, its late writes are fenced, and everything completes, verified,
    with each effect once.
    """
    cluster = pg_cluster
    app = cluster.app()
    specs = start_pipelines(app, 12, 4, "tx")
    approvals = {s.object_id: {"by": f"approver-{s.n}"} for s in specs}
    for oid, payload in approvals.items():
        assert app.send(oid, "approval", payload, dedupe_key="once")
    a = cluster.spawn(concurrency=8, lease=1.0)
    wait_until("worker A to run steps", lambda: len(cluster.sink.effects()) >= 4, 30)
    sessions: list[tuple[str, bool, str | None]] = []
    locked: set[str] = set()
    attempts, give_up = 0, time.monotonic() + 30
    while True:
        assert time.monotonic() < give_up, f"never caught A in a write ({attempts} tries)"
        attempts += 1
        os.kill(a.pid, signal.SIGSTOP)
        sessions = cluster.pg_sessions(a)
        if any(in_tx for _state, in_tx, _lock in sessions) and row_locked_objects(
                cluster.store_url):
            # A statement the server was still running (its own transaction) ends without
            # A: only locks still held a moment later belong to a transaction that waits
            # for the stopped worker.
            time.sleep(0.2)
            sessions = cluster.pg_sessions(a)
            locked = row_locked_objects(cluster.store_url)
            if (locked and any(in_tx for _state, in_tx, _lock in sessions)
                    and sqlite_write_free([cluster.sink.path])):
                break
        os.kill(a.pid, signal.SIGCONT)
        time.sleep(0.002)
    print(f"A stopped after {attempts} tries with sessions (state, in transaction, lock): "
          f"{sessions}; "
          f"rows its open transaction locks: {sorted(locked)}")

    b = cluster.spawn(concurrency=8, lease=1.0)
    others = [s for s in specs if s.object_id not in locked]
    wait_until("B to finish every object whose row A's transaction does not lock",
               lambda: all(app.get(s.object_id).terminal for s in others), 60, poll=0.1)
    stuck = [s.object_id for s in specs if not app.get(s.object_id).terminal]
    print(f"objects waiting for the stopped worker: {stuck}")
    assert set(stuck) <= locked, f"objects stuck without a row lock: {set(stuck) - locked}"
    assert row_locked_objects(cluster.store_url) == locked, "B's transactions were left open"

    os.kill(a.pid, signal.SIGCONT)
    wait_until("every object to finish", lambda: all_terminal(app, specs), 60, poll=0.1)
    assert a.stop() == 0, a.log()
    assert b.stop() == 0, b.log()
    check_pipelines(cluster, app, specs, approvals, {a.pid})
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


# -- the server restarts under running workers --------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    """A PostgreSQL instance of its own, in a temporary folder, run as the postgres user."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="perdure-pg-", dir="/tmp"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                 "-E", "UTF8")

    def _pg(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(_programs() / tool), *args],
            capture_output=True, text=True, timeout=60, check=False, cwd=self.dir,
        )
        assert done.returncode == 0, f"{tool} {args} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w",
                 "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")

    def crash(self) -> None:
        """Stop the server at once, without a checkpoint (``-m immediate``)."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        """Stop the server if it runs and remove its folder."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(_programs() / "pg_ctl"), "-D",
                 str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True, timeout=60, check=False,
            )
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivateServer]:
    """A running PostgreSQL instance private to this test; stopped and removed afterwards."""
    if "postgresql" not in BACKENDS:
        pytest.skip(NO_SERVER)
    if os.geteuid() != 0 or shutil.which("runuser") is None or PG_BIN is None:
        pytest.skip("a private PostgreSQL instance needs root, runuser and PostgreSQL's "
                    "server programs (initdb: pg_config --bindir, /usr/lib/postgresql/*/bin "
                    "or PERDURE_TEST_PG_BIN)")
    server = PrivateServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def restart_cluster(tmp_path: Path, private_pg: PrivateServer) -> Iterator[Cluster]:
    """A cluster whose store is the private instance."""
    made = Cluster(tmp_path, private_pg.url)
    try:
        yield made
    finally:
        made.close()


OUTAGE_LINE = re.compile(r"unavailable|channel lost")


def test_server_restart(restart_cluster: Cluster, private_pg: PrivateServer) -> None:
    """Workers ride out a PostgreSQL crash and restart without being restarted themselves.

    Two workers run 20 objects; mid-run the server is stopped with ``-m
    immediate``, kept down 3 s and started again. The same worker processes
    reconnect: every object completes with the right result, no effect is lost
    or doubled in the sink, memory verifies, and no lease stays stuck. Each
    worker says once that the store is unavailable (a few lines at most, no
    traceback) and that it is back. After the restart, approvals sent to idle
    workers are acted on at once: pushed wake-ups work again.
    """
    cluster = restart_cluster
    app = cluster.app()
    specs = start_pipelines(app, 20, 8, "pgr")
    approvals = {s.object_id: {"by": f"approver-{s.n}"} for s in specs}
    late = [s for s in specs if s.n % 3 == 0]
    for spec in specs:
        if spec not in late:
            assert app.send(spec.object_id, "approval", approvals[spec.object_id],
                            dedupe_key="once")
    workers = [cluster.spawn(concurrency=4, lease=1.0) for _ in range(2)]
    for w in workers:
        wait_until(f"{w.node_id} to serve", w.ready, 30)
    total_steps = sum(s.steps + 2 for s in specs)
    wait_until("a quarter of the steps to land", lambda: len(cluster.sink.effects())
               >= total_steps // 4, 60)
    before = len(cluster.sink.effects())
    private_pg.crash()
    down_at = time.time()
    time.sleep(3.0)
    mid = len(cluster.sink.effects())
    private_pg.start()
    up_at = time.time()
    print(f"server down {up_at - down_at:.1f}s; effects {before} before, {mid} when back")
    assert mid < total_steps, "everything finished before the outage; nothing was tested"
    for w in workers:
        assert w.alive(), f"{w.node_id} died with the server:\n{w.log()}"

    def reachable() -> bool:
        with contextlib.suppress(StoreError):
            app.get(specs[0].object_id)
            return True
        return False

    wait_until("the test's own App to reconnect", reachable, 30, poll=0.2)
    early = [s for s in specs if s not in late]
    wait_until("every approved object to finish",
               lambda: all(app.get(s.object_id).terminal for s in early), 60, poll=0.1)
    def waiting(oid: str) -> Callable[[], bool]:
        return lambda: app.get(oid).waiting_event == "approval"

    def finished(oid: str) -> Callable[[], bool]:
        return lambda: app.get(oid).terminal

    def relistening(worker: WorkerProc) -> Callable[[], bool]:
        return lambda: "wake-up channel reconnected" in worker.log()

    for s in late:
        wait_until(f"{s.object_id} to wait for its approval", waiting(s.object_id), 30, poll=0.1)
    for w in workers:
        wait_until(f"{w.node_id}'s wake-up channel to reconnect", relistening(w), 30)
        assert w.alive(), w.log()
    time.sleep(0.5)  # both workers idle now: only a pushed wake-up acts within a second

    latencies = []
    for s in late:
        sent_at = time.monotonic()
        assert app.send(s.object_id, "approval", approvals[s.object_id], dedupe_key="once")
        wait_until(f"{s.object_id} to finish", finished(s.object_id), 30)
        latencies.append(time.monotonic() - sent_at)
    print("approval to completion after the restart: "
          + ", ".join(f"{lat:.2f}s" for lat in latencies))
    assert max(latencies) < 1.2, f"wake-ups were not pushed after the restart: {latencies}"

    for w in workers:
        assert w.alive(), f"{w.node_id} exited:\n{w.log()}"
        assert w.stop() == 0, w.log()
    audit = check_pipelines(cluster, app, specs, approvals, {w.pid for w in workers})
    print(f"after the restart: {audit}")
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for ex in cluster.sink.executions():
        by_key[ex.key].append(ex)
    repeated = {key: runs for key, runs in by_key.items() if len(runs) > 1}
    for key, runs in repeated.items():  # only runs the outage cut short were repeated
        for ex in runs[:-1]:
            assert ex.started_at < up_at + 3.0, f"{key}: {ex} was repeated long after the restart"
    print(f"steps run again after the outage: {sorted(repeated)}")
    stuck = [i.object_id for i in app.list(limit=100) if i.lease_owner is not None]
    assert stuck == [], f"leases still held after every object finished: {stuck}"

    for w in workers:
        text = w.log()
        outage = [line for line in text.splitlines() if OUTAGE_LINE.search(line)]
        print(f"{w.node_id} outage lines: {outage}")
        assert any("store unavailable" in line for line in outage), (
            f"{w.node_id} never said the store was unavailable:\n{text}"
        )
        assert len(outage) <= 3, f"{w.node_id} logged the outage {len(outage)} times:\n{text}"
        assert "store reachable again" in text, text
    cli_verify_all(cluster)
    assert_clean_logs(cluster)
