"""Agents the dashboard tests run: the ``--app`` of their worker processes."""

from __future__ import annotations

from typing import Any

import perdure

app = perdure.App()


@app.agent()
def asker(run: perdure.SyncRun, topic: str) -> dict[str, Any]:
    """Asks a person (waits for the event ``answer``), then completes with the answer."""
    run.progress(asking=topic)
    answer = run.wait_for("answer")
    return {"topic": topic, "answer": answer}


@app.agent()
def sleeper(run: perdure.SyncRun, seconds: float) -> str:
    """Sleeps, released, then completes: something to cancel."""
    run.sleep(seconds)
    return "slept"


@app.agent()
def parent(run: perdure.SyncRun) -> list[Any]:
    """Delegates two askers and joins them: a lineage to draw."""
    kids = [run.delegate(asker, f"part {n}") for n in range(2)]
    return run.join(*kids)


_SEEN: set[str] = set()


def first_way() -> int:
    """The step the first run of ``fickle`` takes."""
    return 1


def second_way() -> int:
    """The step its replays take instead: memory says otherwise, so the object parks."""
    return 2


@app.agent()
def fickle(run: perdure.SyncRun) -> int:
    """Changes its mind on replay (in one process): parked for non-determinism."""
    fresh = run.object_id not in _SEEN
    _SEEN.add(run.object_id)
    got = run.step(first_way if fresh else second_way)
    run.wait_for("go")
    return got
