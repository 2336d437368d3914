"""The node's code threads: where plain ``def`` steps and agents run, off the event loop.

A plain ``def`` step never runs on the event loop (it may block for as long as it likes),
so every such step is a hop to a thread and back, on every step: the shortest hop pays.
``CodeThreads`` is a thread pool cut down to that hop. A job is one tuple put on one
queue; the thread that takes it runs the function and hands the outcome to the loop with
one ``call_soon_threadsafe``, which settles the loop's own future. There is no
``concurrent.futures.Future`` in between (its lock and condition, the callbacks that copy
its state onto an asyncio future), and no semaphore: a thread about to be idle says so
before it hands back the outcome, so the loop's next job finds that warm thread instead
of starting another.

Threads start as jobs need them, up to ``max_threads``; past that, jobs wait in the
queue for a thread to be free, as in a pool. A thread is started by a small starter
thread, not by the loop: ``Thread.start`` waits until the new thread runs, which on a
busy machine can hold the loop for a tenth of a second. The threads are not daemons: the
interpreter waits at exit for code still running on them (an abandoned step), unless the
process exits at once (``perdure worker`` does); idle ones are told to stop at
``shutdown`` or when the interpreter exits.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CodeThreads"]

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]

#: Queues of live pools: told to stop when the interpreter exits (before it joins threads).
_LIVE: weakref.WeakSet[CodeThreads] = weakref.WeakSet()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: the job's outcome onto its future (unless its awaiter gave up)."""
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class CodeThreads:
    """Threads that run plain functions for one event loop's coroutines (see the module)."""

    def __init__(self, max_threads: int, name: str) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max = max_threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads done with a job and not yet given another (under _lock)
        self._closed = False
        self._starts: queue.SimpleQueue[threading.Thread | None] | None = None
        _LIVE.add(self)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on a code thread; a future of the running loop that gets its outcome.

        Cancelling the future does not stop the function (nothing can stop a thread): its
        outcome is dropped. Raises ``RuntimeError`` after ``shutdown``.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run code after the code threads shut down")
            if self._idle:
                self._idle -= 1
                start = False
            else:
                start = len(self._threads) < self._max
            self._jobs.put((loop, future, fn, args))
            if start:
                thread = threading.Thread(target=self._work,
                                          name=f"{self._name}_{len(self._threads)}")
                self._threads.append(thread)
                if self._starts is None:
                    # The starter is a bare thread: starting one does not wait for it.
                    self._starts = queue.SimpleQueue()
                    _thread.start_new_thread(_starter, (self._starts,))
                self._starts.put(thread)
        return future

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            job = jobs.get()
            if job is None:
                return
            loop, future, fn, args = job
            del job
            error: BaseException | None = None
            result: Any = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the awaiter gets it, as from a pool
                error = exc
            # Idle before the outcome reaches the loop: the job it starts next finds this
            # thread, warm, instead of starting another.
            with lock:
                self._idle += 1
            try:  # noqa: SIM105 - the hot path: no context manager per job
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed meanwhile: nobody waits for it
                pass
            del loop, future, fn, args, result, error

    def shutdown(self) -> None:
        """Run nothing more: jobs not started are cancelled; idle threads stop. A function
        still running finishes on its thread (nothing waits for it here)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = len(self._threads)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                loop, future = job[0], job[1]
                with contextlib.suppress(RuntimeError):  # the loop closed
                    loop.call_soon_threadsafe(future.cancel)
        for _ in range(threads):
            self._jobs.put(None)
        with self._lock:
            if self._starts is not None:
                self._starts.put(None)


def _starter(starts: queue.SimpleQueue[threading.Thread | None]) -> None:
    """Start the threads put on ``starts`` until told to stop (``None``)."""
    while (thread := starts.get()) is not None:
        thread.start()


def _stop_all() -> None:
    """At interpreter exit, before it joins the threads: stop every pool's idle threads."""
    for pool in list(_LIVE):
        pool.shutdown()


# Registered with the threading module's own exit hooks (as ``concurrent.futures`` does),
# which run before non-daemon threads are joined; ``atexit`` would run after.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_stop_all)
