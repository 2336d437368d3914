"""Awaitable callers: ``app.aio``, for asyncio programs (FastAPI, aiohttp, ...).

``App``'s caller methods are synchronous: they talk to the store with its driver. Called
from a coroutine they block the event loop. ``app.aio`` is an ``AsyncApp`` bound to the
App, with an awaitable form of each: ``await app.aio.start(agent, ...)`` gives an
``AsyncHandle``, whose ``await handle.result(timeout=30)`` waits for the object's end::

    @api.post("/reports")
    async def report(topic: str) -> dict:
        handle = await app.aio.options(object_id=f"r-{topic}").start(research, topic)
        return {"result": await handle.result(timeout=60)}

Each method runs the synchronous method of the same name, the same code, on this
client's own threads (a bounded pool, ``threads`` of them, 8 by default; not the loop's
default executor, which the program may need for itself), and awaits it there. Waiting
holds no thread: ``AsyncHandle.result`` subscribes to the store's pushed end of the
object (``Store.subscribe_results``), as ``Handle.result`` does, and the push wakes the
awaiting task through ``loop.call_soon_threadsafe``; a look at the store runs on the
pool only when pushed, and every ``poll`` seconds (at least one) should a push be lost.
Where the store cannot push, it polls as ``Handle.result`` does. Many tasks can wait at
once on one loop with a handful of threads.

Cancelling an awaiting task (``asyncio.wait_for``'s timeout, ``task.cancel()``) ends the
wait only: the object runs on, and the subscription is let go. An operation the pool
already began (a ``send``, say) is not undone by cancelling its await.

``App.close()`` stops the client's threads too (they start again if the App is used
again); ``await app.aio.aclose()`` does it off the loop.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import functools
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from perdure.core.approvals import PendingApproval
from perdure.core.chain import VerifyReport
from perdure.core.flow import Queue
from perdure.core.lifecycle import Status
from perdure.core.questions import Question
from perdure.core.records import Record
from perdure.core.usage import UsageTotals
from perdure.errors import ConfigurationError
from perdure.follow import StreamEvent, Until
from perdure.handle import Handle, ResultWait
from perdure.info import ObjectInfo
from perdure.starting import Starter
from perdure.updates import await_reply, send_update

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["THREADS", "AsyncApp", "AsyncHandle", "AsyncStarter"]

THREADS = 8
"""How many threads an ``AsyncApp`` runs store work on, by default (a PostgreSQL store's
connection pool holds 8 by default too)."""

P = ParamSpec("P")
T = TypeVar("T")


class AsyncApp:
    """The awaitable caller side of an ``App`` (``app.aio``): start objects, wait for
    their results, send events, steer and inspect them without blocking the event loop.

    Each method is the ``App`` method of the same name, run on this client's own pool
    of ``threads`` threads (see ``perdure.aio``).
    """

    def __init__(self, app: App, *, threads: int = THREADS) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigurationError(f"threads is a whole number, at least 1, not {threads!r}")
        self.app = app
        self.threads = threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ours: set[int] = set()  # the idents of the pool's threads

    def __repr__(self) -> str:
        return f"AsyncApp({self.app.store_url!r})"

    # -- the pool ---------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="perdure-aio",
                                                initializer=self._began)
            return self._pool

    def _began(self) -> None:
        self._ours.add(threading.get_ident())

    async def to_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` run on this client's threads (as
        ``asyncio.to_thread``, with the caller's context variables): any other
        synchronous call of the App, off the loop."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor(), call)

    def _later(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on this client's threads without waiting for it (at once here if
        they were stopped)."""
        try:
            self._executor().submit(fn)
        except RuntimeError:  # stopped meanwhile (App.close)
            fn()

    def close(self) -> None:
        """Stop this client's threads once the work given them is done (``App.close``
        calls it; they start again on the next call). Called on one of them, it does not
        wait for them."""
        with self._lock:
            pool, self._pool = self._pool, None
            ours, self._ours = self._ours, set()
        if pool is not None:
            pool.shutdown(wait=threading.get_ident() not in ours)

    async def aclose(self) -> None:
        """``App.close()`` off the event loop: the store, the seen-heads file and this
        client's threads."""
        await asyncio.to_thread(self.app.close)

    # -- starting ---------------------------------------------------------------------

    async def start(self, agent: Callable[..., Any] | str, /, *args: Any,
                    **kwargs: Any) -> AsyncHandle:
        """See ``App.start``: create an object running ``agent(*args, **kwargs)``."""
        return AsyncHandle(self, await self.to_thread(self.app.start, agent, *args, **kwargs))

    def options(self, *, object_id: str | None = None, deadline: float | None = None,
                max_failures: int | None = None, labels: Mapping[str, str] | None = None,
                budget: Any = None, queue: str | Queue | None = None, key: str | None = None,
                priority: int | None = None, dedupe_key: str | None = None,
                start_at: Any = None, delay: Any = None, debounce_key: str | None = None,
                debounce: Any = None) -> AsyncStarter:
        """See ``App.options``: ``await app.aio.options(object_id=...).start(agent, ...)``
        (checked here, before anything is stored)."""
        return AsyncStarter(self, self.app.options(
            object_id=object_id, deadline=deadline, max_failures=max_failures,
            labels=labels, budget=budget, queue=queue, key=key, priority=priority,
            dedupe_key=dedupe_key, start_at=start_at, delay=delay,
            debounce_key=debounce_key, debounce=debounce))

    async def handle(self, object_id: str) -> AsyncHandle:
        """See ``App.handle``; ``ObjectNotFoundError`` if there is no such object."""
        return AsyncHandle(self, await self.to_thread(self.app.handle, object_id))

    # -- inspecting -------------------------------------------------------------------

    async def get(self, object_id: str, *, explain: bool = True) -> ObjectInfo:
        """See ``App.get``."""
        return await self.to_thread(self.app.get, object_id, explain=explain)

    async def list(self, *, status: str | None = None, phase: str | None = None,
                   agent: str | None = None, parent: str | None = None,
                   limit: int = 100) -> builtins.list[ObjectInfo]:
        """See ``App.list``."""
        return await self.to_thread(self.app.list, status=status, phase=phase, agent=agent,
                                    parent=parent, limit=limit)

    async def history(self, object_id: str, *, after: int = 0, opened: bool = False
                      ) -> builtins.list[Record]:
        """See ``App.history``."""
        return await self.to_thread(self.app.history, object_id, after=after, opened=opened)

    async def usage(self, object_id: str, *, lineage: bool = False) -> UsageTotals:
        """See ``App.usage``."""
        return await self.to_thread(self.app.usage, object_id, lineage=lineage)

    async def outcome(self, object_id: str) -> dict[str, Any]:
        """See ``App.outcome``."""
        return await self.to_thread(self.app.outcome, object_id)

    async def result_of(self, object_id: str) -> Any:
        """See ``App.result_of``: a completed object's result, without waiting."""
        return await self.to_thread(self.app.result_of, object_id)

    async def verify(self, object_id: str, *,
                     anchors: Mapping[str, tuple[int, str]] | None = None) -> VerifyReport:
        """See ``App.verify``."""
        return await self.to_thread(self.app.verify, object_id, anchors=anchors)

    async def query(self, object_id: str, name: str, /, *args: Any) -> Any:
        """See ``App.query``: the answer of query ``name`` over the object's memory."""
        return await self.to_thread(self.app.query, object_id, name, *args)

    async def update(self, object_id: str, name: str, /, *args: Any,
                     timeout: float | None = 30.0) -> Any:
        """See ``App.update``: the reply of update ``name``, waited for on the store's
        pushes without holding a thread."""
        sent = await self.to_thread(send_update, self.app, object_id, name, args)
        return await await_reply(self.app, object_id, sent, timeout)

    async def questions(self, *, agent: str | None = None, limit: int = 100
                        ) -> builtins.list[Question]:
        """See ``App.questions``; answer one with ``send(question.object_id,
        question.event, payload)``."""
        return await self.to_thread(self.app.questions, agent=agent, limit=limit)

    # -- steering ---------------------------------------------------------------------

    async def send(self, object_id: str, event: str, payload: Any = None, *,
                   dedupe_key: str | None = None) -> bool:
        """See ``App.send``."""
        return await self.to_thread(self.app.send, object_id, event, payload,
                                    dedupe_key=dedupe_key)

    async def refine(self, object_id: str, **changes: Any) -> None:
        """See ``App.refine``."""
        await self.to_thread(self.app.refine, object_id, **changes)

    async def pause(self, object_id: str) -> ObjectInfo:
        """See ``App.pause``."""
        return await self.to_thread(self.app.pause, object_id)

    async def resume(self, object_id: str) -> ObjectInfo:
        """See ``App.resume``."""
        return await self.to_thread(self.app.resume, object_id)

    async def cancel(self, object_id: str) -> ObjectInfo:
        """See ``App.cancel``."""
        return await self.to_thread(self.app.cancel, object_id)

    async def retry(self, object_id: str) -> ObjectInfo:
        """See ``App.retry``: a parked object runs again."""
        return await self.to_thread(self.app.retry, object_id)

    async def fork(self, object_id: str, *, at: int, new_id: str | None = None
                   ) -> AsyncHandle:
        """See ``App.fork``."""
        return AsyncHandle(self, await self.to_thread(self.app.fork, object_id, at=at,
                                                      new_id=new_id))

    # -- approvals --------------------------------------------------------------------

    async def approvals(self) -> builtins.list[PendingApproval]:
        """See ``App.approvals``."""
        return await self.to_thread(self.app.approvals)

    async def approve(self, object_id: str, proposal_id: str, *,
                      edit: Mapping[str, Any] | None = None) -> PendingApproval:
        """See ``App.approve``."""
        return await self.to_thread(self.app.approve, object_id, proposal_id, edit=edit)

    async def reject(self, object_id: str, proposal_id: str, *, reason: str
                     ) -> PendingApproval:
        """See ``App.reject``."""
        return await self.to_thread(self.app.reject, object_id, proposal_id, reason=reason)


