"""Agents for the watch-and-steer tests (prompts, queries, emitted events, forks, step
timeouts, retry), and the app a worker subprocess loads:
``perdure --app tests.integration.steer_support:app worker``.

Side effects of steps are counted in files (``engine_support.mark``), so a count
survives the process that ran the step being killed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from tests.integration.engine_support import REPO_ROOT, count_lines, mark

__all__ = ["app", "register", "start_steer_worker"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)

FAST = perdure.RetryPolicy(max_attempts=3, base=0.05, cap=0.2)


# -- prompts --------------------------------------------------------------------------


async def asker(run: perdure.Run, text: str) -> Any:
    """Ask a question with choices, then a second one without; return both answers."""
    first = await run.wait_for("approval", prompt={"text": text, "risk": "low"},
                               choices=["yes", "no"])
    second = await run.wait_for("comment", prompt="Anything to add?")
    return [first, second]


def sync_asker(run: perdure.SyncRun) -> Any:
    """A plain ``def`` agent asking one question."""
    return run.wait_for("go", prompt="Go on?", choices=[True, False])


async def twice_asker(run: perdure.Run) -> Any:
    """Two questions in a row answered by the same event."""
    return [await run.wait_for("answer", prompt="first?"),
            await run.wait_for("answer", prompt="second?")]


async def gather_asker(run: perdure.Run) -> Any:
    """Two branches waiting at once, each with its question."""
    async def ask(event: str) -> Any:
        return await run.wait_for(event, prompt=f"value for {event}?")

    return await run.gather(ask("left"), ask("right"))


# -- emitted events and queries -----------------------------------------------------------


def add(total: int, value: int) -> int:
    """A step: add ``value``."""
    return total + value


def pause_once(marks: str, seconds: float) -> str:
    """Mark that it ran; the first run blocks ``seconds`` (time to kill its worker)."""
    first = count_lines(marks) == 0
    mark(marks, "ran")
    if first:
        time.sleep(seconds)
    return "paused"


async def emitter(run: perdure.Run, marks: str, seconds: float) -> Any:
    """Emit around steps, with a step that blocks on its first run."""
    await run.emit("started", {"of": 3})
    total = await run.step(add, 0, 1)
    await run.emit("progress", {"done": 1, "total": total})
    await run.step(pause_once, marks, seconds)
    await run.emit("progress", {"done": 2})
    total = await run.step(add, total, 2)
    await run.emit("progress", {"done": 3, "total": total})
    return total


async def counter(run: perdure.Run, values: list[int]) -> Any:
    """Add up ``values`` step by step, emitting the running total, then wait for more."""
    total = 0
    for value in values:
        total = await run.step(add, total, value)
        await run.emit("total", total)
    more = await run.wait_for("more", prompt="more values?")
    for value in more or []:
        total = await run.step(add, total, value)
    return total


def total_of(view: perdure.MemoryView) -> int:
    """Query: the last running total."""
    return int(view.last_emitted("total", 0))


def steps_over(view: perdure.MemoryView, floor: int) -> list[int]:
    """Query with an argument: the step results above ``floor``."""
    return [r for r in view.steps("add") if r > floor]


def broken(view: perdure.MemoryView) -> Any:
    """Query that raises."""
    raise KeyError("no such thing")


# -- forks ----------------------------------------------------------------------------------


def note(marks: str, name: str) -> str:
    """A step that marks its run in ``marks`` and returns ``name``."""
    mark(marks, name)
    return name


async def pipeline(run: perdure.Run, marks: str) -> Any:
    """Three steps; a fork replays the recorded ones and runs the rest."""
    done = [await run.step(note, marks, "a", name="a"),
            await run.step(note, marks, "b", name="b")]
    done.append(await run.step(note, marks, "c", name="c"))
    return done


async def careful(run: perdure.Run, marks: str) -> Any:
    """A non-idempotent step between two others."""
    first = await run.step(note, marks, "a", name="a")
    second = await run.step(note, marks, "pay", name="pay", idempotent=False)
    return [first, second]


async def brancher(run: perdure.Run, marks: str) -> Any:
    """A gather of two steps, then one more."""
    pair = await run.gather(run.step(note, marks, "l", name="l"),
                            run.step(note, marks, "r", name="r"))
    last = await run.step(note, marks, "z", name="z")
    return [*pair, last]


# -- step timeouts --------------------------------------------------------------------------


async def slow_async(marks: str, seconds: float) -> str:
    """Sleeps ``seconds`` on its first attempt, returns at once after. Marks ``cancelled``
    when the attempt is cancelled, ``late`` when its sleep ran to the end."""
    first = count_lines(marks) == 0
    mark(marks, "attempt")
    if first:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            mark(marks, "cancelled")
            raise
        mark(marks, "late")  # never reached when the attempt is cancelled
    return "ok"


def slow_sync(marks: str, seconds: float) -> str:
    """The same in a plain ``def`` (its thread runs on after the timeout)."""
    first = count_lines(marks) == 0
    mark(marks, "attempt")
    if first:
        time.sleep(seconds)
        mark(marks, "late")
    return "ok"


def always_slow(seconds: float) -> str:
    """Never fast enough."""
    time.sleep(seconds)
    return "late"


async def timed(run: perdure.Run, marks: str, kind: str, seconds: float,
                timeout: float) -> Any:
    """A step with a timeout, retried fast."""
    fn = slow_async if kind == "async" else slow_sync
    return await run.step(fn, marks, seconds, timeout=timeout, retry=FAST)


async def hopeless(run: perdure.Run, timeout: float) -> Any:
    """A step that always times out, two attempts."""
    return await run.step(always_slow, timeout * 4, timeout=timeout,
                          retry=perdure.RetryPolicy(max_attempts=2, base=0.05, cap=0.1))


def register(target: perdure.App) -> perdure.App:
    """Register every agent and query of this module with ``target``."""
    for fn in (asker, sync_asker, gather_asker, twice_asker, emitter, counter, pipeline, careful,
               brancher, timed, hopeless):
        target.agent(name=fn.__name__)(fn)
    target.define_query(agent="counter", name="total")(total_of)
    target.define_query(agent="counter")(steps_over)
    target.define_query(agent="counter")(broken)
    return target


register(app)


def start_steer_worker(store_url: str, key_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` above in a child process (2 s leases)."""
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.steer_support:app", "worker", "--lease", "2",
             "--poll", "0.01", "--concurrency", "4"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
