"""Claim throughput: 1, 2, 4 worker processes on objects that are all ready at once.

``objects`` objects of the ``one_step`` agent (one trivial step that returns
``time.time()``, then done) are created first. Then N ``perdure worker`` processes
start and wait at a gate (``bench/agents.py``) until all of them have loaded; the gate
opens and they compete for the objects. Throughput is objects per second from the
first step to run (just after the first claim) to the last ``terminated`` record,
both taken from the objects' memory.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import perdure
from bench import agents
from bench.common import Database, open_gate, start_workers, stop_workers


def claim_throughput(
    db: Database, folder: Path, *, workers: int, objects: int, concurrency: int, poll: float
) -> dict[str, Any]:
    """Run ``objects`` one-step objects on ``workers`` processes; objects per second."""
    key_dir = folder / "keys"
    app = agents.register(perdure.App(store=db.url, key_dir=key_dir, node_id="bench-starter"))
    procs = []
    log_dir = folder / "logs"
    ids = [f"one-{i:05d}" for i in range(objects)]
    try:
        for i, oid in enumerate(ids):
            app.options(object_id=oid).start("one_step", i)
        gate = folder / "gate"
        done_sql = "SELECT count(*) FROM objects WHERE status = 'completed'"
        with db.query(done_sql) as completed:
            try:
                procs = start_workers(db.url, key_dir, workers, concurrency=concurrency,
                                      poll=poll, log_dir=log_dir, gate=gate)
                open_gate(gate, procs)
                deadline = time.monotonic() + 600
                while (completed() or 0) < objects:
                    for proc in procs:
                        if proc.poll() is not None:
                            raise RuntimeError(
                                f"a worker exited with {proc.returncode} (see {log_dir})"
                            )
                    if time.monotonic() > deadline:
                        raise TimeoutError("objects did not complete within 600 s")
                    time.sleep(0.02)
            finally:
                stop_workers(procs, log_dir)
        first_step, last_done = float("inf"), 0.0
        by_node: collections.Counter[str] = collections.Counter()
        for oid in ids:
            records = app.store.records(oid)
            step = next(r for r in records if r.kind == "step_done")
            end = next(r for r in records if r.kind == "terminated")
            if end.body.get("outcome") != "completed":
                raise RuntimeError(f"{oid} ended {end.body.get('outcome')}")
            first_step = min(first_step, float(step.body["result"]))
            last_done = max(last_done, end.ts_us / 1e6)
            by_node[step.node_id] += 1
        verified = bool(app.verify(ids[0]).ok and app.verify(ids[-1]).ok)
    finally:
        app.close()
    elapsed = last_done - first_step
    return {
        "workers": workers,
        "objects": objects,
        "concurrency_per_worker": concurrency,
        "seconds": elapsed,
        "objects_per_s": objects / elapsed,
        "objects_per_worker": sorted(by_node.values(), reverse=True),
        "chain_verified": verified,
    }
