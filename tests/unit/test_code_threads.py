"""``CodeThreads``: plain functions off the event loop, their outcomes back on it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from perdure.engine.code_threads import CodeThreads


def test_a_function_runs_on_a_code_thread_and_its_outcome_reaches_the_loop() -> None:
    threads = CodeThreads(2, "t-code")

    def where(n: int) -> tuple[str, int]:
        return threading.current_thread().name, n * 2

    def boom() -> None:
        raise KeyError("no such thing")

    async def main() -> tuple[str, int]:
        got = await threads.run(where, 21)
        with pytest.raises(KeyError, match="no such thing"):
            await threads.run(boom)
        return got

    try:
        name, value = asyncio.run(main())
    finally:
        threads.shutdown()
    assert value == 42
    assert name.startswith("t-code_")
    assert name != threading.current_thread().name


def test_one_after_another_reuses_the_warm_thread() -> None:
    """A thread says it is idle before its outcome reaches the loop: the next job takes it
    instead of starting another thread."""
    threads = CodeThreads(8, "t-warm")

    async def main() -> set[str]:
        return {await threads.run(lambda: threading.current_thread().name)
                for _ in range(200)}

    try:
        names = asyncio.run(main())
    finally:
        threads.shutdown()
    assert len(names) == 1


def test_jobs_beyond_the_limit_wait_for_a_free_thread() -> None:
    """At most ``max_threads`` run at once; the others wait in the queue and still run."""
    threads = CodeThreads(2, "t-cap")
    release = threading.Event()
    running: list[str] = []
    lock = threading.Lock()
    peak = [0]

    def held(i: int) -> int:
        with lock:
            running.append(threading.current_thread().name)
            peak[0] = max(peak[0], len(running))
        release.wait(10)
        with lock:
            running.remove(threading.current_thread().name)
        return i

    async def main() -> list[int]:
        jobs = [threads.run(held, i) for i in range(5)]
        while True:  # two started, three queued behind them
            with lock:
                if len(running) == 2:
                    break
            await asyncio.sleep(0.001)
        assert not any(job.done() for job in jobs)
        release.set()
        return list(await asyncio.gather(*jobs))

    try:
        assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    finally:
        threads.shutdown()
    assert peak[0] == 2


def test_shutdown_cancels_jobs_not_started_and_refuses_new_ones() -> None:
    threads = CodeThreads(1, "t-stop")
    started = threading.Event()
    release = threading.Event()

    def busy() -> str:
        started.set()
        release.wait(10)
        return "finished"

    async def main() -> None:
        first = threads.run(busy)
        queued = threads.run(lambda: "never")
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        threads.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            threads.run(lambda: None)
        release.set()
        assert await first == "finished"  # a running function finishes on its thread
        with pytest.raises(asyncio.CancelledError):
            await queued

    asyncio.run(main())
    for thread in threading.enumerate():  # the idle thread was told to stop
        if thread.name.startswith("t-stop_"):
            thread.join(5)
            assert not thread.is_alive()
