"""End to end: what users get through a ``perdure worker`` process with default settings.

For each backend, on a fresh database, this part starts one ``perdure worker`` process
(``--app bench.agents:app``, a store and a key folder, and nothing else: no
``--concurrency``, ``--poll`` or ``--lease``, so the worker runs as it does out of the
box) and then, from separate client processes (``python -m bench.e2e_client``, which
open ``perdure.App(store=..., key_dir=...)``, start objects and wait on
``Handle.result()``), runs these workloads, whose steps are plain ``def`` functions:

* ``idle_cpu``: before any object exists, ``settle_s`` seconds after the worker said
  it serves, the worker's CPU time (``utime + stime`` of ``/proc/<pid>/stat``, every
  thread) over ``idle_s`` seconds, as a percentage of one core;
* ``sequential``: one object of ``seq_steps`` steps; µs per step from the first recorded
  step time to the last (worker start-up and the claim are not counted), ÷ the floor's
  µs per commit;
* ``sequential_def_agent``: the same, with the agent itself a plain ``def``;
* ``concurrent``: ``objects`` objects of ``steps_per_object`` steps, all started at once
  by the client; steps per second from the first recorded step to the last, ÷ the
  floor's commits per second;
* ``start_result``: ``start_result`` one-step objects one after another, each started and
  its result awaited before the next: milliseconds from the ``start`` call to
  ``result()`` returning, p50 / p90 / p99 / max;
* ``queued_start_result``: the same on a queue (concurrency 4) that the client declares
  (enqueue → start → result), run last: from then on the store has a queue, which every
  claim then looks at;
* ``loop_lag``: the worst event-loop lag the worker logged at shutdown (a line
  ``worst event-loop lag N ms`` from the ``perdure.worker`` logger), else "n/a".

``floor`` is the backend's single ``INSERT`` + ``COMMIT`` (``bench/common.py``), measured
in the same run. ``GOALS`` are the aims these figures are held against.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Backend,
    floor,
    fresh_database,
    percentile,
    start_workers,
    stop_workers,
)

QUICK: dict[str, Any] = {
    "floor_commits": 50, "seq_steps": 100, "objects": 10, "steps_per_object": 10,
    "start_result": 20, "idle_s": 2.0, "settle_s": 1.0,
}
FULL: dict[str, Any] = {
    "floor_commits": 1000, "seq_steps": 2000, "objects": 50, "steps_per_object": 100,
    "start_result": 200, "idle_s": 10.0, "settle_s": 2.0,
}
GOALS: dict[str, float] = {
    "sequential_ratio_max": 1.5,  # µs per step ÷ floor µs per commit
    "concurrent_ratio_min": 3.0,  # steps per second ÷ floor commits per second
    "start_result_p50_ms_max": 10.0,
    "start_result_p99_ms_max": 50.0,
    "idle_cpu_percent_max": 1.0,
}
LAG_LINE = re.compile(r"worst event-loop lag ([0-9.]+) ms")
CLIENT_TIMEOUT = 900.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, every thread (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pid: int, seconds: float) -> dict[str, Any]:
    """The share of one core process ``pid`` used over ``seconds`` of wall time."""
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, wall1 = cpu_seconds(pid), time.monotonic()
    return {"seconds": wall1 - wall0, "cpu_seconds": cpu1 - cpu0,
            "percent_of_core": (cpu1 - cpu0) / (wall1 - wall0) * 100,
            "clock_ticks_per_s": os.sysconf("SC_CLK_TCK")}


def worst_lag(log: Path) -> dict[str, Any]:
    """The worst event-loop lag the worker logged (the last such line), or n/a."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = LAG_LINE.findall(text)
    if not found:
        return {"na": "the worker logged no 'worst event-loop lag' line"}
    return {"ms": float(found[-1])}


def _wait_until_serving(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Wait for the worker's first line (``node ... serving ...``), said as it starts."""
    deadline = time.monotonic() + timeout
    while "serving" not in (log.read_text(errors="replace") if log.exists() else ""):
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode} (see {log})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not start within {timeout:g} s (see {log})")
        time.sleep(0.01)


