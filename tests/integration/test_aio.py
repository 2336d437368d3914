"""``app.aio``: every caller operation awaited from one event loop, against a worker
process, on SQLite and PostgreSQL.

Callers wait with ``poll=30`` (their slow look): each wait below is shorter, so a result
comes only because the store pushed the object's end to the awaiting task.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.aio import THREADS
from tests.integration.aio_support import register, start_aio_worker
from tests.integration.engine_support import kill_process, wait_until

AppFactory = Callable[..., perdure.App]
SLOW = 30.0  # the callers' slow look: longer than any wait here
WAIT = 20.0  # how long a test waits for what a worker does


class Subscriptions:
    """Counts the result subscriptions live on a store (the real store's
    ``subscribe_results``, observed): taken and not yet let go."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.live = 0
        self.taken = 0
        lock = threading.Lock()
        real = store.subscribe_results

        def subscribe(callback: Callable[[str], None], **options: Any
                      ) -> Callable[[], None] | None:
            stop = real(callback, **options)
            if stop is None:
                return None
            with lock:
                self.live += 1
                self.taken += 1
            stopped = threading.Event()

            def release() -> None:
                if not stopped.is_set():
                    stopped.set()
                    with lock:
                        self.live -= 1
                stop()

            return release

        monkeypatch.setattr(store, "subscribe_results", subscribe)


@pytest.fixture
def app(make_app: AppFactory) -> perdure.App:
    """A client App with the test agents registered (its worker is another process)."""
    client = register(make_app(lease_seconds=5.0))
    client.poll_interval = SLOW
    return client


