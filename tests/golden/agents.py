"""Representative agents whose recorded memory is kept as golden logs in this folder.

``record.py`` runs these agents on a temporary SQLite store and writes each
object's memory to ``<object id>.json``; ``tests/integration/test_golden.py``
replays every golden log against the code below. Together they cover every
command an agent can issue: steps (one retried after a failure), sleep,
wait_for, now/uuid/random, progress, refine, patched, delegate + join, gather of
steps and of children, and a plain ``def`` agent.

Changing a command an agent below issues at a recorded position makes the golden
test fail, as it would park a live object with that memory. Such a change needs a
new agent version (see ``README.md`` here); changing a step *body* does not.
"""

from __future__ import annotations

from typing import Any

import perdure

__all__ = ["app"]

# The store is never opened from here: record.py and the tests pass their own.
app = perdure.App(store="sqlite:///golden-never-opened.db")

FAST_RETRY = perdure.RetryPolicy(max_attempts=3, base=0.01, cap=0.05)


class NotReadyError(Exception):
    """A transient failure of the first attempt of ``flaky_fetch``."""

    error_class = perdure.ErrorClass.TRANSIENT


def fetch(source: str) -> dict[str, Any]:
    """A plain step: what it returns is recorded."""
    return {"source": source, "lines": [f"{source}-{i}" for i in range(3)]}


def flaky_fetch(source: str) -> str:
    """Fails on its first attempt and succeeds on the next (a recorded retry)."""
    if perdure.current_step().attempt == 1:
        raise NotReadyError(f"{source} not ready")
    return f"{source}: ok"


def count_lines(data: dict[str, Any]) -> int:
    """Count the lines fetched."""
    return len(data["lines"])


def square(n: int) -> int:
    """A small step used in gathers and children."""
    return n * n


def check_quota() -> bool:
    """The step added behind ``run.patched("quota-check")``."""
    return True


@app.agent(name="steps", version="1")
async def steps(run: perdure.Run, source: str) -> dict[str, Any]:
    """Steps (one retried), recorded values, progress, a short sleep and an event."""
    data = await run.step(fetch, source)
    retried = await run.step(flaky_fetch, source, retry=FAST_RETRY)
    started = await run.now()
    token = await run.uuid()
    dice = await run.random()
    await run.progress(lines=len(data["lines"]))
    await run.sleep(0.05)
    approval = await run.wait_for("approval", timeout=60)
    total = await run.step(count_lines, data)
    return {"total": total, "retried": retried, "token": token, "dice": dice,
            "started": started, "approval": approval}


@app.agent(name="sleeper", version="1")
async def sleeper(run: perdure.Run) -> str:
    """One step, then a sleep far longer than any recording: dormant mid-way."""
    await run.step(square, 3)
    await run.sleep(24 * 3600)
    return await run.step(square, 4, name="after_sleep")


@app.agent(name="square_child", version="1")
async def square_child(run: perdure.Run, n: int) -> int:
    """A child: one step."""
    return await run.step(square, n)


@app.agent(name="approval_child", version="1")
async def approval_child(run: perdure.Run, n: int) -> dict[str, Any]:
    """A child that waits for an event (left waiting in one recording)."""
    value = await run.step(square, n)
    answer = await run.wait_for("go", timeout=24 * 3600)
    return {"value": value, "answer": answer}


@app.agent(name="composer", version="1")
async def composer(run: perdure.Run, n: int) -> dict[str, Any]:
    """Delegate and join, then gather steps and children (direct and via a coroutine)."""
    first = await run.delegate(square_child, n)
    second = await run.delegate(square_child, n + 1)
    joined = await run.join(first, second)

    async def child_then_step(k: int) -> int:
        child = await run.delegate(square_child, k)
        value = await child
        return await run.step(square, value, name="square_again")

    handle = await run.delegate(square_child, n + 2)
    gathered = await run.gather(
        run.step(square, n, name="branch_step"),
        handle,
        child_then_step(n + 3),
    )
    return {"joined": joined, "gathered": gathered}


@app.agent(name="waiting_parent", version="1")
async def waiting_parent(run: perdure.Run, n: int) -> list[Any]:
    """Gather two children, one of which waits for an event: dormant mid-way."""
    await run.step(square, n)
    quick = await run.delegate(square_child, n)
    slow = await run.delegate(approval_child, n)
    return await run.gather(quick, slow)


@app.agent(name="refiner", version="1")
async def refiner(run: perdure.Run, goal: str) -> dict[str, Any]:
    """Refine its own intent, take a patched path, and note the intent it ended with."""
    await run.step(square, 2)
    intent = await run.refine(goal={"aim": goal}, max_failures=7)
    if run.patched("quota-check"):
        await run.step(check_quota)
    await run.wait_for("done", timeout=24 * 3600)
    return {"goal": intent.goal, "version_no": intent.version_no}


@app.agent(name="patch_late", version="1")
async def patch_late(run: perdure.Run) -> int:
    """Its golden memory was recorded by code *without* the patched block below.

    ``record.py`` registers that older body (``_patch_late_before``) when recording;
    the current code must still replay the old path from that memory.
    """
    first = await run.step(square, 5)
    if run.patched("double-check"):
        await run.step(check_quota)
    await run.wait_for("finish", timeout=24 * 3600)
    return first


@app.agent(name="sync_steps", version="1")
def sync_steps(run: perdure.SyncRun, n: int) -> dict[str, Any]:
    """A plain ``def`` agent: steps, a value, a sleep, an event and a child."""
    value = run.step(square, n)
    stamp = run.now()
    run.sleep(0.05)
    child = run.delegate(square_child, n + 1)
    from_child = child.result()
    answer = run.wait_for("answer", timeout=60)
    return {"value": value, "stamp": stamp, "child": from_child, "answer": answer}


async def _patch_late_before(run: perdure.Run) -> int:
    """``patch_late`` as it was before the patched block: what its golden log records."""
    first = await run.step(square, 5)
    await run.wait_for("finish", timeout=24 * 3600)
    return first
