"""Helpers shared by the engine integration tests, and agents for worker subprocesses.

``app`` below is what ``perdure --app tests.integration.engine_support:app worker``
loads; the CLI rebinds it to the test's store and key directory. Side effects of
steps are counted in files (one line per execution), so a count survives the
process that ran the step being killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import perdure
from perdure.hooks import ClaimRound

__all__ = [
    "REPO_ROOT",
    "ClaimRounds",
    "app",
    "count_lines",
    "kill_process",
    "kinds",
    "mark",
    "start_worker_process",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0,
               interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class ClaimRounds:
    """The claim rounds of an App's workers, heard through ``app.hooks``: the positive
    signal that a worker has had its chance to take an object, so a test can assert that
    it let the object be instead of sleeping and hoping it looked.

        with ClaimRounds(app) as rounds, app.background_worker():
            app.pause("x")
            claimed = rounds.look("the worker to look past the paused x")
            assert "x" not in claimed
    """

    def __init__(self, app_: perdure.App) -> None:
        self._app = app_
        self._changed = threading.Condition()
        self.rounds: list[ClaimRound] = []
        self._stop = app_.hooks.subscribe(self._heard, ClaimRound)

    def _heard(self, event: ClaimRound) -> None:
        with self._changed:
            self.rounds.append(event)
            self._changed.notify_all()

    def look(self, what: str, *, answered: bool = True, timeout: float = 30.0) -> list[str]:
        """Wait until two more claim rounds than now have ended (so at least one began
        after this call and saw everything written before it); with ``answered`` only
        rounds the store answered count. Returns the ids claimed in rounds since this
        call. Fails saying ``what`` it waited for if that takes ``timeout`` seconds."""
        with self._changed:
            start = len(self.rounds)

        def seen() -> list[ClaimRound]:
            return [r for r in self.rounds[start:] if not answered or not r.failed]

        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                if len(seen()) >= 2:
                    return [oid for r in self.rounds[start:] for oid in r.claimed]
                left = deadline - time.monotonic()
                assert left > 0, (f"waited {timeout:g}s for {what}: the worker ended "
                                  f"{len(seen())} claim round(s) since, not 2")
                self._changed.wait(min(left, 0.25))
            self._nudge()

    def _nudge(self) -> None:
        """An idle worker sleeps until pushed (up to ``idle_seconds``): push it, so the
        rounds come sooner. Only the wait's length depends on this."""
        from tests.integration.push_support import nudge

        nudge(self._app.store.url)

    def __enter__(self) -> ClaimRounds:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()


def kinds(app_: perdure.App, object_id: str) -> list[str]:
    """The kinds of an object's memory records, in order."""
    return [str(rec.kind) for rec in app_.history(object_id)]


def mark(path: str, text: str = "x") -> None:
    """Append one line to ``path``: a side effect that outlives the process making it."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def count_lines(path: str | Path) -> int:
    """How many lines ``mark`` wrote to ``path`` (0 if none)."""
    try:
        return len(Path(path).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


def start_worker_process(store_url: str, key_dir: Path, log: Path,
                         lease: float = 2.0) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` below in a child process (``lease`` seconds
    leases), log to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.engine_support:app", "worker", "--lease", f"{lease:g}",
             "--poll", "0.01", "--concurrency", "4"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )


def kill_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` (no chance to clean up) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


# -- agents run by worker subprocesses ------------------------------------------------


def slow_side_effect(marks: str, seconds: float) -> str:
    """Mark that the body ran; the first run takes ``seconds`` (time to kill its process)."""
    first = count_lines(marks) == 0
    mark(marks, "ran")
    if first:
        time.sleep(seconds)
    return "done"


def quick_side_effect(marks: str) -> str:
    """Mark that the body ran and return at once."""
    mark(marks, "ran")
    return "quick"


@app.agent(name="charge_once")
async def charge_once(run: perdure.Run, marks: str, seconds: float) -> dict[str, Any]:
    """A non-idempotent step; if it is in doubt after a crash, report the key instead."""
    try:
        outcome = await run.step(slow_side_effect, marks, seconds, idempotent=False,
                                 name="charge")
    except perdure.StepInDoubtError as exc:
        return {"in_doubt": exc.idempotency_key, "step": exc.step}
    return {"outcome": outcome}


@app.agent(name="two_steps")
async def two_steps(run: perdure.Run, first_marks: str, second_marks: str,
                    seconds: float) -> list[str]:
    """A quick idempotent step, then a slow idempotent one (killed mid-way in tests)."""
    first = await run.step(quick_side_effect, first_marks, name="first")
    second = await run.step(slow_side_effect, second_marks, seconds, name="second")
    return [first, second]


@app.agent(name="careful_charge")
async def careful_charge(run: perdure.Run, marks: str, doubts: str) -> str:
    """After an in-doubt charge, wait for a person's decision (noting each doubt seen)."""
    try:
        await run.step(slow_side_effect, marks, 30.0, idempotent=False, name="charge")
    except perdure.StepInDoubtError as exc:
        mark(doubts, exc.idempotency_key)
        decision = await run.wait_for("decision")
        return f"person said {decision}"
    return "charged"


@app.agent(name="wait_then_act")
async def wait_then_act(run: perdure.Run, marks: str, seconds: float) -> dict[str, Any]:
    """Wait for ``go``, then run a slow idempotent step (killed mid-way in tests)."""
    payload = await run.wait_for("go")
    outcome = await run.step(slow_side_effect, marks, seconds, name="act")
    return {"payload": payload, "outcome": outcome}


@app.agent(name="blind_charge")
async def blind_charge(run: perdure.Run, marks: str) -> str:
    """A non-idempotent step whose doubt the agent does not handle."""
    return await run.step(slow_side_effect, marks, 30.0, idempotent=False, name="charge")
