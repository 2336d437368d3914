"""Acceptance: delegation, gather, capability routing and versions across real processes.

Worker processes run ``composition_agents.py`` and are SIGKILLed at random while
parents wait for children and gathers have branches in flight. Every step writes
to the fenced sink, so the checks compare memory with what the outside world saw.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

import perdure
from tests.acceptance import composition_agents
from tests.acceptance.checks import LEASE_LOST, assert_clean_logs, cli_verify_all
from tests.acceptance.harness import PERDURE_CMD, REPO_ROOT, Cluster, WorkerProc, wait_until
from tests.acceptance.sink import Execution

COMPOSITION_APP = "tests.acceptance.composition_agents:app"
BAD_KINDS = (perdure.Kind.STEP_FAILED, perdure.Kind.STEP_IN_DOUBT, perdure.Kind.NONDETERMINISM)

AppMaker = Callable[..., perdure.App]


@pytest.fixture
def make_app(cluster: Cluster) -> Iterator[AppMaker]:
    """Apps in the test process on the cluster's store (at a code version); closed after."""
    made: list[perdure.App] = []

    def build(version: str = "1") -> perdure.App:
        new = composition_agents.build_app(cluster.store_url, str(cluster.key_dir),
                                           version=version)
        made.append(new)
        return new

    yield build
    for app in made:
        app.close()


def spawn(cluster: Cluster, *, capabilities: tuple[str, ...] = (),
          app_capabilities: tuple[str, ...] = (), version: str = "1",
          concurrency: int = 3, lease: float = 1.0) -> WorkerProc:
    """Start ``perdure worker`` on the composition agents as a new process of ``cluster``.

    ``capabilities`` are passed as ``--capability`` flags; ``app_capabilities`` are
    declared by the App the worker loads.
    """
    node_id = f"w{len(cluster.workers):03d}"
    log_path = cluster.log_dir / f"{node_id}.log"
    env = cluster.env(node_id)
    env["PERDURE_TEST_VERSION"] = version
    env["PERDURE_TEST_CAPS"] = ",".join(app_capabilities)
    caps = [f"--capability={c}" for c in capabilities]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PERDURE_CMD, "--app", COMPOSITION_APP, "--node-id", node_id, "worker",
             "--concurrency", str(concurrency), "--lease", str(lease), "--poll", "0.01", *caps],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    worker = WorkerProc(node_id, proc, log_path)
    cluster.workers.append(worker)
    return worker


def kill_campaign(cluster: Cluster, finished: Callable[[], bool], *, kills: int, seed: int,
                  time_limit: float = 120.0) -> int:
    """Keep 2-3 workers running, SIGKILL one 0.05-0.6 s after it starts serving and
    replace it, until ``kills`` kills or ``finished()``; returns the number of kills."""
    rng = random.Random(seed)
    live: dict[int, float | None] = {}
    by_pid: dict[int, WorkerProc] = {}
    done = 0
    target = 2
    ends = time.monotonic() + time_limit
    while done < kills and not finished():
        assert time.monotonic() < ends, f"campaign still running after {time_limit}s"
        while len(live) < target:
            w = spawn(cluster)
            by_pid[w.pid] = w
            live[w.pid] = None
        now = time.monotonic()
        for pid, kill_at in list(live.items()):
            w = by_pid[pid]
            assert w.alive(), f"{w.node_id} exited by itself:\n{w.log()}"
            if kill_at is None:
                if w.ready():
                    live[pid] = now + rng.uniform(0.05, 0.6)
                else:
                    assert now - w.started_at < 30, f"{w.node_id} never started:\n{w.log()}"
                continue
            if now >= kill_at:
                w.kill()
                del live[pid]
                done += 1
                target = rng.choice((2, 3))
        time.sleep(0.005)
    for pid in live:
        by_pid[pid].kill()
    return done


def finish_with_one_worker(cluster: Cluster, finished: Callable[[], bool],
                           timeout: float = 60.0) -> None:
    """Run one more worker until ``finished()``, then stop it gracefully."""
    final = spawn(cluster, concurrency=8)
    wait_until("the final worker to serve", final.ready, 30)
    wait_until("every object to finish", finished, timeout)
    assert final.stop() == 0, final.log()


@dataclass
class StepAudit:
    """What ``audit_steps`` counted."""

    steps: int = 0
    executions: int = 0
    unfinished: int = 0


