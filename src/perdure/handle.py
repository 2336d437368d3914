"""``Handle``: a view of one object from outside it, usable from any process."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from perdure.core.lifecycle import Status
from perdure.errors import (
    AgentCancelledError,
    AgentFailedError,
    AgentParkedError,
    ResultTimeoutError,
)
from perdure.follow import StreamEvent, Until, afollow, follow
from perdure.info import ObjectInfo

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["Handle", "ResultWait"]


class Handle:
    """A reference to one object. Works from any process sharing the store.

    A handle from ``App.start`` also says what the start did: ``created`` is true when
    this call created the object, false when the id was already taken by an object of
    the same agent (the handle then refers to that object). ``differs`` is ``None``
    unless that existing object was started with other arguments, labels, deadline or
    failure budget than asked: then it is one sentence saying what differs (the existing
    object is left as it is). Handles built any other way have ``created=False`` and
    ``differs=None``.
    """

    def __init__(self, app: App, object_id: str, *, created: bool = False,
                 differs: str | None = None) -> None:
        self.app = app
        self.object_id = object_id
        self.created = created
        self.differs = differs

    def __repr__(self) -> str:
        return f"Handle({self.object_id!r})"

    def info(self) -> ObjectInfo:
        """The object's current ``ObjectInfo``."""
        return self.app.get(self.object_id)

    def status(self) -> Status:
        """The object's current status."""
        return self.app.get(self.object_id, explain=False).status

    def result(self, timeout: float | None = None, *, poll: float = 0.05) -> Any:
        """Wait for the object to terminate and return its result.

        The store pushes the object's end (PostgreSQL ``NOTIFY``, SQLite's folder of
        sockets beside the file, the memory store in process), so this returns as soon as
        the terminal record is committed; it looks anyway every ``poll`` seconds, at
        least one. Where the store cannot push here it polls, every ``poll`` seconds at
        most. The result is read from the signed terminal record either way.

        Raises ``AgentFailedError`` (with the recorded error), ``AgentCancelledError``,
        ``AgentParkedError`` (a person must act), or ``ResultTimeoutError``.
        """
        pushed = threading.Event()
        wait = ResultWait(self, timeout, poll)
        wait.subscribe(pushed.set)
        try:
            while True:
                pushed.clear()  # before the read: an end committed after it sets it again
                done, value = wait.look()
                if done:
                    return value
                pushed.wait(value)
        finally:
            wait.release()

    def stream(self, after: int = 0, *, until: Until = "end", every: bool = False,
               timeout: float | None = None, poll: float = 0.05,
               stop: threading.Event | None = None, opened: bool = True
               ) -> Iterator[StreamEvent]:
        """Follow the object's memory as it is written, from any process: each model
        record and each event the agent emitted (``run.emit``) after seq ``after`` once,
        in order (a streamed call's ``model_chunks``
        batches, a ``model_recovered`` marker where a crash cut a stream short, each
        call's outcome), then the terminal record. ``every=True`` yields every record;
        ``until="reply"`` stops after the first call's outcome; ``stop`` ends it when
        set; past ``timeout`` seconds it raises ``ResultTimeoutError``. To go on after a
        break, pass the last event's ``seq`` as ``after``. Sealed values come back
        opened with the App's data keys (``Secret`` where secrets were; what it cannot
        open stays sealed); ``opened=False`` gives records as the store holds them.
        See ``perdure.follow``."""
        return follow(self.app, self.object_id, after, until=until, every=every,
                      timeout=timeout, poll=poll, stop=stop, opened=opened)

    def astream(self, after: int = 0, *, until: Until = "end", every: bool = False,
                timeout: float | None = None, poll: float = 0.05, opened: bool = True
                ) -> AsyncIterator[StreamEvent]:
        """``stream`` as an async iterator (``async for event in handle.astream()``)."""
        return afollow(self.app, self.object_id, after, until=until, every=every,
                       timeout=timeout, poll=poll, opened=opened)

    def pause(self) -> None:
        """See ``App.pause``."""
        self.app.pause(self.object_id)

    def resume(self) -> None:
        """See ``App.resume``."""
        self.app.resume(self.object_id)

    def cancel(self) -> None:
        """See ``App.cancel``."""
        self.app.cancel(self.object_id)

    def send(self, event: str, payload: Any = None, *, dedupe_key: str | None = None) -> bool:
        """See ``App.send``."""
        return self.app.send(self.object_id, event, payload, dedupe_key=dedupe_key)

    def query(self, name: str, *args: Any) -> Any:
        """See ``App.query``: the named query's answer over the object's memory."""
        return self.app.query(self.object_id, name, *args)

    def retry(self) -> None:
        """See ``App.retry``."""
        self.app.retry(self.object_id)

    def fork(self, at: int, *, new_id: str | None = None) -> Handle:
        """See ``App.fork``."""
        return self.app.fork(self.object_id, at=at, new_id=new_id)