@pytest.fixture
def worker(store_url: str, key_dir: Path, tmp_path: Path, app: perdure.App
           ) -> Iterator[Path]:
    """A worker process on the test's store; yields its log file."""
    app.client.certified()  # the key folder made here first, not by two processes at once
    log = tmp_path / "worker.log"
    proc = start_aio_worker(store_url, key_dir, log)
    try:
        yield log
    finally:
        kill_process(proc)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> bool:
    """Await ``check()`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def status_is(handle: perdure.AsyncHandle, status: perdure.Status) -> bool:
    """Wait until the object has ``status``."""
    async def check() -> bool:
        return await handle.status() is status

    return await until(check)


def test_start_wait_steer_and_inspect_from_a_loop(app: perdure.App, worker: Path) -> None:
    async def main() -> None:
        aio = app.aio
        assert app.aio is aio  # one client per App
        quick = await aio.start("aio_quick", {"n": 7})
        assert quick.created and quick.differs is None
        assert await quick.result(timeout=WAIT, poll=SLOW) == {"n": 7}

        starter = aio.options(object_id="w-1", labels={"team": "a"})
        waiter = await starter.start("aio_waiter", 21)
        again = await aio.options(object_id="w-1").start("aio_waiter", 5)
        assert waiter.created and not again.created
        assert again.differs is not None and "arguments" in again.differs
        assert await status_is(waiter, perdure.Status.DORMANT), worker.read_text()
        info = await aio.get("w-1")
        assert info.waiting_event == "go" and info.agent == "aio_waiter"
        listed = await aio.list(agent="aio_waiter")
        assert [i.object_id for i in listed] == ["w-1"]
        assert await waiter.query("doubled") == 42
        assert await aio.query("w-1", "doubled") == 42

        history = await aio.history("w-1")
        assert [r.seq for r in history] == [r.seq for r in app.history("w-1")]
        at = next(r.seq for r in history if r.kind == "step_done")
        fork = await waiter.fork(at, new_id="w-fork")
        assert fork.object_id == "w-fork"

        await aio.refine("w-1", max_failures=7)

        async def refined() -> bool:
            return any(r.kind == "intent_refined" for r in await aio.history("w-1"))

        assert await until(refined), worker.read_text()
        assert await status_is(waiter, perdure.Status.DORMANT)

        paused = await aio.pause("w-1")
        assert paused.status is perdure.Status.PAUSED
        assert await waiter.send("go", {"ok": True}, dedupe_key="go-w-1")
        assert not await aio.send("w-1", "go", {"ok": False}, dedupe_key="go-w-1")
        with pytest.raises(perdure.ResultTimeoutError, match="still paused"):
            await waiter.result(timeout=0.3, poll=SLOW)  # paused: the event waits
        await waiter.resume()
        assert await waiter.result(timeout=WAIT, poll=SLOW) == {"ok": True}
        assert await aio.result_of("w-1") == {"ok": True}
        assert (await aio.outcome("w-1"))["result"] == {"ok": True}
        assert (await aio.verify("w-1")).ok
        assert await aio.usage("w-1") == app.usage("w-1")
        emitted = [e.data async for e in waiter.stream() if e.kind == "emitted"]
        assert emitted == [42]

        assert await status_is(fork, perdure.Status.DORMANT), worker.read_text()
        assert (await fork.info()).forked_from is not None
        await aio.send("w-fork", "go", "forked")
        assert await fork.result(timeout=WAIT, poll=SLOW) == "forked"

        doomed = await aio.options(object_id="c-1").start("aio_waiter", 1)
        assert await status_is(doomed, perdure.Status.DORMANT)
        await doomed.cancel()
        with pytest.raises(perdure.AgentCancelledError):
            await doomed.result(timeout=WAIT, poll=SLOW)
        failing = await aio.start("aio_failer")
        with pytest.raises(perdure.AgentFailedError, match="no such luck"):
            await failing.result(timeout=WAIT, poll=SLOW)
        ended = await (await aio.handle("c-1")).info()
        assert ended.status is perdure.Status.CANCELLED

    asyncio.run(main())


def test_questions_and_a_parked_object_retried(app: perdure.App, worker: Path,
                                               tmp_path: Path) -> None:
    flag = tmp_path / "drift"

    async def main() -> None:
        aio = app.aio
        asker = await aio.options(object_id="ask-1").start("aio_asker")

        async def asked() -> bool:
            return any(q.object_id == "ask-1" for q in await aio.questions())

        assert await until(asked), worker.read_text()
        [question] = await aio.questions(agent="aio_asker")
        assert question.prompt == "Which colour?" and question.choices == ("red", "blue")
        await aio.send(question.object_id, question.event, question.choices[1])
        assert await asker.result(timeout=WAIT, poll=SLOW) == "blue"

        drifter = await aio.options(object_id="drift").start("aio_drifter", str(flag))
        assert await status_is(drifter, perdure.Status.DORMANT), worker.read_text()
        with pytest.raises(perdure.NotParkedError):
            await drifter.retry()
        flag.write_text("the code changed")
        await drifter.send("go")
        with pytest.raises(perdure.AgentParkedError, match="parked"):
            await drifter.result(timeout=WAIT, poll=SLOW)
        flag.unlink()  # the code is back to what memory holds
        info = await aio.retry("drift")
        assert info.status is not perdure.Status.PARKED
        assert await drifter.result(timeout=WAIT, poll=SLOW) == "done"

    asyncio.run(main())


def test_cancelling_the_wait_leaves_the_object_running_and_lets_go(
        app: perdure.App, worker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    subs = Subscriptions(app.store, monkeypatch)

    async def main() -> None:
        aio = app.aio
        handle = await aio.options(object_id="long").start("aio_waiter", 1)
        assert await status_is(handle, perdure.Status.DORMANT), worker.read_text()

        def live(count: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return subs.live == count
            return check

        task = asyncio.create_task(handle.result(poll=SLOW))
        assert await until(live(1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await until(live(0))

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(handle.result(poll=SLOW), 0.3)
        assert await until(live(0))
        with pytest.raises(perdure.ResultTimeoutError, match="keeps running"):
            await handle.result(timeout=0.2, poll=SLOW)
        assert await until(live(0))
        assert subs.taken == 3

        assert (await handle.status()) is perdure.Status.DORMANT  # none of it ended it
        await handle.send("go", "finished")
        assert await handle.result(timeout=WAIT, poll=SLOW) == "finished"
        assert await until(live(0))

    asyncio.run(main())


def test_two_hundred_awaited_results_share_a_few_threads_and_the_loop_keeps_ticking(
        app: perdure.App, store_url: str, key_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """200 objects are started with no worker running, 200 tasks await their results,
    then a worker runs them all: every result comes, the loop's ticks stay on time, and
    the waits hold no thread each."""
    count = 200
    subs = Subscriptions(app.store, monkeypatch)
    app.client.certified()
    baseline = threading.active_count()

    async def main() -> tuple[list[Any], float, int]:
        aio = app.aio
        handles = await asyncio.gather(*(aio.start("aio_quick", n) for n in range(count)))
        ticking = True
        lag, threads = 0.0, 0

        async def tick() -> None:
            nonlocal lag, threads
            loop = asyncio.get_running_loop()
            while ticking:
                before = loop.time()
                await asyncio.sleep(0.01)
                lag = max(lag, loop.time() - before - 0.01)
                threads = max(threads, threading.active_count())

        ticker = asyncio.create_task(tick())
        waits = [asyncio.create_task(h.result(timeout=60, poll=SLOW)) for h in handles]

        async def all_waiting() -> bool:
            return subs.live == count

        assert await until(all_waiting)
        log = tmp_path / "worker.log"
        proc = start_aio_worker(store_url, key_dir, log, concurrency=16)
        try:
            results = await asyncio.gather(*waits)
        finally:
            kill_process(proc)
        ticking = False
        await ticker
        return results, lag, threads

    results, lag, threads = asyncio.run(main())
    assert results == list(range(count))
    assert lag < 0.5, f"the loop was late by {lag:.3f}s"
    assert threads - baseline <= THREADS + 4, (baseline, threads)
    assert subs.taken == count


def test_bad_input_raises_what_the_synchronous_call_raises(app: perdure.App) -> None:
    """Each awaited call fails with the typed error its synchronous twin raises, and
    stores nothing."""
    aio = app.aio
    nobody = perdure.Handle(app, "nobody")
    pairs: list[tuple[Callable[[], Any], Callable[[], Awaitable[Any]]]] = [
        (lambda: app.get("nobody"), lambda: aio.get("nobody")),
        (lambda: app.handle("nobody"), lambda: aio.handle("nobody")),
        (lambda: nobody.result(timeout=1), lambda: perdure.AsyncHandle(aio, nobody).result(1)),
        (lambda: app.send("nobody", "go"), lambda: aio.send("nobody", "go")),
        (lambda: app.cancel("nobody"), lambda: aio.cancel("nobody")),
        (lambda: app.retry("nobody"), lambda: aio.retry("nobody")),
        (lambda: app.history("nobody"), lambda: aio.history("nobody")),
        (lambda: app.query("nobody", "doubled"), lambda: aio.query("nobody", "doubled")),
        (lambda: app.start("no_such_agent"), lambda: aio.start("no_such_agent")),
        (lambda: app.start("aio_quick"), lambda: aio.start("aio_quick")),  # no value
        (lambda: app.send("nobody", "perdure:x"), lambda: aio.send("nobody", "perdure:x")),
    ]

    async def main() -> None:
        for sync_call, async_call in pairs:
            with pytest.raises(perdure.PerdureError) as sync_raised:
                sync_call()
            with pytest.raises(perdure.PerdureError) as async_raised:
                await async_call()
            assert type(async_raised.value) is type(sync_raised.value)
            assert str(async_raised.value) == str(sync_raised.value)
        with pytest.raises(perdure.UnknownAgentError):
            await aio.options(object_id="x").start("no_such_agent")
        with pytest.raises(perdure.ConfigurationError):
            aio.options(deadline="soon")  # type: ignore[arg-type]

    asyncio.run(main())
    assert app.list() == []
    with pytest.raises(perdure.ObjectNotFoundError):
        app.get("nobody")


def _aio_threads() -> int:
    return sum(t.name.startswith("perdure-aio") for t in threading.enumerate())


def test_close_stops_the_client_threads_and_a_later_call_starts_them(app: perdure.App
                                                                     ) -> None:
    before = _aio_threads()

    async def started() -> perdure.AsyncHandle:
        return await app.aio.options(object_id="q").start("aio_quick", 1)

    handle = asyncio.run(started())
    assert _aio_threads() > before
    app.close()
    assert _aio_threads() == before
    assert asyncio.run(handle.status()) is perdure.Status.READY  # the App opens again
    asyncio.run(app.aio.to_thread(app.close))  # on one of its own threads: no deadlock
    asyncio.run(app.aio.aclose())
    assert wait_until(lambda: _aio_threads() == before)
