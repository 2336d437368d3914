"""Every perdure benchmark, on every backend, in one JSON document.

``python -m bench`` (or ``python bench/run.py``) runs, for SQLite FULL, SQLite NORMAL
and PostgreSQL:

* ``steps``: the floor commit, sequential steps and concurrent objects
  (``bench/steps.py``);
* ``wake``: latency from ``app.send`` to the agent running again, with a worker in a
  separate process (``bench/wake.py``); SQLite workers poll, PostgreSQL pushes;
* ``claims``: objects per second with 1, 2 and 4 worker processes on objects that are
  all ready at once (``bench/claims.py``);
* ``recovery``: a 200-step object SIGKILLed at step 100 and resumed by a fresh process
  (``bench/recovery.py``);
* ``history``: resume cost and storage bytes per step at 10, 1,000 and 10,000 recorded
  steps (``bench/resume.py``, ``bench/storage.py``);
* ``model``: model calls against the scripted local server, on SQLite only: bytes per
  turn of a 10, 100 and 200-turn conversation beside LangGraph's ``SqliteSaver``, and the
  stream journal's cost in tokens per second against a plain SDK client
  (``bench/model.py``; needs ``perdure[llm]``, else "n/a").
* ``e2e``: what users get through a ``perdure worker`` process with default settings,
  started and awaited from a separate client process, with plain ``def`` steps:
  sequential steps, 50 objects at once, start → result latency, idle worker CPU and
  the worker's worst event-loop lag, each beside the floor and its goal
  (``bench/e2e.py``).
* ``dormant``: an idle worker's CPU, its two idle queries and a new object's latency
  beside 0, 100,000 and 1,000,000 dormant objects, on SQLite FULL and PostgreSQL
  (``bench/dormant.py``);
* ``quota``: model calls under ``app.model_quota`` from several worker processes against
  the scripted server enforcing the same token quota (429 with ``retry-after`` past it):
  the share of the quota used and of calls refused, against the floors of 85% used and
  at most 1% refused, on SQLite only (``bench/quota.py``; needs ``perdure[llm]``);
* ``ui``: the dashboard's objects list on SQLite filled to 100,000 objects: milliseconds
  per page of 50 (first, deep, filtered, searched, and the whole HTTP page) against a
  floor (``bench/ui.py``; needs ``perdure[ui]``).

Then the peers, DBOS and LangGraph, on the same workloads where they can do them
(``bench/peers``; ``--no-peers`` leaves them out; not installed: "n/a").

``--quick`` uses tiny sizes (a smoke run of some seconds); ``--only steps,wake`` picks
parts; ``--markdown`` prints the tables for ``docs/benchmarks.md`` instead of JSON
(``python -m bench.render FILE.json`` renders a saved JSON document). Nothing asserts
on speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import claims, dormant, e2e, model, peers, quota, recovery, resume, steps, ui, wake
from bench import resources as resource_bench
from bench.common import (
    Backend,
    fresh_database,
    loadavg,
    machine,
    median_of,
    pick_backends,
    progress,
)

PARTS = ("steps", "wake", "claims", "recovery", "history", "model", "resources", "ui",
         "e2e", "dormant", "quota")

QUICK = {
    "steps": steps.QUICK_SIZES,
    "wake": {"objects": 1, "wakes_per_object": 2, "sqlite_polls": [0.1, 0.01],
             "peer_budget_s": 30},
    "claims": {"objects": 20, "workers": [1, 2, 4], "concurrency": 16, "poll": 0.01,
               "repeats": 1},
    "recovery": recovery.QUICK,
    "history": resume.QUICK,
    "model": model.QUICK,
    "resources": resource_bench.QUICK,
    "ui": ui.QUICK,
    "e2e": e2e.QUICK,
    "dormant": dormant.QUICK,
    "quota": quota.QUICK,
}
FULL = {
    "steps": steps.FULL_SIZES,
    # peer_budget_s: a peer's wake run stops starting new rounds after this long (DBOS on
    # SQLite polls once a second by default: 200 wakes take about 160-200 s).
    "wake": {"objects": 10, "wakes_per_object": 20, "sqlite_polls": [0.1, 0.01],
             "peer_budget_s": 180},
    "claims": {"objects": 1000, "workers": [1, 2, 4], "concurrency": 16, "poll": 0.01,
               "repeats": 1},
    "recovery": recovery.FULL,
    "history": resume.FULL,
    "model": model.FULL,
    "resources": resource_bench.FULL,
    "ui": ui.FULL,
    "e2e": e2e.FULL,
    "dormant": dormant.FULL,
    "quota": quota.FULL,
}


def measure_wake(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
                 ) -> dict[str, Any]:
    """Wake latency for each poll interval (SQLite) or by NOTIFY (PostgreSQL)."""
    out: dict[str, Any] = {}
    for name, poll in wake.settings_for(backend, tuple(sizes["sqlite_polls"])):
        sub = folder / name
        with fresh_database(backend, sub, admin_url) as db:
            out[name] = wake.wake_latency(
                db, sub, poll=poll, objects=sizes["objects"],
                wakes_per_object=sizes["wakes_per_object"],
                jitter=0.02,
            )
    return out


def measure_claims(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
                   ) -> dict[str, Any]:
    """Objects per second for each worker-process count (median over repeats)."""
    out: dict[str, Any] = {}
    for workers in sizes["workers"]:
        runs = []
        for rep in range(sizes["repeats"]):
            sub = folder / f"workers{workers}" / f"run{rep}"
            with fresh_database(backend, sub, admin_url) as db:
                runs.append(claims.claim_throughput(
                    db, sub, workers=workers, objects=sizes["objects"],
                    concurrency=sizes["concurrency"], poll=sizes["poll"],
                ))
        out[str(workers)] = median_of(runs)
    return out


def measure_recovery(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
                     ) -> dict[str, Any]:
    """The crash-recovery figures on a fresh database."""
    with fresh_database(backend, folder, admin_url) as db:
        return recovery.crash_recovery(db, folder, sizes)


def measure_model(folder: Path, sizes: dict[str, Any], with_peers: bool) -> dict[str, Any]:
    """The model-call figures (SQLite, whatever the backends), or n/a without the SDKs."""
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        return {"na": "openai not installed (pip install 'perdure[llm]')"}
    t0 = time.monotonic()
    got = model.measure(folder, sizes, with_peers)
    got["seconds"] = round(time.monotonic() - t0, 1)
    return got


def measure_quota(folder: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """The model-quota figures (SQLite, whatever the backends), or n/a without the SDKs."""
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        return {"na": "openai not installed (pip install 'perdure[llm]')"}
    t0 = time.monotonic()
    got = quota.measure(folder, sizes)
    got["seconds"] = round(time.monotonic() - t0, 1)
    progress(f"sqlite quota: {got['seconds']:.1f} s")
    return got


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the chosen parts on the chosen backends, print JSON or tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps.add_arguments(parser)
    parser.add_argument("--only", help=f"comma-separated parts to run (of {', '.join(PARTS)})")
    parser.add_argument("--claim-repeats", type=int, help="runs per claim figure (default 1)")
    parser.add_argument("--no-peers", action="store_true",
                        help="leave out DBOS and LangGraph (perdure and the floors only)")
    parser.add_argument("--markdown", action="store_true",
                        help="print Markdown tables instead of JSON")
    args = parser.parse_args(argv)
    logging.getLogger("perdure").setLevel(logging.ERROR)
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    backends = pick_backends(args.backends)
    sizes = json.loads(json.dumps(QUICK if args.quick else FULL))
    if args.repeats is not None:
        sizes["steps"]["repeats"] = max(1, args.repeats)
        sizes["history"] = {**sizes["history"], "resume_repeats": max(1, args.repeats)}
    if args.claim_repeats is not None:
        sizes["claims"]["repeats"] = max(1, args.claim_repeats)
    uses_pg = any(b.kind == "postgresql" for b in backends)
    began = time.monotonic()
    with steps.bench_dir(args.dir) as db_dir:
        run_dir = db_dir / time.strftime("%Y%m%d-%H%M%S")
        report: dict[str, Any] = {
            "bench": "perdure",
            "quick": args.quick,
            "parts": parts,
            "sizes": {p: sizes[p] for p in parts},
            "machine": machine(db_dir, args.pg if uses_pg else None),
        }
        report["machine"]["peers"] = peers.versions()
        if "steps" in parts:
            report["baseline"] = steps.python_baseline(sizes["steps"]["baseline_calls"])
        report["backends"] = {}
        for backend in backends:
            here = run_dir / backend.name
            figures: dict[str, Any] = {"store": backend.label, "seconds": {}}

            def timed(part: str, fn: Any, *fn_args: Any, backend: Backend = backend,
                      figures: dict[str, Any] = figures) -> Any:
                t0 = time.monotonic()
                got = fn(*fn_args)
                took = time.monotonic() - t0
                figures["seconds"][part] = round(took, 1)
                progress(f"{backend.name} {part}: {took:.1f} s")
                return got

            if "steps" in parts:
                got = timed("steps", steps.measure_backend, backend, here / "steps",
                            sizes["steps"], args.pg)
                figures.update({k: got[k] for k in ("floor", "group_floor", "sequential",
                                                    "concurrent")})
            if "wake" in parts:
                figures["wake"] = timed("wake", measure_wake, backend, here / "wake",
                                        sizes["wake"], args.pg)
            if "claims" in parts:
                figures["claims"] = timed("claims", measure_claims, backend, here / "claims",
                                          sizes["claims"], args.pg)
            if "recovery" in parts:
                figures["recovery"] = timed("recovery", measure_recovery, backend,
                                            here / "recovery", sizes["recovery"], args.pg)
            if "history" in parts:
                figures.update(timed("history", resume.measure, backend, here / "history",
                                     sizes["history"], args.pg))
            if "resources" in parts:
                figures["resources"] = timed("resources", resource_bench.measure, backend,
                                             here / "resources", sizes["resources"], args.pg)
            if "e2e" in parts:
                figures["e2e"] = timed("e2e", e2e.measure, backend, here / "e2e",
                                       sizes["e2e"], args.pg)
            if "dormant" in parts:
                figures["dormant"] = timed("dormant", dormant.measure, backend,
                                           here / "dormant", sizes["dormant"], args.pg)
            report["backends"][backend.name] = figures
        if "model" in parts:
            report["model"] = measure_model(run_dir / "model", sizes["model"],
                                            not args.no_peers)
        if "quota" in parts:
            report["quota"] = measure_quota(run_dir / "quota", sizes["quota"])
        if "ui" in parts:
            t0 = time.monotonic()
            report["ui"] = ui.measure(run_dir / "ui", sizes["ui"])
            progress(f"sqlite ui: {time.monotonic() - t0:.1f} s")
        if not args.no_peers:
            report["peers"] = peers.measure(parts, sizes, backends, run_dir / "peers", args.pg)
        report["loadavg_at_end"] = loadavg()
        report["seconds"] = round(time.monotonic() - began, 1)
    if args.markdown:
        from bench.render import render

        sys.stdout.write(render(report))
    else:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
