"""Group commit: appends of many objects running at once share store transactions."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import perdure
from perdure.engine.worker import Worker
from perdure.hooks import Counters

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

    handles = [app.options(object_id=f"busy-{i:02d}").start("busy", i) for i in range(OBJECTS)]
    worker: Worker = app.worker(concurrency=OBJECTS)
    counts = Counters()
    counts.attach(worker.hooks)

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
    assert counts.appends >= OBJECTS * (STEPS + 1), "every step and every end was appended"
    assert counts.commits < counts.appends, "appends were batched into shared commits"
    # SQLite: the loop commits itself while nobody else writes (not every time: while the
    # write thread claims or renews, a commit goes there); PostgreSQL: the loop awaits
    # every plain batch on its own asynchronous connection.
    assert committer.loop_commits > 0
    for i in (0, OBJECTS // 2, OBJECTS - 1):
        history = app.history(f"busy-{i:02d}")
        assert sum(1 for r in history if r.kind == perdure.Kind.STEP_DONE) == STEPS
        assert app.verify(f"busy-{i:02d}").ok


def test_steps_go_on_while_another_process_holds_the_write_lock(make_sqlite_app: AppFactory,
                                                                tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock, the event loop does not wait on
    it: its commits go to the write thread, which waits out the lock, and the loop goes
    back to committing itself once the file is free again. Nothing is lost or doubled."""
    app = make_sqlite_app()
    path = app.store.url.removeprefix("sqlite:///")
    ran: list[int] = []

    async def tick(j: int) -> int:
        ran.append(j)
        await asyncio.sleep(0.005)
        return j

    @app.agent(name="ticker")
    async def ticker(run: perdure.Run, n: int) -> int:
        return sum([await run.step(tick, j) for j in range(n)])

    handle = app.options(object_id="ticker").start("ticker", 400)
    worker: Worker = app.worker(concurrency=4)
    counts = Counters()
    counts.attach(worker.hooks)
    loop_stalls: list[float] = []

    def hold_lock(held: threading.Event) -> None:
        other = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            while len(ran) < 20:
                time.sleep(0.005)
            other.execute("BEGIN IMMEDIATE")
            held.set()
            time.sleep(0.5)
            other.execute("COMMIT")
        finally:
            other.close()

    async def serve() -> None:
        held = threading.Event()
        holder = threading.Thread(target=hold_lock, args=(held,))
        holder.start()
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        loop = asyncio.get_running_loop()
        try:
            while not held.is_set():
                await asyncio.sleep(0.01)
            for _ in range(20):  # the loop keeps turning while the lock is held
                began = loop.time()
                await asyncio.sleep(0.01)
                loop_stalls.append(loop.time() - began)
            assert await loop.run_in_executor(None, handle.result, 60.0) == sum(range(400))
        finally:
            stop.set()
            await task
            holder.join()

    asyncio.run(serve())
    assert max(loop_stalls) < 0.3, loop_stalls
    assert sorted(set(ran)) == list(range(400)) and len(ran) == 400
    committer = worker.committer
    assert 0 < committer.loop_commits < counts.commits
    assert app.verify("ticker").ok
