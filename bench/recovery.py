"""Crash recovery: a 200-step object SIGKILLed at step 100, resumed by a fresh process.

Every step (5 ms of ``time.sleep``) writes ``start I PID TIME`` to an effects file
when its body begins and ``end I PID TIME`` when it returns. In the first process the
body of step ``crash_at`` SIGKILLs its own process right after logging its start, so
that step is in flight when the process dies. Then a fresh process starts and carries
the object on. From the effects file:

* ``reexecuted_steps``: step bodies the second process began that had already begun
  in the first (the step in flight at the kill is one of them: its outcome was never
  recorded);
* ``reexecuted_finished_steps``: of those, steps that had *finished* in the first
  process (their result was lost or not trusted) — the figure that should be 0;
* ``ms_to_first_resumed_step``: from just before the fresh process is started to the
  first step body it runs;
* ``ms_to_completion``: from the same moment to the last step's end;
* ``ms_kill_to_first_resumed_step``: from the killed step's start (the kill) to the
  first step body the fresh process runs;
* ``ms_worker_up_to_first_resumed_step`` (perdure only): from the moment the fresh
  ``perdure worker`` is up (its ``node_up`` log line, written once the interpreter has
  started, the agents are imported and the store and keys are open, appears in its
  log) to the first step body it runs: the engine's part of recovery, without Python's
  start-up and imports.

The same harness (``analyse``) serves perdure and the peers (``bench/peers``). For
perdure the processes are ``perdure worker`` (``bench.agents:paced_steps``): the dead
node's lease must lapse before another node may claim the object, so the figures
include up to ``lease_s`` of waiting, reported beside them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from bench import agents
from bench.common import REPO, Database

QUICK = {"steps": 20, "crash_at": 10, "pace_s": 0.005, "lease_s": 1.0}
FULL = {"steps": 200, "crash_at": 100, "pace_s": 0.005, "lease_s": 2.0}


def read_effects(path: Path) -> list[tuple[str, int, int, float]]:
    """The ``(what, step, pid, time)`` lines of an effects file."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
    return out


def analyse(effects: Path, first_pid: int, second_pid: int, began: float, steps: int
            ) -> dict[str, Any]:
    """Recovery figures from the effects file (see the module docstring)."""
    lines = read_effects(effects)
    started_1 = {i for what, i, pid, _ in lines if what == "start" and pid == first_pid}
    finished_1 = {i for what, i, pid, _ in lines if what == "end" and pid == first_pid}
    second = [(what, i, t) for what, i, pid, t in lines if pid == second_pid]
    started_2 = [i for what, i, _ in second if what == "start"]
    ends_2 = {i: t for what, i, t in second if what == "end"}
    done = started_1 | set(started_2)
    if set(range(1, steps + 1)) - done or (steps not in ends_2 and steps not in finished_1):
        raise RuntimeError(f"recovery did not run every step ({effects})")
    first_resumed = min(t for what, _, t in second if what == "start")
    killed = max(t for what, _, pid, t in lines if what == "start" and pid == first_pid)
    return {
        "steps": steps,
        "steps_before_kill": len(finished_1),
        "reexecuted_steps": len([i for i in started_2 if i in started_1]),
        "reexecuted_finished_steps": len([i for i in started_2 if i in finished_1]),
        "ms_to_first_resumed_step": (first_resumed - began) * 1e3,
        "ms_to_completion": (ends_2[steps] - began) * 1e3,
        "ms_kill_to_first_resumed_step": (first_resumed - killed) * 1e3,
    }


def run_until(proc: subprocess.Popen[bytes], check: Any, timeout: float, what: str) -> None:
    """Wait for ``check()`` while ``proc`` runs (its death is fine once ``check`` holds)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.002)


def _worker(url: str, key_dir: Path, lease: float, log: Path, crash_at: int | None
            ) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("PERDURE_BENCH_GATE", None)
    env.pop("PERDURE_BENCH_CRASH_AT", None)
    if crash_at is not None:
        env["PERDURE_BENCH_CRASH_AT"] = str(crash_at)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "bench.agents:app", "--store", url,
             "--key-dir", str(key_dir), "worker", "--concurrency", "1",
             "--lease", str(lease), "--poll", "0.01"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def crash_recovery(db: Database, folder: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """The perdure figures: ``perdure worker`` processes on ``db``."""
    folder.mkdir(parents=True, exist_ok=True)
    steps, crash_at = int(sizes["steps"]), int(sizes["crash_at"])
    effects = folder / "effects.log"
    key_dir = folder / "keys"
    app = agents.register(perdure.App(store=db.url, key_dir=key_dir, node_id="bench-starter"))
    try:
        app.options(object_id="paced-1").start("paced_steps", steps, str(effects), sizes["pace_s"])
        first = _worker(db.url, key_dir, sizes["lease_s"], folder / "worker.log", crash_at)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
            raise RuntimeError("the first worker did not crash at the planned step") from None
        log = folder / "worker.log"
        offset = log.stat().st_size if log.exists() else 0
        began = time.time()
        second = _worker(db.url, key_dir, sizes["lease_s"], log, None)
        up: list[float] = []

        def completed() -> bool:
            if not up and b"claiming work" in log.read_bytes()[offset:]:
                up.append(time.time())
            return app.get("paced-1").status == "completed"

        try:
            run_until(second, completed, 120, "the resumed object to complete")
        finally:
            second.terminate()
            second.wait(timeout=30)
        if app.result_of("paced-1") != steps:
            raise RuntimeError("the resumed object returned a wrong result")
        figures = analyse(effects, first.pid, second.pid, began, steps)
        if up:
            figures["ms_worker_up_to_first_resumed_step"] = (
                figures["ms_to_first_resumed_step"] - (up[0] - began) * 1e3)
        figures["lease_s"] = sizes["lease_s"]
        figures["pace_s"] = sizes["pace_s"]
        figures["crash_at"] = crash_at
        figures["chain_verified"] = bool(app.verify("paced-1").ok)
    finally:
        app.close()
    return figures
