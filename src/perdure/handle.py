"""``Handle``: a view of one object from outside it, usable from any process."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
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

__all__ = ["Handle"]


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
        deadline = None if timeout is None else time.monotonic() + timeout
        pushed = threading.Event()
        stop = self.app.store.subscribe_results(lambda _oid: pushed.set(),
                                                object_id=self.object_id)
        delay = 0.005
        try:
            while True:
                pushed.clear()  # before the read: an end committed after it sets it again
                info = self.app.get(self.object_id, explain=False)  # ObjectNotFoundError
                if info.status is Status.COMPLETED:
                    # From the signed terminal record, never from the row alone.
                    return self.app.outcome(self.object_id).get("result")
                if info.status in (Status.FAILED, Status.CANCELLED):
                    return self._raise_terminal(info.status)
                if info.status is Status.PARKED:
                    raise AgentParkedError(
                        f"object {self.object_id!r} is parked: {info.note}; fix the cause and "
                        f"run `perdure resume {self.object_id}`"
                    )
                if deadline is not None and time.monotonic() >= deadline:
                    raise ResultTimeoutError(
                        f"object {self.object_id!r} is still {info.status} after {timeout}s; "
                        "it keeps running"
                    )
                wait = max(poll, 1.0) if stop is not None else min(delay, poll)
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if stop is not None:
                    pushed.wait(wait)
                else:
                    time.sleep(wait)
                    delay *= 2
        finally:
            if stop is not None:
                stop()

    def _raise_terminal(self, status: str) -> Any:
        body = self.app.outcome(self.object_id)
        if status == Status.CANCELLED:
            raise AgentCancelledError(f"object {self.object_id!r} was cancelled")
        error = body.get("error") or {}
        raise AgentFailedError(
            self.object_id,
            str(error.get("type", "unknown")),
            str(error.get("message", body.get("reason", ""))),
        )

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
