"""Group commit: appends of many objects running at once share store transactions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import perdure
from perdure.engine.worker import Worker

AppFactory = Callable[..., perdure.App]

OBJECTS = 50
STEPS = 20


def test_concurrent_objects_share_commits(make_app: AppFactory) -> None:
    """50 objects doing 20 steps each on one node: fewer store commits than appends.

    A structural check: the committer batches appends submitted while a commit is
    running, so the number of commits stays below the number of appends. Every object
    still completes with every step recorded, and its chain verifies.
    """
    app = make_app()

    async def work(i: int, j: int) -> int:
        await asyncio.sleep(0)
        return i * j

    @app.agent(name="busy")
    async def busy(run: perdure.Run, i: int) -> int:
        total = 0
        for j in range(STEPS):
            total += await run.step(work, i, j, name=f"work-{j}")
        return total

    handles = [app.start("busy", i, object_id=f"busy-{i:02d}") for i in range(OBJECTS)]
    worker: Worker = app.worker(concurrency=OBJECTS)

    async def serve_until_done() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        loop = asyncio.get_running_loop()
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(loop.run_in_executor(None, h.result, 20.0) for h in handles)),
                timeout=30,
            )
        finally:
            stop.set()
            await task
        assert results == [i * sum(range(STEPS)) for i in range(OBJECTS)]

    asyncio.run(serve_until_done())

    committer = worker.committer
    assert committer.appends >= OBJECTS * (STEPS + 1), "every step and every end was appended"
    assert committer.commits < committer.appends, "appends were batched into shared commits"
    for i in (0, OBJECTS // 2, OBJECTS - 1):
        history = app.history(f"busy-{i:02d}")
        assert sum(1 for r in history if r.kind == perdure.Kind.STEP_DONE) == STEPS
        assert app.verify(f"busy-{i:02d}").ok