def audit_steps(cluster: Cluster, app: perdure.App, object_ids: list[str]) -> StepAudit:
    """Each recorded step's effect arrived exactly once; its recorded result came from an
    execution by the node that recorded it; every other execution was cut short by a
    SIGKILL (or a lost lease) under an older epoch, and none started after the record
    was sealed except under an older, fenced epoch. The sink holds nothing else."""
    audit = StepAudit()
    node_pids = cluster.node_pids()
    killed = cluster.killed_pids()
    lease_losers = {w.pid for w in cluster.workers if LEASE_LOST.search(w.log())}
    effects = cluster.sink.effects()
    inserted = Counter(row[0] for row in cluster.sink.deliveries("inserted"))
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for ex in cluster.sink.executions():
        by_key[ex.key].append(ex)
    expected: set[str] = set()
    for oid in object_ids:
        history = app.history(oid)
        kinds = Counter(r.kind for r in history)
        for bad in BAD_KINDS:
            assert kinds[bad] == 0, (oid, bad, kinds)
        assert kinds[perdure.Kind.TERMINATED] == 1, oid
        assert app.verify(oid).ok, app.verify(oid)
        for rec in (r for r in history if r.kind == perdure.Kind.STEP_DONE):
            key = f"{oid}/{rec.body['pos']}/{rec.body['name']}"
            expected.add(key)
            assert key in effects, f"{key}: recorded but its effect never arrived"
            assert inserted[key] == 1, f"{key}: effect inserted {inserted[key]} times"
            runs = by_key[key]
            writer = node_pids[rec.node_id]
            mine = [ex for ex in runs if ex.pid == writer and ex.finished_at is not None]
            assert mine, f"{key}: no finished execution by {rec.node_id}, which recorded it"
            recorded = max(mine, key=lambda ex: ex.epoch)
            per_claim = Counter((ex.pid, ex.epoch) for ex in runs)
            assert max(per_claim.values()) == 1, f"{key}: ran twice under one claim: {runs}"
            sealed_at = rec.ts_us / 1e6
            for ex in runs:
                if ex is recorded:
                    continue
                assert ex.epoch < recorded.epoch, f"{key}: {ex} outlived the recorded claim"
                assert ex.pid in killed or ex.pid in lease_losers, (
                    f"{key}: {ex} was neither recorded nor cut short")
                assert ex.started_at <= sealed_at or ex.pid in lease_losers, (
                    f"{key}: re-executed after it was recorded: {ex}")
            audit.steps += 1
            audit.executions += len(runs)
            audit.unfinished += sum(1 for ex in runs if ex.finished_at is None)
    assert set(effects) == expected, set(effects) ^ expected
    return audit


# -- SIGKILL campaign over a delegating parent and gathers ------------------------------------


def run_composition_campaign(cluster: Cluster, app: perdure.App, *, children: int,
                             gatherers: int, rounds: int, width: int, kills: int,
                             seed: int) -> None:
    """A parent with ``children`` children and ``gatherers`` gather objects, while
    workers are SIGKILLed at random; then every result, effect and chain is checked."""
    print(f"composition campaign seed {seed}: {children} children, {gatherers} gatherers, "
          f"{kills} kills")
    app.options(object_id="fan").start("fan_out", children)
    gather_ids = [f"gat-{k}" for k in range(gatherers)]
    for k, oid in enumerate(gather_ids):
        app.options(object_id=oid).start("gatherer", k, rounds, width)
    roots = ["fan", *gather_ids]

    def finished() -> bool:
        return all(app.get(oid).terminal for oid in roots)

    done_kills = kill_campaign(cluster, finished, kills=kills, seed=seed)
    finish_with_one_worker(cluster, finished)

    assert app.handle("fan").result(timeout=0) == composition_agents.expected_fan_out(children)
    child_ids = [f"fan.{n + 1}" for n in range(children)]
    listed = {i.object_id: i for i in app.list(parent="fan")}
    assert set(listed) == set(child_ids)
    assert all(i.status is perdure.Status.COMPLETED for i in listed.values())
    folded = [r.body["child_id"] for r in app.history("fan")
              if r.kind == perdure.Kind.CHILD_FINISHED]
    assert sorted(folded) == sorted(child_ids), "a child was folded twice or not at all"
    assert app.store.pending_events("fan") == []
    for cid in child_ids:
        ctx = app.history(cid)[0].body["context"]
        assert (ctx["parent_id"], ctx["root_id"], ctx["depth"]) == ("fan", "fan", 1), ctx

    out_of_order = 0
    for k, oid in enumerate(gather_ids):
        assert app.handle(oid).result(timeout=0) == composition_agents.expected_gathers(
            k, rounds, width), oid
        done = [r for r in app.history(oid) if r.kind == perdure.Kind.STEP_DONE]
        for rnd in range(rounds):
            this = [r for r in done if str(r.body["pos"]).startswith(f"{rnd}.")]
            assert sorted(r.body["pos"] for r in this) == [f"{rnd}.{b}.0" for b in range(width)]
            assert all(r.body["name"] == f"branch-{r.body['pos'].split('.')[1]}" for r in this)
            assert all(r.body["result"] == composition_agents.branch_value(
                k, rnd, int(r.body["pos"].split(".")[1])) for r in this)
            order = [int(r.body["pos"].split(".")[1]) for r in this]
            out_of_order += order != sorted(order)
    assert out_of_order >= 1, "every gather finished in argument order: nothing was tested"

    audit = audit_steps(cluster, app, ["fan", *child_ids, *gather_ids])
    print(f"{done_kills} kills; {audit}; gathers recorded out of order: {out_of_order}")
    if done_kills >= 5:
        assert audit.unfinished >= 1, "no kill landed inside a step body; nothing was tested"
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


