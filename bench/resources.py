"""Resume cost versus resource checkpoints: a "24-hour" agent that recaptured its
resources every minute (1,440 descriptors) against one that did so once.

For each count N (1 and 1,440; the quick run 1 and 200), in a fresh database: an object of
the ``checkpointer`` agent holds a working directory, environment variables and an open
file; N times it writes a line to the file and records its resources' descriptors
(``run.checkpoint_resources()``: the file's new position each time), then waits for the
event ``go``. A new App (a new node, nothing cached) sends ``go`` and runs a worker:

* ``ms_resume``: from the worker's start to the agent's next new step (claim, read and
  verify the memory, restore the three resources, replay, append);
* ``ms_restore``: what the restore report says the restore took (the latest descriptor
  of each resource is read; the superseded ones are skipped without being decoded);
* ``records``: the memory's length.

Compared against the floor: ``resume_ratio = ms_resume(N) / ms_resume(1)``, the whole
resume: within the floor when ``ms_resume(N)`` is at most ``RATIO_FLOOR`` times
``ms_resume(1)`` plus ``SLACK_MS``. Recaptured descriptors go to the resource's checkpoint
slot (``perdure.engine.slots``), one row replaced each time, so the memory a claim reads
and verifies does not grow with the checkpoints. Reported beside it, ``restore_ratio``
(the restore alone).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

import perdure
from bench.common import Backend, fresh_database
from perdure.resources import Environment, OpenFile, WorkingDirectory

__all__ = ["FULL", "QUICK", "RATIO_FLOOR", "SLACK_MS", "measure", "table"]

QUICK = {"counts": [1, 200], "repeats": 1}
FULL = {"counts": [1, 1440], "repeats": 3}
RATIO_FLOOR = 1.2  # a whole resume after N checkpoints may take at most this many times one's
SLACK_MS = 1.0  # plus this much: noise on a resume of a few tens of milliseconds


class _Stamps:
    at: ClassVar[list[float]] = []


def _stamp() -> int:
    _Stamps.at.append(time.perf_counter())
    return len(_Stamps.at)


def _register(app: perdure.App) -> None:
    @app.agent(name="checkpointer")
    async def checkpointer(run: perdure.Run, n: int, folder: str) -> int:
        work = await run.resource("wd", WorkingDirectory(folder))
        await run.resource("env", Environment({"MODE": "bench", "TOKEN": "t"},
                                              secret=["TOKEN"]))
        log = await run.resource("log", OpenFile(Path(work) / "agent.log", "w"))
        if not run.replaying:
            for minute in range(n):
                log.write(f"minute {minute}\n")
                await run.checkpoint_resources()
        await run.wait_for("go")
        return await run.step(_stamp)


def _one(backend: Backend, folder: Path, n: int, admin_url: str) -> dict[str, Any]:
    with fresh_database(backend, folder, admin_url) as db:
        keys = folder / "keys"
        first = perdure.App(store=db.url, key_dir=keys, lease_seconds=5, poll_interval=0.005)
        _register(first)
        oid = f"cp-{n}"
        first.options(object_id=oid).start("checkpointer", n, str(folder / "work"))
        first.run_worker(until=lambda: first.get(oid).status == "dormant")
        first.close()
        second = perdure.App(store=db.url, key_dir=keys, node_id="resumer", lease_seconds=5,
                             poll_interval=0.005)
        _register(second)
        second.send(oid, "go", None)
        _Stamps.at.clear()
        began = time.perf_counter()
        second.run_worker(until=lambda: bool(_Stamps.at))
        resumed = _Stamps.at[0] - began
        history = second.history(oid)
        report = [r.body for r in history if r.kind == perdure.Kind.RESTORE_REPORT][-1]
        second.close()
    return {"ms_resume": round(resumed * 1000, 2),
            "ms_restore": round(report["seconds"] * 1000, 3), "records": len(history)}


def measure(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
            ) -> dict[str, Any]:
    """The figures per checkpoint count (medians over ``repeats``), and the ratio."""
    out: dict[str, Any] = {}
    _one(backend, folder / "warm-up", 1, admin_url)  # imports, first connections: not timed
    for n in sizes["counts"]:
        runs = [_one(backend, folder / f"n{n}-{i}", n, admin_url)
                for i in range(sizes["repeats"])]
        out[str(n)] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    low, high = (str(c) for c in (min(sizes["counts"]), max(sizes["counts"])))
    restore = out[high]["ms_restore"] / max(out[low]["ms_restore"], 1e-6)
    out["restore_ratio"] = round(restore, 2)
    out["resume_ratio"] = round(out[high]["ms_resume"] / max(out[low]["ms_resume"], 1e-6), 2)
    out["floor"] = RATIO_FLOOR
    out["within_floor"] = (out[high]["ms_resume"]
                           <= RATIO_FLOOR * out[low]["ms_resume"] + SLACK_MS)
    return out


def table(report: dict[str, Any]) -> str:
    """The figures as a Markdown table (``python -m bench --markdown``); empty when the
    part did not run."""
    rows = []
    for figures in report["backends"].values():
        got = figures.get("resources")
        if not got:
            continue
        counts = [key for key in got if key.isdigit()]
        for count in counts:
            one = got[count]
            rows.append(f"| {figures['store']} | {int(count):,} | {one['records']:,} | "
                        f"{one['ms_restore']:.3f} ms | {one['ms_resume']:.1f} ms |")
        rows.append(f"| {figures['store']} | ratio | | {got['restore_ratio']} "
                    f"({'within' if got['within_floor'] else 'over'} the floor) | "
                    f"{got['resume_ratio']} |")
    if not rows:
        return ""
    head = ("| store | checkpoints | records | restore | resume → next step |\n"
            "| --- | --- | --- | --- | --- |\n")
    return head + "\n".join(rows) + "\n"
