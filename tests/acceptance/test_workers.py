"""Acceptance: real ``perdure worker`` processes killed, raced and stopped mid-step.

Every step writes to an idempotent, fenced sink (``sink.py``) and logs its
executions there, so these tests check what the outside world saw, not only
what perdure says about itself.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest

import perdure
from perdure.errors import ObjectTerminatedError
from tests.acceptance import agents
from tests.acceptance.checks import (
    LEASE_LOST,
    Spec,
    all_terminal,
    assert_clean_logs,
    check_pipelines,
    cli_verify_all,
    finish_with_one_worker,
    start_pipelines,
    step_done_records,
)
from tests.acceptance.harness import (
    Cluster,
    WorkerProc,
    soak_scale,
    stop_outside_writes,
    wait_until,
)

# -- SIGKILL campaign --------------------------------------------------------------------


def run_kill_campaign(cluster: Cluster, *, objects: int, kills: int, steps: int,
                      seed: int) -> None:
    """Start objects, SIGKILL workers at random instants ``kills`` times, then finish.

    One or two workers run at a time; each is killed 0.05-0.6 s after it has
    started serving and replaced at once. Approvals are sent for half the
    objects before any worker runs and for the others during the campaign;
    each is re-sent at once with the same dedupe key and a different payload,
    and some again later in the campaign: no re-send may deliver it again.
    """
    rng = random.Random(seed)
    print(f"campaign seed {seed}: {objects} objects, {kills} kills, {steps} steps each")
    app = cluster.app()
    specs = start_pipelines(app, objects, steps, "obj")
    approvals = {s.object_id: {"by": f"approver-{s.n}"} for s in specs}
    early = [s.object_id for s in specs if s.n % 2 == 0]
    late = [s.object_id for s in specs if s.n % 2 == 1]
    sent: set[str] = set()
    duplicates_refused = 0

    def send(oid: str) -> None:
        assert app.send(oid, "approval", approvals[oid], dedupe_key=f"approval-{oid}")
        sent.add(oid)
        resend(oid)

    def resend(oid: str) -> None:
        nonlocal duplicates_refused
        try:
            fresh = app.send(oid, "approval", {"by": "duplicate"}, dedupe_key=f"approval-{oid}")
        except ObjectTerminatedError:
            return
        assert not fresh, f"{oid}: a duplicate approval was accepted"
        duplicates_refused += 1

    for oid in early:
        send(oid)
    send_at = {oid: (i + 1) * (kills - 2) // len(late) for i, oid in enumerate(late)}
    resend_at = {oid: rng.randrange(kills) for oid in specs_ids(specs)}

    live: dict[int, float | None] = {}
    by_pid: dict[int, WorkerProc] = {}
    done_kills = 0
    target = 2
    quiet = False
    while done_kills < kills and not quiet:
        while len(live) < target:
            w = cluster.spawn(concurrency=3)
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
            if now < kill_at:
                continue
            w.kill()
            del live[pid]
            done_kills += 1
            target = rng.choice((1, 2))
            for oid, at in send_at.items():
                if at <= done_kills and oid not in sent:
                    send(oid)
            for oid, at in resend_at.items():
                if at == done_kills and oid in sent:
                    resend(oid)
            # once every object has finished there is nothing left to interrupt
            quiet = len(sent) == len(specs) and all_terminal(app, specs)
            if quiet:
                break
        time.sleep(0.005)
    for pid in list(live):
        by_pid[pid].kill()
    for oid in late:
        if oid not in sent:
            send(oid)

    finish_with_one_worker(cluster, app, specs)
    audit = check_pipelines(cluster, app, specs, approvals, cluster.killed_pids())
    print(f"{done_kills} kills; {audit}; duplicates refused by dedupe: {duplicates_refused}")
    assert duplicates_refused >= len(specs)
    if done_kills >= 10:
        assert audit.unfinished >= 1, "no kill landed inside a step body; nothing was tested"
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


def specs_ids(specs: list[Spec]) -> list[str]:
    """The object ids of ``specs``."""
    return [s.object_id for s in specs]


def test_sigkill_campaign(cluster: Cluster) -> None:
    """Workers SIGKILLed at random instants mid-step lose no work and duplicate no effect.

    Every object completes with the right result; each step's effect is in the
    sink exactly once; a step ran again only where a crash cut its earlier run
    short; memory verifies through the API and ``perdure verify --all``; each
    approval (some sent before the object waits, some while it waits, all
    re-sent with the same dedupe key) is delivered exactly once.
    """
    seed = int(os.environ.get("PERDURE_SOAK_SEED", str(random.randrange(1 << 30))))
    run_kill_campaign(cluster, objects=8, kills=max(4, round(40 * soak_scale())), steps=10,
                      seed=seed)


@pytest.mark.slow
def test_sigkill_campaign_large(cluster: Cluster) -> None:
    """The SIGKILL campaign at soak size: more objects, longer agents, many more kills."""
    seed = int(os.environ.get("PERDURE_SOAK_SEED", str(random.randrange(1 << 30))))
    run_kill_campaign(cluster, objects=16, kills=max(20, round(250 * soak_scale())), steps=24,
                      seed=seed)


# -- two workers racing -------------------------------------------------------------------


def test_two_workers_race(cluster: Cluster) -> None:
    """Two workers started together on the same objects: every step runs and lands once.

    With no crash, every step key has exactly one execution and one effect; all
    objects complete; both workers took part; each object's epoch advanced past
    its first claim (it went dormant and was claimed again) and the epochs its
    steps ran under never go backwards.
    """
    app = cluster.app()
    specs = start_pipelines(app, 8, 6, "race")
    approvals = {s.object_id: {"by": f"approver-{s.n}"} for s in specs}
    for oid, payload in approvals.items():
        assert app.send(oid, "approval", payload, dedupe_key="only-once")
    workers = [cluster.spawn(concurrency=3, lease=2.0), cluster.spawn(concurrency=3, lease=2.0)]
    wait_until("all objects to finish", lambda: all_terminal(app, specs), 60)
    for w in workers:
        wait_until(f"{w.node_id} to serve", w.ready, 30)
        assert w.stop() == 0, w.log()

    audit = check_pipelines(cluster, app, specs, approvals, killed_pids=set())
    assert audit.executions == audit.steps, f"a step ran twice without a crash: {audit}"
    assert cluster.sink.deliveries("duplicate") == []
    assert cluster.sink.deliveries("refused") == []

    writers: set[str] = set()
    executions = cluster.sink.executions()
    for spec in specs:
        oid = spec.object_id
        writers |= {r.node_id for r in app.history(oid)[1:]}
        assert app.get(oid).epoch >= 2, f"{oid}: never claimed again after going dormant"
        epochs = [ex.epoch for ex in executions if ex.object_id == oid]
        assert epochs == sorted(epochs), f"{oid}: epochs went backwards: {epochs}"
        assert epochs[-1] > epochs[0], f"{oid}: all steps ran under one claim: {epochs}"
        assert app.get(oid).epoch >= epochs[-1]
    assert writers == {w.node_id for w in workers}, f"only {writers} did any work"
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


# -- SIGSTOP past the lease ---------------------------------------------------------------


def test_sigstop_past_lease(cluster: Cluster) -> None:
    """A worker frozen past its lease is fenced out when it thaws.

    Worker A is stopped (SIGSTOP) inside a long step; worker B takes the object
    over after A's lease lapses and finishes it. When A continues (SIGCONT), its
    late effect is refused by the fenced sink, its appends are refused by the
    store (it logs that its lease was lost), memory verifies, and every step's
    effect was delivered once, by one epoch.

    A is stopped outside writes to the SQLite files (a stopped process keeps its
    file locks). On PostgreSQL nothing is chosen about the store: A's sessions
    are recorded as the stop found them (idle in the pool, or inside a
    transaction) and B must still claim and finish the object.
    """
    app = cluster.app()
    oid = "frozen"
    app.options(object_id=oid).start("long_job", 5, 2.0)
    a = cluster.spawn(concurrency=1, lease=1.0)
    slow_key = f"{oid}/1/slow"

    def a_in_slow_step() -> bool:
        return any(ex.key == slow_key and ex.pid == a.pid for ex in cluster.sink.executions())

    wait_until("worker A to start the long step", a_in_slow_step, 30)
    time.sleep(0.1)
    stop_outside_writes(a, cluster.sqlite_files())
    epoch_a = app.get(oid).epoch
    frozen_at = time.monotonic()
    if cluster.backend == "postgresql":
        sessions = cluster.pg_sessions(a)
        print(f"A's PostgreSQL sessions while stopped (state, in transaction, lock): {sessions}")
        assert sessions, "A holds no PostgreSQL session; the pool should keep one open"

    b = cluster.spawn(concurrency=1, lease=1.0)
    wait_until("worker B to finish the object", lambda: app.get(oid).terminal, 30)
    assert time.monotonic() - frozen_at > 1.0, "B finished before A's lease could lapse"
    assert app.handle(oid).result(timeout=0) == agents.expected_long_job(5)
    epoch_b = app.get(oid).epoch
    assert epoch_b > epoch_a

    os.kill(a.pid, signal.SIGCONT)
    wait_until("A's late write to be refused", lambda: bool(cluster.sink.deliveries("refused")),
               15)
    wait_until("A to log that it lost its lease", lambda: bool(LEASE_LOST.search(a.log())), 15)
    assert a.stop() == 0, a.log()
    assert b.stop() == 0, b.log()

    refused = cluster.sink.deliveries("refused")
    assert [(key, epoch, pid) for key, _oid, epoch, pid, _ in refused] == [
        (slow_key, epoch_a, a.pid)
    ]
    effects = cluster.sink.effects()
    assert sorted(effects) == sorted([f"{oid}/0/quick", slow_key, f"{oid}/2/quick-2"])
    assert effects[slow_key][0] == epoch_b, "the long step's effect came from the stale epoch"
    assert effects[f"{oid}/2/quick-2"][0] == epoch_b
    inserted = Counter(row[0] for row in cluster.sink.deliveries("inserted"))
    assert set(inserted.values()) == {1}
    assert cluster.sink.fence() == {oid: epoch_b}

    runs = [ex for ex in cluster.sink.executions() if ex.key == slow_key]
    assert [(ex.pid, ex.epoch, ex.finished_at is None) for ex in runs] == [
        (a.pid, epoch_a, True),
        (b.pid, epoch_b, False),
    ]

    report = app.verify(oid)
    assert report.ok, report
    history = app.history(oid)
    b_start = min(r.seq for r in history if r.node_id == b.node_id)
    assert all(r.seq < b_start for r in history if r.node_id == a.node_id), (
        "the stopped worker appended after the takeover"
    )
    done = step_done_records(app, oid)
    assert [(r.body["name"], r.node_id) for r in done] == [
        ("quick", a.node_id), ("slow", b.node_id), ("quick-2", b.node_id)
    ]
    assert not [r for r in history if r.kind == perdure.Kind.STEP_FAILED]
    cli_verify_all(cluster)
    assert_clean_logs(cluster)


# -- recorded values reach memory before a step can use them ---------------------------


def test_recorded_value_survives_kill_after_effect(cluster: Cluster) -> None:
    """A value drawn with ``run.uuid()`` and sent out by a step stays the same after a crash.

    The worker is SIGKILLed after the step delivered the uuid to the sink but
    before the step's result reached memory. The step runs again on another
    worker (at-least-once), and must see the same uuid: the agent's result and
    the effect the outside world holds agree.
    """
    app = cluster.app()
    oid = "stamped"
    app.options(object_id=oid).start("stamped", 1.5)
    a = cluster.spawn(concurrency=1)
    wait_until("the step's effect to be delivered", lambda: bool(cluster.sink.effects()), 30)
    a.kill()
    assert not app.get(oid).terminal
    b = cluster.spawn(concurrency=1)
    wait_until("the object to finish", lambda: app.get(oid).terminal, 30)
    wait_until(f"{b.node_id} to serve", b.ready, 30)
    assert b.stop() == 0, b.log()

    result = app.handle(oid).result(timeout=0)
    ((key, (_epoch, value)),) = cluster.sink.effects().items()
    assert key == f"{oid}/1/stamp"
    assert result == {"token": value["token"], "echoed": value["token"]}, (
        "the uuid the step sent out is not the one memory recorded"
    )
    runs = [ex for ex in cluster.sink.executions() if ex.key == key]
    assert [ex.pid for ex in runs] == [a.pid, b.pid]
    assert app.verify(oid).ok
