"""Progress markers inside a step: batched, durable on demand, read back by a retry."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.engine.checkpoints import CHECKPOINT_EVERY

AppFactory = Callable[..., perdure.App]


def _slot(app: perdure.App, object_id: str) -> dict[str, Any] | None:
    """The step's progress marker as its checkpoint slot holds it now (outside the
    chain: each marker replaces the one before), or ``None``."""
    rows = [r for r in app.store.checkpoints(object_id) if r.slot.startswith("step:")]
    assert len(rows) <= 1
    return json.loads(rows[0].body) if rows else None


def test_batched_markers_are_few_and_a_retry_continues_from_the_last(
        make_app: AppFactory) -> None:
    """A step giving 2,000 markers in a burst writes only a handful (the latest one each
    ``CHECKPOINT_EVERY``); when it fails, its last marker is written before the failure
    and the retry starts from it."""
    app = make_app()
    seen: list[Any] = []

    slots: list[dict[str, Any] | None] = []

    def crawl() -> int:
        step = perdure.current_step()
        seen.append(step.last_checkpoint)
        slots.append(_slot(app, "crawl-1"))
        start = step.last_checkpoint or 0
        for i in range(start + 1, 2001):
            step.checkpoint(i)
            if i == 1500 and step.attempt == 1:
                raise ConnectionError("network blip at 1500")
        return 2000

    @app.agent(name="crawler")
    async def crawler(run: perdure.Run) -> int:
        return await run.step(crawl, retry=perdure.RetryPolicy(base=0.01))

    handle = app.options(object_id="crawl-1").start("crawler")
    with app.background_worker():
        assert handle.result(timeout=15) == 2000
    assert seen == [None, 1500]
    first = slots[1]  # what the retry found: the failed attempt's last marker
    assert first is not None and first["attempt"] == 1
    assert first["cursor"] == 1500, "the failed attempt's last marker was written"
    assert 1 <= first["count"] <= 10, "batched: the latest marker per interval, not 2,000"
    assert _slot(app, "crawl-1") is None, "the step's outcome deletes its slot"
    assert perdure.Kind.STEP_CHECKPOINT not in [r.kind for r in app.history("crawl-1")]
    assert CHECKPOINT_EVERY <= 1.0


def test_async_step_durable_markers(make_app: AppFactory) -> None:
    """``await acheckpoint`` writes each marker before returning; ``checkpoint(...,
    durable=True)`` on the event loop says to use it instead; a cursor that is not JSON
    is refused with a typed error."""
    app = make_app()
    said: list[str] = []

    durable: list[Any] = []

    async def walk() -> str:
        step = perdure.current_step()
        for i in range(3):
            await step.acheckpoint({"at": i})
            got = await asyncio.to_thread(_slot, app, "walk-1")  # in the store already
            durable.append(got and got["cursor"])
        try:
            step.checkpoint(1, durable=True)
        except RuntimeError as exc:
            said.append(str(exc))
        try:
            step.checkpoint({1, 2})
        except perdure.SerializationError as exc:
            said.append(type(exc).__name__)
        await asyncio.sleep(0)
        return "walked"

    @app.agent(name="walker")
    async def walker(run: perdure.Run) -> str:
        return await run.step(walk)

    handle = app.options(object_id="walk-1").start("walker")
    with app.background_worker():
        assert handle.result(timeout=10) == "walked"
    assert durable == [{"at": 0}, {"at": 1}, {"at": 2}]
    assert _slot(app, "walk-1") is None
    assert "acheckpoint" in said[0] and said[1] == "SerializationError"


def test_checkpoint_outside_a_step_is_refused() -> None:
    """``current_step()`` outside a step is a RuntimeError, as before."""
    with pytest.raises(RuntimeError):
        perdure.current_step().checkpoint(1)
