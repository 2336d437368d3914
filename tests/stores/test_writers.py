"""The writers a store opts into: where a commit runs, and that every batch is settled.

Written against stand-in commit functions (no store): what is checked is the
writers' own rules. Every outcome reaches ``done`` on the event loop's thread, once;
a commit made on the loop is counted; an inline writer falls back to the write thread
while the store is busy, and leaves the loop while its commits are slow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest

from perdure.core.chain import CommitSeal
from perdure.errors import StoreError
from perdure.stores.base import Append, Outcomes, Writer
from perdure.stores.writers import AsyncWriter, InlineWriter, ThreadWriter

OPS: list[Append] = [
    Append(object_id=name, epoch=1, records=[], status="running", phase="execution",
           ready_at=None) for name in ("a", "b")]


class Recorder:
    """Stand-ins for a store's commit functions: what they were called on, and where."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.now_result: Outcomes | None = [None, None]
        self.now_delay = 0.0
        self.async_result: Outcomes | None = [None, None]
        self.fail: BaseException | None = None

    def apply(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal]
              ) -> Outcomes:
        self.threads.append(threading.current_thread().name)
        if self.fail is not None:
            raise self.fail
        return [None] * len(ops)

    def apply_now(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal]
                  ) -> Outcomes | None:
        self.threads.append(threading.current_thread().name)
        if self.fail is not None:
            raise self.fail
        time.sleep(self.now_delay)
        return self.now_result

    async def apply_async(self, ops: Sequence[Append], now: float,
                          seals: Sequence[CommitSeal]) -> Outcomes | None:
        self.threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return self.async_result


def _run(make: Callable[[concurrent.futures.Executor], Writer],
         body: Callable[[Writer, Callable[[], Coroutine[Any, Any, Outcomes]]],
                        Coroutine[Any, Any, None]]) -> None:
    """Run ``body(writer, commit)`` on a loop, the writer's write thread a pool of one
    named ``write``; ``commit()`` writes ``OPS`` and awaits its outcome, checking that
    ``done`` came once, on the loop's thread."""
    pool = concurrent.futures.ThreadPoolExecutor(1, "write")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        writer = make(pool)

        async def commit() -> Outcomes:
            future: asyncio.Future[Outcomes] = loop.create_future()
            calls: list[str] = []

            def done(results: Outcomes | None, error: BaseException | None) -> None:
                calls.append(threading.current_thread().name)
                if results is None:
                    future.set_exception(error or RuntimeError("no outcome"))
                else:
                    future.set_result(results)

            writer.write(loop, OPS, 1.0, (), done)
            try:
                return await future
            finally:
                assert calls == [threading.current_thread().name]

        await body(writer, commit)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()


def test_a_thread_writer_commits_on_the_write_thread() -> None:
    """Every commit runs on the write thread and settles on the loop; a failure reaches
    the submitter as itself; a shut-down write thread is a failure, not a hang."""
    store = Recorder()

    async def body(writer: Writer, commit: Callable[[], Coroutine[Any, Any, Outcomes]]
                   ) -> None:
        assert not writer.holds_loop
        assert await commit() == [None, None]
        store.fail = StoreError("the disk is full")
        with pytest.raises(StoreError, match="disk is full"):
            await commit()
        assert writer.loop_commits == 0

    _run(lambda pool: ThreadWriter(store.apply, pool), body)
    assert store.threads and all(name.startswith("write") for name in store.threads)

    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.shutdown()
    got: list[BaseException | None] = []
    loop = asyncio.new_event_loop()
    try:
        ThreadWriter(store.apply, pool).write(loop, OPS, 1.0, (),
                                              lambda results, error: got.append(error))
    finally:
        loop.close()
    assert len(got) == 1 and isinstance(got[0], RuntimeError)


def test_an_inline_writer_commits_on_the_loop_unless_the_store_is_busy() -> None:
    """Commits run on the loop and are counted there; a batch the store cannot commit
    without waiting goes to the write thread, and the next one tries the loop again."""
    store = Recorder()

    async def body(writer: Writer, commit: Callable[[], Coroutine[Any, Any, Outcomes]]
                   ) -> None:
        loop_thread = threading.current_thread().name
        assert writer.holds_loop
        assert await commit() == [None, None]
        assert store.threads == [loop_thread] and writer.loop_commits == 1
        store.now_result = None  # the lock is taken
        assert await commit() == [None, None]
        assert store.threads[1] == loop_thread and store.threads[2].startswith("write")
        store.now_result = [None, None]
        assert await commit() == [None, None]
        assert writer.holds_loop and writer.loop_commits == 2
        store.fail = StoreError("damaged")
        with pytest.raises(StoreError, match="damaged"):
            await commit()

    _run(lambda pool: InlineWriter(store.apply_now, store.apply, pool), body)


def test_an_inline_writer_leaves_the_loop_while_its_commits_are_slow() -> None:
    """Inline commits slower than ``INLINE_LIMIT`` on average send the next ones to the
    write thread; after ``INLINE_RETRY`` of those the loop tries again."""
    store = Recorder()
    store.now_delay = InlineWriter.INLINE_LIMIT * 4

    async def body(writer: Writer, commit: Callable[[], Coroutine[Any, Any, Outcomes]]
                   ) -> None:
        while writer.holds_loop:
            await commit()
        on_loop = writer.loop_commits
        assert on_loop >= 1
        store.now_delay = 0.0
        # The commit that left the loop counts as the first of the ``INLINE_RETRY``.
        for _ in range(InlineWriter.INLINE_RETRY - 2):
            await commit()
            assert not writer.holds_loop
        await commit()
        assert writer.holds_loop
        assert writer.loop_commits == on_loop  # all of them on the write thread
        await commit()
        assert writer.loop_commits == on_loop + 1

    _run(lambda pool: InlineWriter(store.apply_now, store.apply, pool), body)


def test_an_async_writer_awaits_the_commit_and_leaves_the_rest_to_the_thread() -> None:
    """A batch the store commits asynchronously is counted as a loop commit; one it
    declines (``None``) goes to the write thread; a failure reaches the submitter."""
    store = Recorder()

    async def body(writer: Writer, commit: Callable[[], Coroutine[Any, Any, Outcomes]]
                   ) -> None:
        assert not writer.holds_loop
        assert await commit() == [None, None]
        assert writer.loop_commits == 1
        store.async_result = None
        assert await commit() == [None, None]
        assert writer.loop_commits == 1 and store.threads[-1].startswith("write")
        store.fail = StoreError("unreachable")
        with pytest.raises(StoreError, match="unreachable"):
            await commit()

    _run(lambda pool: AsyncWriter(store.apply_async, store.apply, pool), body)
