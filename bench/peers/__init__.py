"""Peers: DBOS and LangGraph on the same workloads, each scenario in its own process.

Installed with ``pip install 'perdure[bench]'``; without them every peer figure is
``{"na": "<package> not installed (pip install 'perdure[bench]')"}``. Each scenario runs
``python -m bench.peers.dbos_bench`` or ``bench.peers.langgraph_bench`` in a fresh
process on a fresh SQLite file or PostgreSQL database (the same server and folder as
perdure's), and reads the JSON it prints. A workload a peer cannot do is
``{"na": reason}``.

LangGraph runs in three ways (``targets``): its functional API with ``SqliteSaver``,
a ``StateGraph`` with ``SqliteSaver``, and, when PostgreSQL is among the backends, its
functional API with ``PostgresSaver``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import recovery, storage
from bench.common import REPO, Backend, _version, fresh_database, progress

INSTALL = "pip install 'perdure[bench]'"
LANGGRAPH_NO_WAKE = (
    "LangGraph has no worker and no event delivery to a waiting run: an interrupted run "
    "stays in its checkpoint until the caller invokes it again with Command(resume=...)"
)

# What a target needs importable, and the packages to name when it is not.
NEEDS: dict[str, tuple[str, list[str]]] = {
    "dbos": ("dbos", ["dbos"]),
    "langgraph": ("langgraph with langgraph-checkpoint-sqlite",
                  ["langgraph", "langgraph.checkpoint.sqlite"]),
    "langgraph-postgres": ("langgraph with langgraph-checkpoint-postgres",
                           ["langgraph", "langgraph.checkpoint.postgres", "psycopg"]),
}


def installed(needs: str) -> bool:
    """Whether the modules of ``NEEDS[needs]`` can be imported.

    ``dbos``; ``langgraph`` with its SQLite checkpointer; ``langgraph-postgres``, with
    its PostgreSQL one.
    """
    try:
        return all(importlib.util.find_spec(m) is not None for m in NEEDS[needs][1])
    except ModuleNotFoundError:
        return False


def versions() -> dict[str, str | None]:
    """Versions of the peer packages (None when not installed)."""
    return {p: _version(p) for p in ("dbos", "langgraph", "langgraph-checkpoint",
                                      "langgraph-checkpoint-sqlite",
                                      "langgraph-checkpoint-postgres", "sqlalchemy")}


def _env(crash_at: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("PERDURE_BENCH_CRASH_AT", None)
    if crash_at is not None:
        env["PERDURE_BENCH_CRASH_AT"] = str(crash_at)
    return env


def _module(peer: str) -> str:
    return f"bench.peers.{peer}_bench"


def _run(peer: str, args: list[str], timeout: float = 900) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", _module(peer), *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer} {args[0]} failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _popen(peer: str, args: list[str], log: Path, crash_at: int | None = None
           ) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", _module(peer), *args], cwd=REPO,
                                env=_env(crash_at), stdout=out, stderr=subprocess.STDOUT)


class _Target:
    """One peer on one store: how to point it at a fresh database.

    ``api`` is LangGraph's way of writing the flow (``functional`` or ``graph``, see
    ``bench/peers/langgraph_bench.py``); ``needs`` the key of ``NEEDS`` it requires.
    """

    def __init__(self, name: str, peer: str, backend: Backend, label: str,
                 api: str | None = None) -> None:
        self.name, self.peer, self.backend, self.label, self.api = name, peer, backend, label, api
        self.needs = (f"{peer}-postgres" if peer == "langgraph" and backend.kind == "postgresql"
                      else peer)

    def store_args(self, db: Any) -> list[str]:
        """The arguments pointing the scenario at ``db`` (and at LangGraph's API)."""
        if self.peer == "langgraph":
            store = (["--db", str(db.sqlite_path)] if db.sqlite_path is not None
                     else ["--url", db.pg_url])
            return [*store, "--api", self.api or "functional"]
        if db.sqlite_path is not None:
            return ["--url", f"sqlite:///{db.sqlite_path}"]
        return ["--url", db.pg_url]

    def bytes(self, db: Any) -> int:
        if db.sqlite_path is not None:
            return storage.sqlite_bytes(db.sqlite_path)
        return storage.pg_bytes(db.pg_url, ("dbos",))


def targets(backends: list[Backend]) -> list[_Target]:
    """The peer/store pairs to run: SQLite always, PostgreSQL when it is among ``backends``."""
    lite = Backend("peer_sqlite", "sqlite", None, "SQLite")
    out = [_Target("dbos_sqlite", "dbos", lite, "DBOS, SQLite"),
           _Target("langgraph_sqlite", "langgraph", lite, "LangGraph, SqliteSaver",
                   "functional"),
           _Target("langgraph_stategraph_sqlite", "langgraph", lite,
                   "LangGraph StateGraph, SqliteSaver", "graph")]
    pg = [b for b in backends if b.kind == "postgresql"]
    if pg:
        out.insert(1, _Target("dbos_postgresql", "dbos", pg[0], "DBOS, PostgreSQL"))
        out.append(_Target("langgraph_postgresql", "langgraph", pg[0],
                           "LangGraph, PostgresSaver", "functional"))
    return out


def _guard(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = fn(*args)
        return result
    except Exception as exc:
        return {"na": f"failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"}


# -- workloads -----------------------------------------------------------------------


def _steps(t: _Target, folder: Path, sizes: dict[str, Any], admin: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with fresh_database(t.backend, folder / "sequential", admin) as db:
        out["sequential"] = _run(t.peer, ["sequential", *t.store_args(db),
                                          "--steps", str(sizes["seq_steps"])])
    with fresh_database(t.backend, folder / "concurrent", admin) as db:
        out["concurrent"] = _run(t.peer, ["concurrent", *t.store_args(db),
                                          "--objects", str(sizes["objects"]),
                                          "--steps", str(sizes["steps_per_object"])])
    return out


def _recovery(t: _Target, folder: Path, sizes: dict[str, Any], admin: str) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    effects = folder / "effects.log"
    steps, crash_at = int(sizes["steps"]), int(sizes["crash_at"])
    with fresh_database(t.backend, folder, admin) as db:
        common = ["recovery-child", *t.store_args(db), "--steps", str(steps),
                  "--effects", str(effects), "--pace", str(sizes["pace_s"])]
        first = _popen(t.peer, [*common, "--first"], folder / "child.log", crash_at)
        first.wait(timeout=300)
        if first.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the first process ended with {first.returncode}, not SIGKILL")
        began = time.time()
        second = _popen(t.peer, common, folder / "child.log")
        second.wait(timeout=300)
        if second.returncode != 0:
            raise RuntimeError(f"the resuming process failed (see {folder / 'child.log'})")
        figures = recovery.analyse(effects, first.pid, second.pid, began, steps)
    figures["pace_s"], figures["crash_at"] = sizes["pace_s"], crash_at
    return figures


def _wake(t: _Target, folder: Path, sizes: dict[str, Any], admin: str) -> dict[str, Any]:
    if t.peer == "langgraph":
        return {"na": LANGGRAPH_NO_WAKE}
    from bench.common import percentile

    polls = [0.0, 0.01] if t.backend.kind == "sqlite" else [0.0]
    out: dict[str, Any] = {}
    for poll in polls:
        name = "default" if poll == 0 else f"poll_{poll:g}s"
        with fresh_database(t.backend, folder / name, admin) as db:
            got = _run(t.peer, ["wake", *t.store_args(db), "--objects", str(sizes["objects"]),
                                "--wakes", str(sizes["wakes_per_object"]),
                                "--folder", str(folder / name / "run"), "--poll", str(poll),
                                "--budget", str(sizes.get("peer_budget_s", 0))])
        values = got.pop("ms_values")
        got.update({"ms_p90": percentile(values, 0.9), "ms_p99": percentile(values, 0.99),
                    "ms_max": max(values), "poll_s": poll or None})
        out[name] = got
    return out


def _dbos_history(t: _Target, folder: Path, n: int, admin: str, limit: float = 900
                  ) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "marker"
    with fresh_database(t.backend, folder, admin) as db:
        build = _popen(t.peer, ["history-build", *t.store_args(db), "--steps", str(n),
                                "--marker", str(marker)], folder / "child.log")
        began = time.monotonic()
        try:
            recovery.run_until(build, marker.exists, limit, "the DBOS history to be written")
            time.sleep(0.2)  # let the workflow reach recv
        finally:
            build.kill()
            build.wait()
        size = t.bytes(db)
        got = _run(t.peer, ["history-resume", *t.store_args(db), "--steps", str(n)],
                   timeout=max(1.0, limit - (time.monotonic() - began)))
    got["store_bytes"] = size
    return got


# A peer's history length is "n/a" when, from the growth measured at the shorter
# lengths, building and resuming it would take longer than this, or when it does not
# finish within it (the process is killed).
HISTORY_LIMIT_S = 180.0


def _predict(took: dict[int, float], n: int) -> tuple[float, str]:
    """Seconds that length ``n`` would take, from the lengths measured so far.

    The shortest length's time stands for the fixed cost (process start, database
    set-up); the rest grows with history. It is extrapolated from the longest length
    linearly, or with the exponent fitted on the last two lengths when three or more
    were measured (never below 1).
    """
    import math

    counts = sorted(took)
    fixed, last = took[counts[0]], counts[-1]
    exponent = 1.0
    if len(counts) > 2:
        a = counts[-2]
        va, vb = took[a] - fixed, took[last] - fixed
        if va > 0 and vb > va:
            exponent = max(1.0, math.log(vb / va) / math.log(last / a))
    guess = fixed + max(0.0, took[last] - fixed) * (n / last) ** exponent
    growth = ", ".join(f"{c:,} steps {took[c]:.1f} s" for c in counts)
    return guess, f"{growth}; growth beyond the fixed cost ~ N^{exponent:.2f}"


def _history(t: _Target, folder: Path, sizes: dict[str, Any], admin: str) -> dict[str, Any]:
    resume: dict[str, Any] = {}
    took: dict[int, float] = {}
    limit = float(sizes.get("peer_limit_s", HISTORY_LIMIT_S))
    for n in sizes["lengths"]:
        sub = folder / f"steps{n}"
        growth = ""
        if len(took) > 1:
            guess, growth = _predict(took, n)
            if guess > limit:
                resume[str(n)] = {"na": f"{n:,} steps would take about {guess:,.0f} s to build"
                                        f" and resume (measured: {growth})"}
                continue
        began = time.monotonic()
        try:
            if t.peer == "dbos":
                got = _dbos_history(t, sub, n, admin, limit)
            else:
                with fresh_database(t.backend, sub, admin) as db:
                    got = _run(t.peer, ["history", *t.store_args(db), "--steps", str(n)],
                               timeout=limit)
        except (subprocess.TimeoutExpired, TimeoutError):
            spent = time.monotonic() - began
            resume[str(n)] = {"na": f"{n:,} steps did not build and resume within {spent:.0f} s"
                                    + (f" (measured: {growth})" if growth else "")}
            continue
        took[n] = time.monotonic() - began
        got["seconds"] = took[n]
        resume[str(n)] = got
    sizes_by_n = {int(n): r["store_bytes"] for n, r in resume.items() if "na" not in r}
    return {"resume": resume,
            "storage": {"store_bytes": {str(n): b for n, b in sizes_by_n.items()},
                        "per_step": storage.per_step(sizes_by_n)}}


LANGGRAPH_NO_E2E = (
    "LangGraph has no worker process and no client that starts a run elsewhere: a run "
    "goes on in the process that invokes it (its in-process figures are under steps)"
)


def _e2e(t: _Target, folder: Path, sizes: dict[str, Any], admin: str) -> dict[str, Any]:
    """The end-to-end workloads (``bench/e2e.py``) as DBOS runs them: the workflows in
    one process of their own that starts them and waits for their results."""
    if t.peer == "langgraph":
        return {"na": LANGGRAPH_NO_E2E}
    from bench.e2e import latency_figures

    out = _steps(t, folder, sizes, admin)  # sequential and 50 at once, at e2e's sizes
    with fresh_database(t.backend, folder / "start_result", admin) as db:
        got = _run(t.peer, ["start-result", *t.store_args(db),
                            "--objects", str(sizes["start_result"])])
    got.update(latency_figures(got.pop("ms_values")))
    out["start_result"] = got
    with fresh_database(t.backend, folder / "idle", admin) as db:
        out["idle_cpu"] = _run(t.peer, ["idle", *t.store_args(db),
                                        "--pace", str(sizes["idle_s"])])
    return out


WORKLOADS = {"steps": _steps, "recovery": _recovery, "wake": _wake, "history": _history,
             "e2e": _e2e}


def measure(parts: list[str], sizes: dict[str, Any], backends: list[Backend], folder: Path,
            admin_url: str) -> dict[str, Any]:
    """Every peer figure for the chosen parts: ``{target: {part: figures or {"na": ...}}}``."""
    out: dict[str, Any] = {}
    for t in targets(backends):
        figures: dict[str, Any] = {"label": t.label, "peer": t.peer, "store": t.backend.kind}
        if t.api is not None:
            figures["api"] = t.api
        for part in parts:
            if part not in WORKLOADS:
                continue
            if not installed(t.needs):
                figures[part] = {"na": f"{NEEDS[t.needs][0]} not installed ({INSTALL})"}
                continue
            began = time.monotonic()
            figures[part] = _guard(WORKLOADS[part], t, folder / t.name / part, sizes[part],
                                   admin_url)
            took = time.monotonic() - began
            figures.setdefault("seconds", {})[part] = round(took, 1)
            progress(f"{t.name} {part}: {took:.1f} s")
        out[t.name] = figures
    return out
