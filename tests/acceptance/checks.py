"""Checks shared by the acceptance tests: start pipelines, then audit what the world saw.

``check_pipelines`` compares each finished object's result and memory with the
fenced sink: every recorded step's effect arrived exactly once, and any extra
execution of a step was cut short by a crash, a lost lease or a store outage.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import perdure
from tests.acceptance import agents
from tests.acceptance.harness import Cluster, WorkerProc, wait_until
from tests.acceptance.sink import Execution

__all__ = [
    "LEASE_LOST",
    "Audit",
    "Spec",
    "all_terminal",
    "assert_clean_logs",
    "check_pipelines",
    "cli_verify_all",
    "finish_with_one_worker",
    "start_pipelines",
    "step_done_records",
]

LEASE_LOST = re.compile(r"lease on \S+ lost|no longer holds the lease|lease lost")


@dataclass(frozen=True)
class Spec:
    """One started object: its agent and arguments."""

    object_id: str
    agent: str
    n: int
    steps: int
    nap: float


@dataclass
class Audit:
    """What the checks counted, printed by the tests for the record."""

    steps: int = 0
    executions: int = 0
    unfinished: int = 0
    lost_commits: int = 0


def start_pipelines(app: perdure.App, count: int, steps: int, prefix: str) -> list[Spec]:
    """Start ``count`` pipeline objects, alternating the async and the sync agent."""
    specs = []
    for n in range(count):
        agent = "pipeline" if n % 2 == 0 else "sync_pipeline"
        spec = Spec(f"{prefix}-{n}", agent, n, steps, 0.15 + 0.05 * (n % 3))
        app.options(object_id=spec.object_id).start(agent, spec.n, spec.steps, spec.nap)
        specs.append(spec)
    return specs


def all_terminal(app: perdure.App, specs: list[Spec]) -> bool:
    """True when every object has completed, failed or been cancelled."""
    return all(app.get(s.object_id).terminal for s in specs)


def step_done_records(app: perdure.App, object_id: str) -> list[perdure.Record]:
    """The object's step-done records, in memory order."""
    return [r for r in app.history(object_id) if r.kind == perdure.Kind.STEP_DONE]


def check_pipelines(
    cluster: Cluster,
    app: perdure.App,
    specs: list[Spec],
    approvals: dict[str, dict[str, Any]],
    killed_pids: set[int],
) -> Audit:
    """Check results, memory, sink effects, executions and events of finished pipelines.

    Executions: each step key has exactly one execution that produced its
    recorded result (by the worker that appended the step-done record), under
    the highest epoch; any other execution of that key ran under an older claim
    in a worker that was SIGKILLed (or, under heavy load, lost its lease) before
    its result reached memory. So executions <= 1 + executions cut short.

    ``killed_pids`` are the workers whose runs may have been cut short: the
    SIGKILLed ones, or every worker when the store itself went away (a run that
    hits a store error is abandoned, and the same process may claim the object
    again later and run the step once more under a newer epoch).
    """
    audit = Audit()
    node_pids = cluster.node_pids()
    effects = cluster.sink.effects()
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for ex in cluster.sink.executions():
        by_key[ex.key].append(ex)
    lease_losers = {w.pid for w in cluster.workers if LEASE_LOST.search(w.log())}
    inserted = Counter(row[0] for row in cluster.sink.deliveries("inserted"))
    expected_keys: set[str] = set()

    for spec in specs:
        oid = spec.object_id
        info = app.get(oid)
        assert info.status == perdure.Status.COMPLETED, (oid, info)
        result = app.handle(oid).result(timeout=0)
        assert result == agents.expected_pipeline(spec.n, spec.steps, result["token"],
                                                  approvals[oid]), oid
        report = app.verify(oid)
        assert report.ok, report

        history = app.history(oid)
        kinds = Counter(r.kind for r in history)
        for bad in (perdure.Kind.STEP_FAILED, perdure.Kind.STEP_IN_DOUBT,
                    perdure.Kind.NONDETERMINISM):
            assert kinds[bad] == 0, (oid, bad, kinds)
        received = [r for r in history if r.kind == perdure.Kind.EVENT_RECEIVED]
        assert [r.body["name"] for r in received] == ["approval"], oid
        assert received[0].body["payload"] == approvals[oid], oid
        assert app.store.pending_events(oid) == [], f"{oid}: an approval was left undelivered"
        assert kinds[perdure.Kind.TERMINATED] == 1, oid

        done = step_done_records(app, oid)
        assert [r.body["name"] for r in done] == (
            ["ingest"] + [f"work-{i}" for i in range(spec.steps)] + ["publish"]
        ), oid
        previous: Any = None
        for rec in done:
            key = f"{oid}/{rec.body['pos']}/{rec.body['name']}"
            expected_keys.add(key)
            assert key in effects, f"{key}: recorded as done but its effect never arrived"
            _epoch, value = effects[key]
            recorded = rec.body["result"]
            if rec.body["name"] == "ingest":
                assert value == {"n": spec.n, "token": result["token"], "out": recorded}, key
            elif rec.body["name"] == "publish":
                assert value == recorded, key
            else:
                assert value["out"] == recorded and value["in"] == previous, key
            previous = recorded
            assert inserted[key] == 1, f"{key}: inserted {inserted[key]} times"

            runs = by_key[key]
            writer_pid = node_pids[rec.node_id]
            mine = [ex for ex in runs if ex.pid == writer_pid and ex.finished_at is not None]
            assert mine, f"{key}: no finished execution by the worker that recorded it"
            recorded_run = max(mine, key=lambda ex: ex.epoch)
            epochs = Counter((ex.pid, ex.epoch) for ex in runs)
            assert max(epochs.values()) == 1, f"{key}: ran twice under one claim: {runs}"
            lost = [ex for ex in runs if ex is not recorded_run]
            for ex in lost:
                assert ex.epoch < recorded_run.epoch, f"{key}: {ex} outlived the recorded claim"
                assert ex.pid in killed_pids or ex.pid in lease_losers, (
                    f"{key}: execution {ex} was neither recorded nor cut short by a crash "
                    "or a lost lease"
                )
            unfinished = sum(1 for ex in runs if ex.finished_at is None)
            audit.steps += 1
            audit.executions += len(runs)
            audit.unfinished += unfinished
            audit.lost_commits += len(lost) - unfinished

    assert set(effects) == expected_keys, "the sink holds effects no recorded step explains"
    return audit


def cli_verify_all(cluster: Cluster) -> None:
    """``perdure verify --all`` exits 0 and says ok for every object."""
    done = cluster.cli("verify", "--all")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout


def assert_clean_logs(cluster: Cluster) -> None:
    """No worker hit an engine error or printed a traceback."""
    for w in cluster.workers:
        text = w.log()
        assert "Traceback" not in text and "engine error" not in text, f"{w.node_id}:\n{text}"


def finish_with_one_worker(cluster: Cluster, app: perdure.App, specs: list[Spec],
                           timeout: float = 60.0) -> WorkerProc:
    """Run one worker until every object is terminal, then stop it gracefully."""
    final = cluster.spawn(concurrency=8)
    wait_until("the final worker to serve", final.ready, 30)
    wait_until("all objects to finish", lambda: all_terminal(app, specs), timeout)
    assert final.stop() == 0, final.log()
    return final
