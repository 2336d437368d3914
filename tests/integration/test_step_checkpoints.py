"""Progress markers inside a step: batched, durable on demand, read back by a retry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.engine.checkpoints import CHECKPOINT_EVERY

AppFactory = Callable[..., perdure.App]


def _markers(app: perdure.App, object_id: str) -> list[dict[str, Any]]:
    return [r.body for r in app.history(object_id) if r.kind == perdure.Kind.STEP_CHECKPOINT]


def test_batched_markers_are_few_and_a_retry_continues_from_the_last(
        make_app: AppFactory) -> None:
    """A step giving 2,000 markers in a burst writes only a handful (the latest one each
    ``CHECKPOINT_EVERY``); when it fails, its last marker is written before the failure
    and the retry starts from it."""
    app = make_app()
    seen: list[Any] = []

    def crawl() -> int:
        step = perdure.current_step()
        seen.append(step.last_checkpoint)
        start = step.last_checkpoint or 0
        for i in range(start + 1, 2001):
            step.checkpoint(i)
            if i == 1500 and step.attempt == 1:
                raise ConnectionError("network blip at 1500")
        return 2000

    @app.agent(name="crawler")
    async def crawler(run: perdure.Run) -> int:
        return await run.step(crawl, retry=perdure.RetryPolicy(base=0.01))

    handle = app.start("crawler", object_id="crawl-1")
    with app.background_worker():
        assert handle.result(timeout=15) == 2000
    assert seen == [None, 1500]
    markers = _markers(app, "crawl-1")
    assert 1 <= len(markers) <= 10, "batched: the latest marker per interval, not 2,000"
    first = [m for m in markers if m["attempt"] == 1]
    assert first[-1]["cursor"] == 1500, "the failed attempt's last marker was written"
    assert CHECKPOINT_EVERY <= 1.0


def test_async_step_durable_markers(make_app: AppFactory) -> None:
    """``await acheckpoint`` writes each marker before returning; ``checkpoint(...,
    durable=True)`` on the event loop says to use it instead; a cursor that is not JSON
    is refused with a typed error."""
    app = make_app()
    said: list[str] = []

    async def walk() -> str:
        step = perdure.current_step()
        for i in range(3):
            await step.acheckpoint({"at": i})
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

    handle = app.start("walker", object_id="walk-1")
    with app.background_worker():
        assert handle.result(timeout=10) == "walked"
    assert [m["cursor"] for m in _markers(app, "walk-1")] == [{"at": 0}, {"at": 1}, {"at": 2}]
    assert "acheckpoint" in said[0] and said[1] == "SerializationError"


def test_checkpoint_outside_a_step_is_refused() -> None:
    """``current_step()`` outside a step is a RuntimeError, as before."""
    with pytest.raises(RuntimeError):
        perdure.current_step().checkpoint(1)