def client(scenario: str, url: str, key_dir: Path, *args: str) -> dict[str, Any]:
    """Run ``python -m bench.e2e_client SCENARIO`` in a process of its own; its JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.e2e_client", scenario, "--store", url,
         "--key-dir", str(key_dir), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT,
        check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"client {scenario} failed: {proc.stderr.strip()[-2000:]}")
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def latency_figures(values: list[float]) -> dict[str, Any]:
    """p50, p90, p99, max and mean of millisecond values."""
    return {"ms_p50": statistics.median(values), "ms_p90": percentile(values, 0.90),
            "ms_p99": percentile(values, 0.99), "ms_max": max(values),
            "ms_mean": statistics.fmean(values)}


def measure(backend: Backend, folder: Path, sizes: dict[str, Any], admin_url: str
            ) -> dict[str, Any]:
    """Every end-to-end figure for ``backend`` (see the module's docstring)."""
    with fresh_database(backend, folder / "floor", admin_url) as db:
        fl = floor(db, sizes["floor_commits"])
    out: dict[str, Any] = {"floor": fl, "goals": GOALS, "worker_options": "defaults"}
    work = folder / "worker"
    with fresh_database(backend, work, admin_url) as db:
        key_dir, logs = work / "keys", work / "logs"
        procs = start_workers(db.url, key_dir, 1, concurrency=None, poll=None, lease=None,
                              log_dir=logs)
        log = logs / "worker0.log"
        try:
            _wait_until_serving(procs[0], log)
            time.sleep(float(sizes["settle_s"]))  # past opening the store and its schema
            out["idle_cpu"] = idle_cpu(procs[0].pid, float(sizes["idle_s"]))
            for name, agent in (("sequential", "sync_steps"),
                                ("sequential_def_agent", "sync_steps_def")):
                got = client("sequential", db.url, key_dir, "--agent", agent,
                             "--steps", str(sizes["seq_steps"]))
                got["ratio_to_floor_commit"] = got["us_per_step"] / fl["us_per_commit"]
                got["ratio_to_floor_commit_median"] = (got["us_per_step_median"]
                                                       / fl["us_per_commit_median"])
                out[name] = got
            got = client("concurrent", db.url, key_dir, "--objects", str(sizes["objects"]),
                         "--steps", str(sizes["steps_per_object"]))
            got["ratio_to_single_commit_rate"] = got["steps_per_s"] / fl["commits_per_s"]
            out["concurrent"] = got
            got = client("start-result", db.url, key_dir, "--pairs", str(sizes["start_result"]))
            got.update(latency_figures(got.pop("ms_values")))
            got["floor_ms"] = fl["us_per_commit"] / 1e3
            out["start_result"] = got
            got = client("start-result", db.url, key_dir, "--pairs", str(sizes["start_result"]),
                         "--queue", "bench-queue")
            got.update(latency_figures(got.pop("ms_values")))
            out["queued_start_result"] = got
        finally:
            stop_workers(procs, logs)
        out["loop_lag"] = worst_lag(log)
    return out


# -- the Markdown table ----------------------------------------------------------------------


def _peer_for(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    """DBOS's end-to-end figures beside a backend: DBOS on SQLite beside SQLite FULL, on
    PostgreSQL beside PostgreSQL (``None``: no such figures in the report)."""
    peer = {"sqlite_full": "dbos_sqlite", "postgresql": "dbos_postgresql"}.get(name)
    got: dict[str, Any] | None = report.get("peers", {}).get(peer or "", {}).get("e2e")
    return got


def _rows(name: str, b: dict[str, Any], dbos: dict[str, Any] | None) -> list[list[str]]:
    from bench.render import _num, _ratio

    f, fl, g = b["e2e"], b["e2e"]["floor"], b["e2e"]["goals"]
    store = b["store"]
    dash, times = "–", "×"  # noqa: RUF001
    na = f"n/a: {dbos['na']}" if dbos is not None and "na" in dbos else None

    def peer(cell: Any) -> str:
        if dbos is None:
            return dash
        return na if na is not None else str(cell(dbos))

    seq, conc, lat = f["sequential"], f["concurrent"], f["start_result"]
    shape = f"{conc['objects']} × {conc['steps_per_object']}"  # noqa: RUF001
    rows = [
        [f"sequential sync step, one object, {seq['steps']:,} steps: µs per step", store,
         _num(fl["us_per_commit"], " µs"),
         f"{_num(seq['us_per_step'], ' µs')} (**{_ratio(seq['ratio_to_floor_commit'])}**)",
         f"≤ {g['sequential_ratio_max']:g}{times}",
         peer(lambda d: f"{_num(d['sequential']['us_per_step'], ' µs')} "
                        f"({_ratio(d['sequential']['us_per_step'] / fl['us_per_commit'])})")],
    ]
    if "sequential_def_agent" in f:
        sd = f["sequential_def_agent"]
        rows.append(["the same, the agent a plain `def` too: µs per step", store,
                     _num(fl["us_per_commit"], " µs"),
                     f"{_num(sd['us_per_step'], ' µs')} "
                     f"(**{_ratio(sd['ratio_to_floor_commit'])}**)",
                     f"≤ {g['sequential_ratio_max']:g}{times}", dash])
    rows += [
        [f"{shape} sync steps started by the client: steps per second", store,
         _num(fl["commits_per_s"], " commits/s"),
         f"{_num(conc['steps_per_s'], ' /s')} "
         f"(**{_ratio(conc['ratio_to_single_commit_rate'])}**)",
         f"≥ {g['concurrent_ratio_min']:g}{times}",
         peer(lambda d: f"{_num(d['concurrent']['steps_per_s'], ' /s')} "
                        f"({_ratio(d['concurrent']['steps_per_s'] / fl['commits_per_s'])})")],
        [f"start → result of a one-step object, {lat['pairs']:,} in turn: p50 / p99", store,
         _num(lat["floor_ms"], " ms"),
         f"**{_num(lat['ms_p50'], ' ms')}** / **{_num(lat['ms_p99'], ' ms')}**",
         f"≤ {g['start_result_p50_ms_max']:g} ms / ≤ {g['start_result_p99_ms_max']:g} ms",
         peer(lambda d: f"{_num(d['start_result']['ms_p50'], ' ms')} / "
                        f"{_num(d['start_result']['ms_p99'], ' ms')}")],
        ["start → result, medians: `start` call / start → step ran / step ran → result seen",
         store, dash,
         f"{_num(lat['start_call_ms_median'], ' ms')} / "
         f"{_num(lat['start_to_step_ms_median'], ' ms')} / "
         f"{_num(lat['step_to_result_ms_median'], ' ms')}", dash,
         peer(lambda d: f"{_num(d['start_result']['start_call_ms_median'], ' ms')} / "
                        f"{_num(d['start_result']['start_to_step_ms_median'], ' ms')} / {dash}")],
    ]
    if "queued_start_result" in f:
        q = f["queued_start_result"]
        rows.append([f"the same on a queue (enqueue → start → result), {q['pairs']:,} in turn: "
                     "p50 / p99", store, _num(lat["floor_ms"], " ms"),
                     f"**{_num(q['ms_p50'], ' ms')}** / **{_num(q['ms_p99'], ' ms')}**",
                     f"≤ {g['start_result_p50_ms_max']:g} ms / ≤ "
                     f"{g['start_result_p99_ms_max']:g} ms", dash])
    rows += [
        [f"idle worker CPU, empty store, {f['idle_cpu']['seconds']:.0f} s: % of a core", store,
         "0", f"**{f['idle_cpu']['percent_of_core']:.2f}%**",
         f"< {g['idle_cpu_percent_max']:g}%",
         peer(lambda d: f"{d['idle_cpu']['percent_of_core']:.2f}%" if "idle_cpu" in d
              else dash)],
        ["worst event-loop lag of the worker over the part", store, dash,
         _num(f["loop_lag"]["ms"], " ms") if "ms" in f["loop_lag"] else "n/a", dash, dash],
    ]
    return rows


def table(report: dict[str, Any]) -> str:
    """The ``e2e`` figures as a Markdown table (``""`` when the part did not run)."""
    from bench.render import _table

    rows: list[list[str]] = []
    for name, b in report.get("backends", {}).items():
        if "e2e" in b:
            rows += _rows(name, b, _peer_for(report, name))
    if not rows:
        return ""
    return _table(["figure", "store", "floor", "perdure (÷ floor)", "goal",
                   "DBOS, one process (÷ floor)"], rows)
