"""An App on the in-memory store: what a user's own tests do with ``store="memory:"``."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import perdure
from perdure.hooks import Counters
from perdure.stores.base import Writer
from perdure.stores.memory import MemoryStore
from perdure.stores.writers import ThreadWriter
from tests.integration.engine_support import wait_until


def test_an_agent_runs_to_completion_on_a_memory_store(key_dir: Path) -> None:
    """Steps, an event it waits for and a child it delegates to, run by a node on the
    App's own in-memory store; the memory verifies, and a second App given the same
    store object sees the same objects."""
    app = perdure.App(store="memory:", key_dir=key_dir, poll_interval=0.01)
    try:
        assert app.store_url == "memory:"

        def double(x: int) -> int:
            return 2 * x

        @app.agent(name="child")
        async def child(run: perdure.Run, x: int) -> int:
            return await run.step(double, x)

        @app.agent(name="parent")
        async def parent(run: perdure.Run, x: int) -> dict[str, int]:
            doubled = await run.step(double, x)
            extra = await run.wait_for("extra")
            from_child = await (await run.delegate(child, doubled + extra["n"]))
            return {"doubled": doubled, "child": from_child}

        handle = app.options(object_id="memory-parent").start("parent", 5)
        with app.background_worker(concurrency=4):
            assert wait_until(lambda: handle.info().waiting_event == "extra", timeout=10)
            assert app.send("memory-parent", "extra", {"n": 1})
            assert handle.result(timeout=10) == {"doubled": 10, "child": 22}
        assert app.verify("memory-parent").ok
        kids = app.list(parent="memory-parent")
        assert len(kids) == 1 and kids[0].status == "completed"
        assert app.verify(kids[0].object_id).ok

        assert isinstance(app.store, MemoryStore)
        other = perdure.App(store=app.store, key_dir=key_dir)
        assert other.get("memory-parent").status == "completed"
    finally:
        app.close()


class _ThreadOnlyStore(MemoryStore):
    """A store that commits only on the write thread: the writer of a backend with
    nothing better (it knows nothing of the event loop)."""

    def writer(self, executor: concurrent.futures.Executor) -> Writer:
        return ThreadWriter(self.apply, executor)


def test_a_store_that_commits_on_the_write_thread_only_runs_agents(key_dir: Path) -> None:
    """The engine needs no more of a store than a writer: one that hands every commit to
    the write thread runs many objects, their appends still sharing commits."""
    app = perdure.App(store=_ThreadOnlyStore(), key_dir=key_dir, poll_interval=0.01)

    def square(x: int) -> int:
        return x * x

    @app.agent(name="squares")
    async def squares(run: perdure.Run, n: int) -> int:
        return sum([await run.step(square, i) for i in range(n)])

    handles = [app.options(object_id=f"squares-{i}").start("squares", 10) for i in range(20)]
    worker = app.worker(concurrency=20)
    counts = Counters()
    counts.attach(worker.hooks)

    async def serve() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        loop = asyncio.get_running_loop()
        try:
            results = await asyncio.gather(
                *(loop.run_in_executor(None, h.result, 20.0) for h in handles))
        finally:
            stop.set()
            await task
        assert results == [sum(i * i for i in range(10))] * 20

    try:
        asyncio.run(serve())
        committer = worker.committer
        assert committer.loop_commits == 0 and counts.commits < counts.appends
        assert all(app.verify(h.object_id).ok for h in handles)
    finally:
        app.close()