class AsyncStarter:
    """``Starter`` (``App.options``) with an awaitable ``start``; ``app.aio.options(...)``
    makes one."""

    def __init__(self, aio: AsyncApp, starter: Starter) -> None:
        self.aio = aio
        self.starter = starter

    def __repr__(self) -> str:
        return f"AsyncStarter({self.starter!r})"

    async def start(self, agent: Callable[..., Any] | str, /, *args: Any,
                    **kwargs: Any) -> AsyncHandle:
        """See ``Starter.start``: every argument goes to the agent."""
        return AsyncHandle(self.aio, await self.aio.to_thread(self.starter.start, agent,
                                                              *args, **kwargs))


class AsyncHandle:
    """A ``Handle`` with awaitable methods: one object, from any process sharing the
    store. ``created`` and ``differs`` say what the start did, as ``Handle``'s do;
    ``handle`` is the synchronous ``Handle`` of the same object."""

    def __init__(self, aio: AsyncApp, handle: Handle) -> None:
        self.aio = aio
        self.handle = handle

    def __repr__(self) -> str:
        return f"AsyncHandle({self.object_id!r})"

    @property
    def object_id(self) -> str:
        """The object's id."""
        return self.handle.object_id

    @property
    def created(self) -> bool:
        """Whether the start that gave this handle created the object."""
        return self.handle.created

    @property
    def differs(self) -> str | None:
        """How the existing object was started otherwise than asked (see ``Handle``)."""
        return self.handle.differs

    async def info(self) -> ObjectInfo:
        """See ``Handle.info``."""
        return await self.aio.to_thread(self.handle.info)

    async def status(self) -> Status:
        """See ``Handle.status``."""
        return await self.aio.to_thread(self.handle.status)

    async def result(self, timeout: float | None = None, *, poll: float = 0.05) -> Any:
        """Wait for the object to terminate and return its result, as ``Handle.result``
        (the same errors, ``ResultTimeoutError`` past ``timeout`` seconds) without
        blocking the loop or holding a thread while it waits: the store's push of the
        end wakes this task. Cancelling the task ends the wait, not the object."""
        if type(self.handle).result is not Handle.result:
            # A handle that waits in its own way (the testing environment's, which skips
            # its clock while it waits): its wait, on a thread.
            return await self.aio.to_thread(self.handle.result, timeout)
        loop = asyncio.get_running_loop()
        pushed = asyncio.Event()

        def woken() -> None:  # on the store's thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(pushed.set)

        wait = ResultWait(self.handle, timeout, poll)
        try:
            await self.aio.to_thread(wait.subscribe, woken)
            while True:
                pushed.clear()  # before the read: an end committed after it sets it again
                done, value = await self.aio.to_thread(wait.look)
                if done:
                    return value
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(value):
                        await pushed.wait()
        finally:
            # Let go on the pool, not awaited: a cancelled task cannot wait for it, and a
            # subscribe the pool is still running is let go as it ends.
            self.aio._later(wait.release)

    def stream(self, after: int = 0, *, until: Until = "end", every: bool = False,
               timeout: float | None = None, poll: float = 0.05, opened: bool = True
               ) -> AsyncIterator[StreamEvent]:
        """See ``Handle.astream``: ``async for event in handle.stream()``."""
        return self.handle.astream(after, until=until, every=every, timeout=timeout,
                                   poll=poll, opened=opened)

    async def send(self, event: str, payload: Any = None, *,
                   dedupe_key: str | None = None) -> bool:
        """See ``App.send``."""
        return await self.aio.to_thread(self.handle.send, event, payload,
                                        dedupe_key=dedupe_key)

    async def pause(self) -> None:
        """See ``App.pause``."""
        await self.aio.to_thread(self.handle.pause)

    async def resume(self) -> None:
        """See ``App.resume``."""
        await self.aio.to_thread(self.handle.resume)

    async def cancel(self) -> None:
        """See ``App.cancel``."""
        await self.aio.to_thread(self.handle.cancel)

    async def query(self, name: str, *args: Any) -> Any:
        """See ``App.query``."""
        return await self.aio.to_thread(self.handle.query, name, *args)

    async def retry(self) -> None:
        """See ``App.retry``."""
        await self.aio.to_thread(self.handle.retry)

    async def fork(self, at: int, *, new_id: str | None = None) -> AsyncHandle:
        """See ``App.fork``."""
        return AsyncHandle(self.aio, await self.aio.to_thread(self.handle.fork, at,
                                                              new_id=new_id))