class ResultWait:
    """One wait for an object's end, as ``Handle.result`` and ``AsyncHandle.result``
    (``perdure.aio``) wait: the push subscription, each look at the store, and how long
    to wait before the next one. The caller drives it: ``subscribe`` once with what a
    push does, then ``look`` until it is done, waiting between looks for the push or
    the seconds ``look`` gives, then ``release``. ``subscribe`` and ``look`` touch the
    store (an async caller runs them on its threads); ``release`` may come from any
    thread at any time, even before ``subscribe`` ran (which then subscribes nothing).
    """

    def __init__(self, handle: Handle, timeout: float | None, poll: float) -> None:
        self.handle = handle
        self.timeout = timeout
        self.poll = poll
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._delay = 0.005  # the polling step where nothing is pushed, doubled each look
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None
        self._released = False

    @property
    def pushed(self) -> bool:
        """Whether the store pushes the object's end here (else ``look`` polls)."""
        return self._stop is not None

    def subscribe(self, woken: Callable[[], None]) -> None:
        """Have the store call ``woken()`` (on the store's thread; it must be quick) when
        the object ends or parks; where the store cannot push, nothing (``look`` then
        polls)."""
        with self._lock:
            if self._released:
                return
            self._stop = self.handle.app.store.subscribe_results(
                lambda _oid: woken(), object_id=self.handle.object_id)

    def release(self) -> None:
        """Stop the subscription, once; a ``subscribe`` after it subscribes nothing."""
        with self._lock:
            self._released = True
            stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def look(self) -> tuple[bool, Any]:
        """Read the object once: ``(True, result)`` when it completed, else ``(False,
        seconds)`` to wait for a push before the next look. Raises ``AgentFailedError``,
        ``AgentCancelledError``, ``AgentParkedError``, ``ObjectNotFoundError`` or, past
        the deadline, ``ResultTimeoutError``."""
        app, object_id = self.handle.app, self.handle.object_id
        info = app.get(object_id, explain=False)  # ObjectNotFoundError
        if info.status is Status.COMPLETED:
            # From the signed terminal record, never from the row alone.
            return True, app.outcome(object_id).get("result")
        if info.status in (Status.FAILED, Status.CANCELLED):
            self._raise_terminal(info.status)
        if info.status is Status.PARKED:
            raise AgentParkedError(
                f"object {object_id!r} is parked: {info.note}; fix the cause and "
                f"run `perdure resume {object_id}`"
            )
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ResultTimeoutError(
                f"object {object_id!r} is still {info.status} after {self.timeout}s; "
                "it keeps running"
            )
        if self.pushed:
            wait = max(self.poll, 1.0)  # a slow look all the same, should a push be lost
        else:
            wait = min(self._delay, self.poll)
            self._delay *= 2
        if self.deadline is not None:
            wait = max(0.0, min(wait, self.deadline - time.monotonic()))
        return False, wait

    def _raise_terminal(self, status: str) -> None:
        object_id = self.handle.object_id
        body = self.handle.app.outcome(object_id)
        if status == Status.CANCELLED:
            raise AgentCancelledError(f"object {object_id!r} was cancelled")
        error = body.get("error") or {}
        raise AgentFailedError(
            object_id,
            str(error.get("type", "unknown")),
            str(error.get("message", body.get("reason", ""))),
        )
