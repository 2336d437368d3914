"""Acceptance: poison objects with real worker processes, on both stores.

A step (or the agent's own code between steps) that kills its worker process must not
crash-loop every worker that picks the object up. The tests below run ``perdure worker``
processes on the agents of this module, one after another like a supervisor restarting
a dead service, and check that after ``max_crashes`` deaths in a row (default 3) inside
one step the object is parked with a ``parked`` record naming the step, that the
worker which parks it stays up and serves other objects, and that ``perdure resume``
tries again once the cause is gone. If replay itself kills the worker, the object is
parked after one death more, without running its code again.

The worker processes load ``tests.acceptance.test_poison:app``; the command line binds
it to the test's store and key folder. All processes of a test share one node id, so a
restarted worker takes the dead one's objects back at once (it sees the old process
is gone) instead of waiting for their leases to lapse.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from tests.acceptance.harness import PERDURE_CMD, REPO_ROOT, Cluster, WorkerProc, wait_until

APP_SPEC = "tests.acceptance.test_poison:app"
NODE_ID = "poison-node"
MAX_CRASHES = perdure.LocalPolicy().max_crashes

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=1.0, poll_interval=0.01)


# -- agents run by the worker processes ---------------------------------------------------


def note(path: str, text: str = "x") -> None:
    """Append a line to ``path`` and make it durable before anything else happens."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def lines(path: Path) -> int:
    """How many lines ``note`` wrote to ``path``."""
    try:
        return len(path.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


def die_if(marker: str) -> None:
    """Kill this process at once (no cleanup, no flush) while ``marker`` exists."""
    if os.path.exists(marker):
        os._exit(17)


def first_step() -> str:
    return "before"


def fragile(marker: str, log: str) -> str:
    """A step whose body kills its worker while ``marker`` exists."""
    note(log)
    die_if(marker)
    return "survived"


def double(n: int) -> int:
    return 2 * n


@app.agent(name="poisoned")
async def poisoned(run: perdure.Run, marker: str, log: str) -> str:
    """One good step, then ``fragile``."""
    before = await run.step(first_step, name="before")
    value = await run.step(fragile, marker, log, name="fragile")
    return f"{before}/{value}"


@app.agent(name="noted")
async def noted(run: perdure.Run, marker: str, log: str) -> str:
    """As ``poisoned``, with a progress note (``run.progress``) just before ``fragile``."""
    before = await run.step(first_step, name="before")
    await run.progress(stage="about to run fragile")
    value = await run.step(fragile, marker, log, name="fragile")
    return f"{before}/{value}"


@app.agent(name="healthy")
async def healthy(run: perdure.Run, n: int) -> int:
    return await run.step(double, n, name="double")


@app.agent(name="dies_in_replay")
async def dies_in_replay(run: perdure.Run, marker: str, log: str) -> str:
    """A step, a wait, then the agent's own code (not a step) that kills the worker while
    ``marker`` exists: on every replay it dies before reaching a step."""
    before = await run.step(first_step, name="before")
    go = await run.wait_for("go")
    note(log)
    die_if(marker)
    after = await run.step(double, 21, name="after")
    return f"{before}/{go}/{after}"


# -- a small supervisor ---------------------------------------------------------------------


def spawn(cluster: Cluster) -> WorkerProc:
    """Start ``perdure worker`` on this module's agents, with the test's one node id."""
    log_path = cluster.log_dir / f"poison-{len(cluster.workers):02d}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PERDURE_CMD, "--store", cluster.store_url, "--key-dir", str(cluster.key_dir),
             "--node-id", NODE_ID, "--app", APP_SPEC, "worker", "--concurrency", "4",
             "--lease", "1", "--poll", "0.01"],
            cwd=REPO_ROOT, env=cluster.env(NODE_ID), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    worker = WorkerProc(NODE_ID, proc, log_path)
    cluster.workers.append(worker)
    return worker


def supervise(cluster: Cluster, worker: WorkerProc, until: Callable[[], bool], *,
              most: int, timeout: float = 45.0) -> tuple[int, WorkerProc]:
    """Restart the worker each time it dies, until ``until()``; the deaths counted and the
    worker alive at the end. Each death must be the agents' doing (exit code 17, after the
    worker came up), and there must be no more than ``most``."""
    deaths = 0
    give_up = time.monotonic() + timeout
    while not until():
        if not worker.alive():
            assert worker.proc.returncode == 17, (
                f"worker exited {worker.proc.returncode}, not by the agent:\n{worker.log()}")
            assert worker.ready(), f"worker died before it came up:\n{worker.log()}"
            deaths += 1
            assert deaths <= most, f"{deaths} deaths and the object is still not parked"
            worker = spawn(cluster)
        assert time.monotonic() < give_up, f"timed out after {timeout}s ({deaths} deaths)"
        time.sleep(0.02)
    return deaths, worker


def parked(client: perdure.App, object_id: str) -> Callable[[], bool]:
    return lambda: client.get(object_id).status is perdure.Status.PARKED


def parked_records(client: perdure.App, object_id: str) -> list[dict[str, Any]]:
    return [dict(r.body) for r in client.history(object_id) if r.kind == perdure.Kind.PARKED]


# -- tests -----------------------------------------------------------------------------------


