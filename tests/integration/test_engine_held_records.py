"""Held records: a node that claims an object again reads only what was appended since.

Each test drives one worker on the event loop (``app.worker``) so the worker's
``held`` cache can be inspected: hits when the tail was enough, misses when the whole
chain was read.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import perdure
from perdure.engine.worker import HeldRecords, Worker
from perdure.hooks import Counters

AppFactory = Callable[..., perdure.App]


@contextlib.asynccontextmanager
async def _running(worker: Worker) -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """Run ``worker`` for the block; yields ``until(done)`` that waits for ``done()``."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))

    async def until(done: Callable[[], bool], timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                if task.done():
                    task.result()
                    raise AssertionError("worker stopped early")
                await asyncio.sleep(0.01)

    try:
        yield until
    finally:
        stop.set()
        await task


def _register_rounds(app: perdure.App) -> None:
    def numbers(n: int) -> list[int]:
        return list(range(n))

    @app.agent(name="rounds")
    async def rounds(run: perdure.Run, options: dict[str, Any]) -> dict[str, Any]:
        at_start = sorted(options)
        seen: list[int] = []
        for i in range(options["rounds"]):
            values = await run.step(numbers, 3, name="numbers")
            # Changing what memory handed out must never change memory itself.
            values.append(99)
            options["touched"] = True
            seen.append(len(values))
            await run.step(numbers, i, name="more")
            got = await run.wait_for("next")
            got["changed"] = True
        return {"seen": seen, "options": at_start}


def _dormant_waiting(app: perdure.App, oid: str, records: int) -> Callable[[], bool]:
    def check() -> bool:
        info = app.get(oid)
        return info.status is perdure.Status.DORMANT and info.records >= records
    return check


def _settled(app: perdure.App, oid: str, more_than: int) -> Callable[[], bool]:
    """Memory has grown past ``more_than`` records and the object is at rest again."""
    def check() -> bool:
        info = app.get(oid)
        return info.records > more_than and info.status in (perdure.Status.DORMANT,
                                                             perdure.Status.COMPLETED)
    return check


def test_a_reclaimed_object_reads_only_its_tail(make_app: AppFactory) -> None:
    """Each wake after the first reads the tail; the result is what a cold node computes,
    even though the agent changed values memory handed it."""
    app = make_app()
    _register_rounds(app)
    oid = "rounds-1"
    app.options(object_id=oid).start("rounds", {"rounds": 4})
    worker = app.worker(concurrency=4)
    counts = Counters()
    counts.attach(worker.hooks)

    async def scenario() -> None:
        async with _running(worker) as until:
            await until(_settled(app, oid, 3))
            for _ in range(4):
                before = app.get(oid).records
                app.send(oid, "next", {"n": 1})
                await until(_settled(app, oid, before + 1))

    asyncio.run(scenario())
    assert app.get(oid).status is perdure.Status.COMPLETED
    assert app.result_of(oid) == {"seen": [4, 4, 4, 4], "options": ["rounds"]}
    assert counts.claims - counts.held_claims == 1  # read whole once, then only tails
    assert counts.held_claims >= 4
    assert len(worker.held) == 0  # a terminated object is not held
    assert app.verify(oid).ok


def test_replay_from_held_records_matches_a_cold_node(make_app: AppFactory) -> None:
    """A node holding the records and a node reading them cold replay to the same end."""
    warm = make_app(node_id="warm")
    _register_rounds(warm)
    oid = "rounds-2"
    warm.options(object_id=oid).start("rounds", {"rounds": 2})
    worker = warm.worker()
    warm_counts = Counters()
    warm_counts.attach(worker.hooks)

    async def first_part() -> None:
        async with _running(worker) as until:
            await until(_settled(warm, oid, 3))
            before = warm.get(oid).records
            warm.send(oid, "next", {"n": 2})
            await until(_settled(warm, oid, before + 1))

    asyncio.run(first_part())
    assert warm_counts.held_claims >= 1
    cold = make_app(node_id="cold")
    _register_rounds(cold)
    cold.send(oid, "next", {"n": 2})
    cold_worker = cold.worker(held_records=0)
    cold_counts = Counters()
    cold_counts.attach(cold_worker.hooks)

    async def second_part() -> None:
        async with _running(cold_worker) as until:
            await until(lambda: cold.get(oid).status is perdure.Status.COMPLETED)

    asyncio.run(second_part())
    assert cold_counts.claims >= 1 and cold_counts.held_claims == 0
    assert cold.result_of(oid) == {"seen": [4, 4], "options": ["rounds"]}


def test_a_store_rewound_behind_what_the_node_saw_is_refused(make_app: AppFactory,
                                                             backend: str,
                                                             store_url: str) -> None:
    """If the store's chain ends before the head this node saw (a rollback by whoever
    controls the store, or a restore from an earlier backup), the node parks the object
    without running it, naming the record it saw. Once an operator says the restore was
    meant (``forget-heads``) and resumes it, the node reads the whole chain again and
    carries on."""
    if backend != "sqlite":
        pytest.skip("rewinds the chain with SQL on the SQLite file")
    app = make_app()
    _register_rounds(app)
    oid = "rounds-3"
    app.options(object_id=oid).start("rounds", {"rounds": 3})
    worker = app.worker()
    counts = Counters()
    counts.attach(worker.hooks)

    async def scenario() -> None:
        async with _running(worker) as until:
            await until(_settled(app, oid, 3))
            app.send(oid, "next", {"n": 2})
            await until(_settled(app, oid, 4))
            held = worker.held.get(oid)
            assert held is not None
            saw = app.get(oid).records
            # Rewind the store to before the last record the node holds.
            keep = held[-2]
            conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
            with conn:
                conn.execute("DELETE FROM records WHERE object_id = ? AND seq > ?",
                             (oid, keep.seq))
                conn.execute("DELETE FROM inbox WHERE object_id = ?", (oid,))
                conn.execute("UPDATE objects SET head_seq = ?, head_hash = ? "
                             "WHERE object_id = ?", (keep.seq, bytes.fromhex(keep.hash), oid))
            conn.close()
            app.send(oid, "next", {"n": 3})
            await until(lambda: app.get(oid).status is perdure.Status.PARKED)
            note = str(app.get(oid).note)
            assert "rolled back" in note and f"saw #{saw}" in note and "forget-heads" in note
            assert app.get(oid).records == keep.seq
            misses = counts.claims - counts.held_claims
            assert worker.anchors.forget([oid]) == 1
            app.resume(oid)
            await until(_settled(app, oid, keep.seq + 1))
            assert counts.claims - counts.held_claims == misses + 1

    asyncio.run(scenario())
    assert app.get(oid).status is perdure.Status.DORMANT
    assert app.verify(oid).ok


def test_held_records_stay_within_their_limit() -> None:
    """The least recently used objects go first; a chain longer than the limit is not held."""
    from perdure.core.records import Kind
    from tests.unit.builders import chain

    def records(n: int) -> list[perdure.Record]:
        return chain([(Kind.PROGRESS, {"fields": {"i": i}}) for i in range(n - 1)])

    held = HeldRecords(limit=10)
    a, b, c = records(4), records(4), records(4)
    held.put("a", a)
    held.put("b", b)
    assert held.get("a") is a  # a is now the most recently used
    held.put("c", c)
    assert len(held) <= 10
    assert held.get("b") is None and held.get("a") is a and held.get("c") is c
    held.put("big", records(11))
    assert held.get("big") is None
    held.drop("a")
    assert held.get("a") is None and len(held) == 4