def test_parent_and_gathers_survive_sigkills(cluster: Cluster, make_app: AppMaker) -> None:
    """A parent delegating to 10 children (two fenced steps each) and gathers whose
    branches finish out of order complete under ~10 random SIGKILLs: results in argument
    order, each effect exactly once, no branch re-run after it was recorded, every chain
    verifies."""
    run_composition_campaign(cluster, make_app(), children=10, gatherers=3, rounds=3,
                             width=4, kills=10, seed=random.randrange(1 << 30))


@pytest.mark.slow
def test_parent_and_gathers_survive_many_sigkills(cluster: Cluster, make_app: AppMaker) -> None:
    """The soak variant: 30 children, 8 gatherers, up to 40 kills."""
    run_composition_campaign(cluster, make_app(), children=30, gatherers=8, rounds=5,
                             width=5, kills=40, seed=random.randrange(1 << 30))


# -- capability routing ----------------------------------------------------------------------


def test_only_the_capable_worker_runs_steps_that_need_a_capability(
    cluster: Cluster, make_app: AppMaker,
) -> None:
    """A worker without ``browser`` runs the plain step, records ``capability_missing``
    once at the browser step and leaves it; an agent that requires a browser is never
    claimed by it. A worker started with ``--capability browser`` whose App declares
    ``gpu`` has both and runs those steps; memory names the node that ran each."""
    app = make_app()
    app.options(object_id="route-1").start("routed", "r")
    app.options(object_id="surf-1").start("surfer", "s")
    plain = spawn(cluster)
    wait_until("the plain worker to give up the browser step", lambda: any(
        r.kind == perdure.Kind.CAPABILITY_MISSING for r in app.history("route-1")), 30)
    time.sleep(0.5)
    assert app.get("surf-1").epoch == 0, "a worker without a browser claimed surf-1"
    assert app.get("route-1").requires == ("browser",)
    capable = spawn(cluster, capabilities=("browser",), app_capabilities=("gpu",))
    wait_until("both objects to finish", lambda: all(
        app.get(o).terminal for o in ("route-1", "surf-1")), 30)
    assert plain.stop() == 0 and capable.stop() == 0

    assert app.handle("route-1").result(timeout=0) == [
        "anywhere:r", "browser:r", "gpu:r", "anywhere:r"]
    assert app.handle("surf-1").result(timeout=0) == "browser:s"
    missing = [r for r in app.history("route-1") if r.kind == perdure.Kind.CAPABILITY_MISSING]
    assert len(missing) == 1 and missing[0].node_id == plain.node_id
    assert missing[0].body["node"] == plain.node_id
    assert missing[0].body["capabilities"] == ["browser"]
    done = {r.body["name"]: r.node_id for r in app.history("route-1")
            if r.kind == perdure.Kind.STEP_DONE}
    assert done["prepare"] == plain.node_id and done["browse"] == capable.node_id
    assert done["render"] == capable.node_id
    assert {r.node_id for r in app.history("surf-1")[1:]} == {capable.node_id}
    runs_of = Counter((ex.object_id, ex.key.split("/")[-1], ex.pid)
                      for ex in cluster.sink.executions())
    assert runs_of[("route-1", "browse", capable.pid)] == 1
    assert runs_of[("route-1", "render", capable.pid)] == 1
    assert runs_of[("surf-1", "surf", capable.pid)] == 1
    assert not any(ex.pid == plain.pid for ex in cluster.sink.executions()
                   if ex.key.endswith(("/browse", "/render", "/surf")))
    audit_steps(cluster, app, ["route-1", "surf-1"])
    assert_clean_logs(cluster)


# -- versions ----------------------------------------------------------------------------------


def test_version_1_object_waits_for_a_version_1_worker_process(
    cluster: Cluster, make_app: AppMaker,
) -> None:
    """An object started under version 1 while only a version-2 worker runs is not
    claimed and says why; a version-1 worker process joining finishes it."""
    v1 = make_app("1")
    v2 = make_app("2")
    v1.options(object_id="ver-1").start("versioned", "old")
    v2.options(object_id="ver-2").start("versioned", "new")
    newer = spawn(cluster, version="2")
    wait_until("the v2 object to finish", lambda: v2.get("ver-2").terminal, 30)
    assert v2.handle("ver-2").result(timeout=0) == {"ran": "v2:new"}
    time.sleep(0.5)
    info = v1.get("ver-1")
    assert info.epoch == 0 and info.records == 1, info
    assert info.note == "waiting: no live node serves versioned@1", info
    older = spawn(cluster, version="1")
    wait_until("the v1 object to finish", lambda: v1.get("ver-1").terminal, 30)
    assert newer.stop() == 0 and older.stop() == 0

    assert v1.handle("ver-1").result(timeout=0) == {"ran": "v1:old"}
    assert {r.node_id for r in v1.history("ver-1")[1:]} == {older.node_id}
    assert {r.node_id for r in v2.history("ver-2")[1:]} == {newer.node_id}
    audit_steps(cluster, v1, ["ver-1", "ver-2"])
    assert_clean_logs(cluster)
