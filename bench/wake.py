"""Wake latency: from ``app.send`` to the agent running again, in a separate worker process.

Objects of the ``pinger`` agent (``bench/agents.py``) loop ``wait_for("ping")`` and
then a step that returns ``time.time()``; that value is recorded in memory. The
benchmark starts one ``perdure worker`` process, and for each wake: waits until the
object is dormant again, pauses a random 0 to ``jitter`` seconds (so sends do not fall
in step with the worker's poll timer), notes ``time.time()`` and calls ``app.send``.
Latency is the recorded step time minus that send time (one machine, one clock).

The send pushes the wake-up: on SQLite through the folder of sockets beside the file,
on PostgreSQL by ``NOTIFY``; the worker's ``--poll`` is only its fallback where pushing is
unavailable. Wakes are spread over several objects (``wakes_per_object``
each) so that no object's memory grows long enough to slow its replay.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import perdure
from bench import agents
from bench.common import Backend, Database, percentile, start_workers, stop_workers


def _until(check: Any, timeout: float, what: str, pause: float = 0.001) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(pause)


def wake_latency(
    db: Database,
    folder: Path,
    *,
    poll: float,
    objects: int,
    wakes_per_object: int,
    jitter: float,
) -> dict[str, Any]:
    """``objects`` times ``wakes_per_object`` wakes through one worker process; latency figures."""
    key_dir = folder / "keys"
    app = agents.register(perdure.App(store=db.url, key_dir=key_dir, node_id="bench-sender"))
    procs = []
    try:
        ids = [f"pinger-{j}" for j in range(objects)]
        for oid in ids:
            app.options(object_id=oid).start("pinger", wakes_per_object)
        procs = start_workers(db.url, key_dir, 1, concurrency=16, poll=poll,
                              log_dir=folder / "logs")

        def dormant(oid: str, after: int) -> bool:
            info = app.get(oid)
            if info.status == "completed":
                return True
            return info.status == "dormant" and info.waiting_event == "ping" and (
                info.records > after
            )

        for oid in ids:
            _until(lambda oid=oid: dormant(oid, 0), 60, f"{oid} to wait for its first ping")
        sends: dict[str, list[float]] = {oid: [] for oid in ids}
        send_calls: list[float] = []
        for oid in ids:
            for _ in range(wakes_per_object):
                before = app.get(oid).records
                time.sleep(random.uniform(0, jitter))
                sent = time.time()
                app.send(oid, "ping", None)
                send_calls.append(time.time() - sent)
                sends[oid].append(sent)
                _until(lambda oid=oid, before=before: dormant(oid, before), 60,
                       f"{oid} to run after a ping")
        latencies: list[float] = []
        for oid in ids:
            ran = [r.body["result"] for r in app.history(oid)
                   if r.kind == "step_done"]
            if len(ran) != wakes_per_object:
                raise RuntimeError(f"{oid}: {len(ran)} wake steps recorded, "
                                   f"expected {wakes_per_object}")
            latencies += [(t - s) * 1e3 for s, t in zip(sends[oid], ran, strict=True)]
        verified = all(app.verify(oid).ok for oid in ids)
    finally:
        stop_workers(procs, folder / "logs")
        app.close()
    return {
        "wakes": len(latencies),
        "objects": objects,
        "poll_s": poll if db.backend.kind == "sqlite" else None,
        "wake_by": "socket" if db.backend.kind == "sqlite" else "notify",
        "jitter_s": jitter,
        "ms_p50": statistics.median(latencies),
        "ms_p90": percentile(latencies, 0.90),
        "ms_p99": percentile(latencies, 0.99),
        "ms_min": min(latencies),
        "ms_max": max(latencies),
        "ms_mean": statistics.fmean(latencies),
        "send_call_ms_median": statistics.median(send_calls) * 1e3,
        "chain_verified": verified,
    }


def settings_for(backend: Backend, sqlite_polls: tuple[float, ...]) -> list[tuple[str, float]]:
    """The (figure name, worker poll interval) pairs measured for ``backend``: SQLite
    pushes too, so its default poll (the first of ``sqlite_polls``) is only a fallback."""
    if backend.kind == "sqlite":
        return [("push", sqlite_polls[0])]
    return [("notify", 0.01)]