def test_a_step_that_kills_its_worker_is_parked_after_max_crashes_and_resumed(
    cluster: Cluster, tmp_path: Path,
) -> None:
    """A step whose body kills the worker process: three workers die in it one after
    another; the fourth parks the object instead of running the step again, with a
    ``parked`` record naming the step, and stays up, serving another object. With the
    cause gone, ``perdure resume`` runs the step once more and the object completes."""
    client = cluster.app()
    client.agent(name="poisoned")(poisoned)
    client.agent(name="healthy")(healthy)
    marker, log = tmp_path / "poison-on", tmp_path / "fragile.log"
    marker.touch()
    handle = client.options(object_id="poison-1").start("poisoned", str(marker), str(log))

    deaths, worker = supervise(cluster, spawn(cluster), parked(client, "poison-1"),
                               most=MAX_CRASHES)

    assert deaths == MAX_CRASHES
    assert lines(log) == MAX_CRASHES, "the step's body ran once per death, never after"
    [record] = parked_records(client, "poison-1")
    assert record["code"] == "worker_died" and record["step"] == "fragile"
    assert record["crashes"] == MAX_CRASHES
    assert f"the worker died {MAX_CRASHES} times in a row inside step 'fragile'" in (
        record["reason"])
    assert "perdure resume poison-1" in record["reason"]
    assert client.history("poison-1")[-1].kind == perdure.Kind.PARKED
    with pytest.raises(perdure.AgentParkedError, match="fragile"):
        handle.result(timeout=1)
    shown = cluster.cli("show", "poison-1")
    assert shown.returncode == 0 and "parked" in shown.stdout, shown.stdout + shown.stderr

    # the node that parked it is up and serves other work
    other = client.options(object_id="healthy-1").start("healthy", 21)
    assert other.result(timeout=20) == 42
    assert worker.alive()
    assert lines(log) == MAX_CRASHES, "a parked object is not run again by itself"

    marker.unlink()
    resumed = cluster.cli("resume", "poison-1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert handle.result(timeout=20) == "before/survived"
    assert lines(log) == MAX_CRASHES + 1
    assert worker.alive() and len(cluster.workers) == MAX_CRASHES + 1
    done = [r.body["name"] for r in client.history("poison-1")
            if r.kind == perdure.Kind.STEP_DONE]
    assert done == ["before", "fragile"], "each step recorded once"
    verified = cluster.cli("verify", "poison-1")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert worker.stop() == 0


def test_agent_code_that_kills_its_worker_on_replay_is_parked_without_running_again(
    cluster: Cluster, tmp_path: Path,
) -> None:
    """The agent's own code between two steps kills the worker once its event has come:
    every claim replays into the death before any step. After ``max_crashes + 1`` deaths
    the next worker parks the object without running its code at all; ``app.resume``
    after the fix lets it complete with the event it was waiting for."""
    client = cluster.app()
    client.agent(name="dies_in_replay")(dies_in_replay)
    client.agent(name="healthy")(healthy)
    marker, log = tmp_path / "poison-on", tmp_path / "replay.log"
    handle = client.options(object_id="replay-1").start("dies_in_replay", str(marker), str(log))
    worker = spawn(cluster)
    wait_until("the object waiting for go", lambda: handle.info().waiting_event == "go", 30)
    marker.touch()
    client.send("replay-1", "go", "went")

    deaths, worker = supervise(cluster, worker, parked(client, "replay-1"),
                               most=MAX_CRASHES + 1)

    assert deaths == MAX_CRASHES + 1
    assert lines(log) == MAX_CRASHES + 1, "the parking claim ran none of the agent's code"
    [record] = parked_records(client, "replay-1")
    assert record["code"] == "worker_died" and record["crashes"] == MAX_CRASHES + 1
    assert "step" not in record
    assert f"the worker died {MAX_CRASHES + 1} times in a row" in record["reason"]
    assert not [r for r in client.history("replay-1")
                if r.kind in (perdure.Kind.EVENT_RECEIVED, perdure.Kind.STEP_STARTED)
                or r.body.get("name") == "after"], "nothing after the wait was recorded"

    assert client.options(object_id="healthy-2").start("healthy", 5).result(timeout=20) == 10
    assert worker.alive()

    marker.unlink()
    client.resume("replay-1")
    assert handle.result(timeout=20) == "before/went/42"
    assert lines(log) == MAX_CRASHES + 2
    assert worker.alive()
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.proc.wait(timeout=15) == 0


def test_a_progress_note_before_the_fatal_step_does_not_hide_the_crash_loop(
    cluster: Cluster, tmp_path: Path,
) -> None:
    """``run.progress(...)`` right before the step that kills the worker: the object is
    parked after ``max_crashes`` deaths all the same, not taken by worker after worker."""
    client = cluster.app()
    client.agent(name="noted")(noted)
    marker, log = tmp_path / "poison-on", tmp_path / "noted.log"
    marker.touch()
    client.options(object_id="noted-1").start("noted", str(marker), str(log))

    deaths, worker = supervise(cluster, spawn(cluster), parked(client, "noted-1"),
                               most=MAX_CRASHES + 1)

    assert deaths == MAX_CRASHES
    [record] = parked_records(client, "noted-1")
    assert record["step"] == "fragile"
    assert worker.alive()

