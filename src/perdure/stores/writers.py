"""Writers: the ways a node's event loop gets its commits made, for a store to opt into.

A node's committer (``perdure.engine.journal.Committer``) gathers the appends of many
objects and hands each batch to its store's ``Writer`` (``Store.writer``). A step is
one durable commit, so this is the hottest path of the project; where the commit runs
is chosen per backend, because what is cheap depends on what a commit costs:

- ``ThreadWriter``: every commit on the node's write thread (``apply``). The writer of a
  store with nothing better, and the fallback of the two others.
- ``InlineWriter``: a commit short enough to make on the event loop itself
  (``apply_now``: SQLite, a local file), falling back to the write thread while someone
  else holds the store's write lock, or while inline commits are slow.
- ``AsyncWriter``: a commit awaited on the event loop (``apply_async``: PostgreSQL, a
  network round trip on an asynchronous connection of the loop's own), the loop running
  other steps meanwhile; a batch it declines goes to the write thread.

Every writer reports through ``done`` on the event loop's thread, exactly once per
batch; the committer sends one batch at a time. No task per append and no
intermediate future: what is paid here is paid on every step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from perdure.core.chain import CommitSeal
from perdure.stores.base import Append, Done, Outcomes

__all__ = ["AsyncWriter", "InlineWriter", "ThreadWriter"]

#: ``Writes.apply``: a commit on the calling thread, waiting for locks as need be.
Apply = Callable[[Sequence[Append], float, Sequence[CommitSeal]], Outcomes]
#: A commit on the calling thread if it needs no waiting; ``None`` (nothing written) if
#: it would have to wait for a lock.
ApplyNow = Callable[[Sequence[Append], float, Sequence[CommitSeal]], Outcomes | None]
#: A commit awaited on the running loop; ``None`` (nothing written) for a batch it
#: leaves to ``apply`` on the write thread.
ApplyAsync = Callable[[Sequence[Append], float, Sequence[CommitSeal]],
                      Awaitable[Outcomes | None]]


class ThreadWriter:
    """Every commit on the node's write thread, settled on the loop when done."""

    holds_loop = False
    loop_commits = 0

    def __init__(self, apply: Apply, executor: concurrent.futures.Executor) -> None:
        self._apply = apply
        self._executor = executor

    def write(self, loop: asyncio.AbstractEventLoop, ops: Sequence[Append], now: float,
              seals: Sequence[CommitSeal], done: Done) -> None:
        """Hand the batch to the write thread, which settles it on the loop when done."""
        apply = self._apply

        def work() -> None:
            try:
                results = apply(ops, now, seals)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised there
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(done, None, exc)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, results, None)

        try:
            self._executor.submit(work)
        except RuntimeError as exc:  # the executor shut down: the node is stopping
            done(None, exc)


class InlineWriter:
    """Commits on the event loop itself when the store can without waiting.

    A commit to a local file is short (a few hundred µs with its fsync on a fast disk),
    and handing it to the write thread costs more: the hop there and back, and the GIL,
    which the write thread must win back from a busy loop after each statement and only
    gets when the loop's turn ends. So the loop commits itself (``apply_now``), at the
    end of its turn, so that every append submitted during the turn shares the commit.

    A refused inline commit (the lock is taken: the write thread is claiming, or another
    process writes) goes to the write thread, which waits for the lock; a refusal costs
    microseconds, so the next batch tries inline again. If inline commits grow slow
    (their moving average passes ``INLINE_LIMIT``, as on a network disk), commits go to
    the write thread, and the loop tries again after ``INLINE_RETRY`` of them.
    """

    INLINE_LIMIT = 0.005  # seconds: slower inline commits (moving average) go to the thread
    INLINE_RETRY = 64  # commits on the write thread before trying inline ones again

    def __init__(self, apply_now: ApplyNow, apply: Apply,
                 executor: concurrent.futures.Executor) -> None:
        self._apply_now = apply_now
        self._thread = ThreadWriter(apply, executor)
        self.holds_loop = True  # commit on the loop (``apply_now``), not the thread
        self.loop_commits = 0
        self._inline_cost = 0.0  # moving average of inline commit times, seconds
        self._thread_commits = 0  # since the writer last left inline commits
        self._done: Done | None = None  # of the batch on the write thread

    def write(self, loop: asyncio.AbstractEventLoop, ops: Sequence[Append], now: float,
              seals: Sequence[CommitSeal], done: Done) -> None:
        """Commit on the loop if the store can without waiting, else on the write thread."""
        if self.holds_loop:
            began = time.perf_counter()
            try:
                results = self._apply_now(ops, now, seals)
            except Exception as exc:  # noqa: BLE001 - each submitter gets it, as from the thread
                done(None, exc)
                return
            except BaseException as exc:
                done(None, exc)
                raise
            if results is not None:
                self.loop_commits += 1
                self._inline_cost = 0.8 * self._inline_cost + 0.2 * (time.perf_counter() - began)
                if self._inline_cost > self.INLINE_LIMIT:
                    self.holds_loop = False
                    self._thread_commits = 0
                self._committed()
                done(results, None)
                return
            # The lock is taken: this batch waits on the write thread.
        self._done = done
        self._thread.write(loop, ops, now, seals, self._from_thread)

    def _from_thread(self, results: Outcomes | None, error: BaseException | None) -> None:
        done, self._done = self._done, None
        assert done is not None, "a batch on the write thread has its submitter"
        if results is not None:
            self._committed()
        done(results, error)

    def _committed(self) -> None:
        """Count a commit made while inline commits are off; turn them on again after
        ``INLINE_RETRY`` of them."""
        if not self.holds_loop:
            self._thread_commits += 1
            if self._thread_commits >= self.INLINE_RETRY:
                self.holds_loop, self._inline_cost = True, self.INLINE_LIMIT / 2


class AsyncWriter:
    """Commits awaited on the event loop, through the store's asynchronous driver.

    The loop runs the next cohort's steps while the server works, with no hop to a
    thread. Batches the store declines (``None``: for PostgreSQL an append that signals,
    several appends where one consumes events, a conflict) go to the write thread.
    """

    holds_loop = False

    def __init__(self, apply_async: ApplyAsync, apply: Apply,
                 executor: concurrent.futures.Executor) -> None:
        self._apply_async = apply_async
        self._thread = ThreadWriter(apply, executor)
        self.loop_commits = 0
        self._task: asyncio.Task[None] | None = None  # the commit in flight

    def write(self, loop: asyncio.AbstractEventLoop, ops: Sequence[Append], now: float,
              seals: Sequence[CommitSeal], done: Done) -> None:
        """Start awaiting the commit on ``loop``."""
        # The task is kept: the loop holds only weak references to tasks.
        self._task = loop.create_task(self._commit(loop, ops, now, seals, done))

    async def _commit(self, loop: asyncio.AbstractEventLoop, ops: Sequence[Append],
                      now: float, seals: Sequence[CommitSeal], done: Done) -> None:
        """Await the store's asynchronous commit; a batch it leaves goes to the thread."""
        try:
            results = await self._apply_async(ops, now, seals)
        except Exception as exc:  # noqa: BLE001 - each submitter gets it, as from the thread
            done(None, exc)
            return
        except BaseException as exc:  # cancelled as the loop closes: nobody is left waiting
            done(None, exc)
            raise
        if results is None:
            self._thread.write(loop, ops, now, seals, done)
        else:
            self.loop_commits += 1
            done(results, None)
