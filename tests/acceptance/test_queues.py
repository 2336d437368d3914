"""Acceptance: queue limits held by real ``perdure worker`` processes sharing a store.

A sampler thread reads the store's live leases (one consistent read each time) in a loop
while several workers run objects of capped queues, and checks every limit at every
sample: the queue's slots over all nodes, per key, per worker. Objects sleep between
their steps, so slots are let go and taken again all the time; the SIGKILL campaign
kills workers holding slots and checks that every object ends and no slot is left held.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure.stores import open_store
from tests.acceptance.harness import (
    PERDURE_CMD,
    REPO_ROOT,
    Cluster,
    WorkerProc,
    soak_scale,
    wait_until,
)
from tests.acceptance.queue_agents import build_app, starts

APP_SPEC = "tests.acceptance.queue_agents:app"
CAPS = {"capped": 3, "ranked": 1}  # slots over every node
PER_KEY = {"keyed": 1}
PER_WORKER = {"per-worker": 2}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "marks"
    made.mkdir()
    return made


@pytest.fixture
def app(cluster: Cluster) -> Iterator[perdure.App]:
    made = build_app(cluster.store_url, str(cluster.key_dir))
    yield made
    made.close()


def spawn(cluster: Cluster, folder: Path, concurrency: int = 6) -> WorkerProc:
    """``perdure worker`` on the queue agents, with its own node id and log."""
    node_id = f"q{len(cluster.workers):02d}"
    log_path = cluster.log_dir / f"{node_id}.log"
    environ = {**cluster.env(node_id), "PERDURE_TEST_DIR": str(folder)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PERDURE_CMD, "--app", APP_SPEC, "--node-id", node_id, "worker", "--lease", "1",
             "--poll", "0.02", "--concurrency", str(concurrency)],
            cwd=REPO_ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    worker = WorkerProc(node_id, proc, log_path)
    cluster.workers.append(worker)
    return worker


class Sampler:
    """Reads the live leases in a loop and notes every sample that breaks a limit.

    Object ids are ``QUEUE~KEY~N``. A lease counts as live until a little after its
    expiry (the sampler's clock and the store's are the same machine's; the margin only
    makes a breach easier to see, never hides one)."""

    def __init__(self, store_url: str) -> None:
        self.store = open_store(store_url)
        self.stop = threading.Event()
        self.breaches: list[str] = []
        self.most: Counter[str] = Counter()
        self.owners: dict[str, set[str]] = {}
        self.samples = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.store.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            held = self.store.lease_holders(time.time() - 0.01, 100_000)
            self.samples += 1
            per_queue: Counter[str] = Counter()
            per_key: Counter[tuple[str, str]] = Counter()
            per_worker: Counter[tuple[str, str]] = Counter()
            for object_id, owner in held:
                queue, key, _ = object_id.split("~")
                per_queue[queue] += 1
                per_key[queue, key] += 1
                per_worker[queue, owner] += 1
                self.owners.setdefault(queue, set()).add(owner)
            for queue, count in per_queue.items():
                self.most[queue] = max(self.most[queue], count)
                if count > CAPS.get(queue, 1 << 30):
                    self.breaches.append(f"{queue}: {count} held {sorted(held)}")
            for (queue, key), count in per_key.items():
                if count > PER_KEY.get(queue, 1 << 30):
                    self.breaches.append(f"{queue}/{key}: {count} held")
            for (queue, owner), count in per_worker.items():
                if count > PER_WORKER.get(queue, 1 << 30):
                    self.breaches.append(f"{queue} on {owner}: {count} held")
            time.sleep(0.003)


def _start(app: perdure.App, queue: str, count: int, *, keys: int = 1, seconds: float = 0.2,
           naps: int = 1) -> list[str]:
    ids = []
    for n in range(count):
        oid = f"{queue}~k{n % keys}~{n:03d}"
        app.options(object_id=oid, queue=queue, key=f"k{n % keys}").start(
            "job", oid, seconds, naps)
        ids.append(oid)
    return ids


def _all_completed(app: perdure.App, ids: list[str]) -> bool:
    return all(app.get(oid, explain=False).status == "completed" for oid in ids)


def test_caps_hold_at_every_sample_across_worker_processes(
        cluster: Cluster, app: perdure.App, folder: Path) -> None:
    """Five workers (six slots each) run 9 objects of a queue capped at 3, 9 of a queue
    capped at 1 per key (3 keys) and 11 of a queue capped at 2 per worker; at no sampled
    instant does any limit break, the capped queue fills its 3 slots, and the per-worker
    queue is spread over several workers instead of one taking all it can."""
    ids = (_start(app, "capped", 9) + _start(app, "keyed", 9, keys=3)
           + _start(app, "per-worker", 11, seconds=0.3))
    with Sampler(cluster.store_url) as sampler:
        workers = [spawn(cluster, folder) for _ in range(5)]
        wait_until("every object to complete", lambda: _all_completed(app, ids), 120)
    assert sampler.breaches == []
    assert sampler.samples > 50
    assert sampler.most["capped"] == 3
    assert sampler.most["keyed"] == 3  # one per key, three keys at once
    assert len(sampler.owners["per-worker"]) >= 3
    for worker in workers:
        assert worker.stop() == 0


def test_priority_and_the_limiter_with_two_workers(
        cluster: Cluster, app: perdure.App, folder: Path) -> None:
    """Objects of a one-slot priority queue run lowest priority first whatever their
    start order; a queue limited to 3 starts per second never starts a fourth within a
    second (judged by the store's own record of each first claim)."""
    ranks = [5, 1, 3, 0, 2, 4]
    ranked = []
    for n, rank in enumerate(ranks):
        oid = f"ranked~r{rank}~{n:03d}"
        app.options(object_id=oid, queue="ranked", priority=rank).start("job", oid, 0.05)
        ranked.append(oid)
    paced = _start(app, "paced", 9, seconds=0.0, naps=0)
    for _ in range(2):
        spawn(cluster, folder)
    wait_until("every object to complete", lambda: _all_completed(app, ranked + paced), 120)
    order = [name for name, _ in starts(folder) if name.startswith("ranked")]
    assert order == sorted(ranked, key=lambda oid: int(oid.split("~")[1][1:]))
    first_claims = sorted(_started_at(cluster, "paced"))
    assert len(first_claims) == 9
    for early, late in zip(first_claims, first_claims[3:], strict=False):
        assert late - early > 1.0 - 1e-6, first_claims


def _started_at(cluster: Cluster, queue: str) -> list[float]:
    """When each object of ``queue`` was first claimed, as the store recorded it."""
    if cluster.store_path is not None:
        with sqlite3.connect(cluster.store_path) as conn:
            rows = conn.execute("SELECT started_at FROM objects WHERE queue = ?",
                                (queue,)).fetchall()
    else:
        import psycopg

        with psycopg.connect(cluster.store_url) as conn:
            rows = conn.execute("SELECT started_at FROM objects WHERE queue = %s",
                                (queue,)).fetchall()
    return [float(row[0]) for row in rows]


def _kill_campaign(cluster: Cluster, app: perdure.App, folder: Path, kills: int,
                   seed: int) -> None:
    rng = random.Random(seed)
    ids = _start(app, "capped", 12, seconds=0.15, naps=2) + _start(
        app, "keyed", 12, keys=3, seconds=0.15, naps=2)
    with Sampler(cluster.store_url) as sampler:
        live = [spawn(cluster, folder, concurrency=4) for _ in range(3)]
        for _ in range(kills):
            time.sleep(rng.uniform(0.2, 0.6))
            victim = live.pop(rng.randrange(len(live)))
            if victim.alive():
                victim.kill()
            live.append(spawn(cluster, folder, concurrency=4))
        wait_until("every object to complete", lambda: _all_completed(app, ids), 180)
    assert sampler.breaches == [], sampler.breaches[:5]
    # No slot is left held: every queued object ended, so nothing of the queues is held,
    # ready or waiting (a killed worker's leases count until they lapse, 1 s at most).

    def drained() -> bool:
        stats = {s.queue.name: s for s in app.store.queue_stats(time.time())}
        return all((stats[name].held, stats[name].ready, stats[name].waiting) == (0, 0, 0)
                   for name in ("capped", "keyed"))

    wait_until("no slot held", drained, 10)
    assert any(w.killed for w in cluster.workers)
    for worker in live:
        worker.stop()


def test_sigkill_campaign_leaks_no_slot(cluster: Cluster, app: perdure.App,
                                        folder: Path) -> None:
    """Workers SIGKILLed at random while they hold slots: the limits hold at every sample
    (a dead worker's slots stay held until its leases lapse, then free themselves), every
    object completes, and no slot is left held."""
    seed = int(os.environ.get("PERDURE_TEST_SEED", random.randrange(1 << 30)))
    print(f"queue kill campaign seed {seed}")
    _kill_campaign(cluster, app, folder, max(2, int(5 * soak_scale())), seed)


@pytest.mark.slow
def test_sigkill_campaign_leaks_no_slot_long(cluster: Cluster, app: perdure.App,
                                             folder: Path) -> None:
    """The campaign above with more kills."""
    _kill_campaign(cluster, app, folder, max(10, int(40 * soak_scale())),
                   random.randrange(1 << 30))
