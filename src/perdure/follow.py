"""Following an object's memory from outside it: a model call's stream as it arrives.

``Handle.stream`` (and ``Handle.astream``) read the object's memory through
``App.history(..., after=seq)`` each time the store pushes a change to it (SQLite and the
memory store push every commit; PostgreSQL pushes the end, and between the follower
polls every ``poll`` seconds), and yield one ``StreamEvent`` per record, in order:
each record once, so each journaled chunk once. A follower that starts mid-stream first
gets the batches already journaled, then the new ones; one that reconnects passes the
``seq`` of the last event it saw as ``after`` and goes on without a duplicate. A stream
cut short by a crash shows as its batches, then the ``model_recovered`` record saying
what was done with them (``continue``: the next attempt's chunks go on from that text;
``restart``: they start again; ``surface``: none follow), then the next attempt.

Chunks a killed worker had not yet journaled are in no record: nobody sees them, and a
continued call goes on from what memory holds, so the text a follower collects is the
text of the reply (on Anthropic the reply joins the salvage with its trailing
whitespace cut, as prefill requires).

Events the agent emits (``run.emit(name, data)``) come in the same stream, in memory
order among the model records: each is one ``emitted`` record at its own position,
written once (a replay after a crash finds it and writes nothing), so a follower gets
each emitted event exactly once and in order, before and after a crash alike. Pure
reads: nothing here writes to memory.

With ``opened=True`` (``Handle.stream``'s default) records are opened with the App's
data keys (``perdure.keys.opener``): an event's ``data`` holds ``Secret`` objects where the
agent emitted secrets, and the whole value of an agent that encrypts all; what this App
cannot open stays sealed. ``perdure tail`` follows with ``opened=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from perdure.core.records import Kind, Record
from perdure.core.sealing import SEALED
from perdure.errors import ResultTimeoutError

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["FOLLOWED_KINDS", "MODEL_KINDS", "StreamEvent", "Until", "afollow", "follow"]

Until = Literal["end", "reply"]
"""When a follower stops: when the object ends (``end``), or when a model call has its
reply or gave up (``reply``); always when the object ends."""

MODEL_KINDS = frozenset({Kind.MODEL_CALL.value, Kind.MODEL_FAILED.value,
                         Kind.MODEL_CHUNKS.value, Kind.MODEL_RECOVERED.value})
"""The record kinds of model calls."""

FOLLOWED_KINDS = MODEL_KINDS | {Kind.EMITTED.value}
"""The record kinds a follower yields by default (with the terminal record): model
calls and emitted events."""

_TERMINATED = Kind.TERMINATED.value
_EMITTED = Kind.EMITTED.value


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One record of the followed object, as a follower sees it.

    ``seq`` is the record's position in memory (pass it as ``after`` to go on after
    it); ``kind`` the record's kind. For a model record ``pos``, ``name`` and
    ``attempt`` name the call and its attempt; a ``model_chunks`` batch has its chunks'
    JSON forms in ``chunks`` and their text joined in ``text``; a ``model_recovered``
    record has ``recovery`` (``continue``, ``restart`` or ``surface``). An ``emitted``
    event has its ``name``, ``pos`` and ``data`` (``run.emit(name, data)``). ``record``
    is the whole record.
    """

    seq: int
    kind: str
    record: Record = field(repr=False)
    pos: int | str | None = None
    name: str | None = None
    attempt: int | None = None
    text: str = ""
    chunks: tuple[dict[str, Any], ...] = ()
    recovery: str | None = None
    data: Any = None

    @property
    def ended(self) -> bool:
        """True for the object's terminal record: nothing follows it."""
        return self.kind == _TERMINATED

    @property
    def completes(self) -> bool:
        """True for a model call's outcome: its reply, or its final failed attempt."""
        return self.kind == Kind.MODEL_CALL.value or (
            self.kind == Kind.MODEL_FAILED.value and bool(self.record.body.get("final")))


def event_of(record: Record) -> StreamEvent:
    """``record`` as a ``StreamEvent``."""
    body = record.body
    if record.kind == _EMITTED:
        name = body.get("name")
        return StreamEvent(record.seq, record.kind, record, body.get("pos"),
                           name if isinstance(name, str) else None, data=body.get("data"))
    if record.kind not in MODEL_KINDS:
        return StreamEvent(record.seq, record.kind, record)
    attempt = body.get("attempt")
    event = StreamEvent(record.seq, record.kind, record, body.get("pos"),
                        body.get("name"), int(attempt) if attempt is not None else None)
    if record.kind == Kind.MODEL_CHUNKS.value:
        chunks = tuple(dict(c) for c in body.get("chunks", ()))
        text = "".join("<sealed>" if SEALED in c else str(c.get("text") or "")
                       for c in chunks)
        return StreamEvent(event.seq, event.kind, record, event.pos, event.name,
                           event.attempt, text, chunks)
    if record.kind == Kind.MODEL_RECOVERED.value:
        return StreamEvent(event.seq, event.kind, record, event.pos, event.name,
                           event.attempt, recovery=str(body.get("recovery")))
    return event


class _Cursor:
    """Where a follower is, and whether it has reached its end."""

    def __init__(self, after: int, until: Until, every: bool,
                 timeout: float | None) -> None:
        self.after = after
        self.until = until
        self.every = every
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.done = False

    def take(self, records: list[Record]) -> list[StreamEvent]:
        """The events of ``records`` this follower yields, in order (notes its end)."""
        events = []
        for record in records:
            if self.done:
                break
            self.after = record.seq
            event = event_of(record)
            if self.every or event.kind in FOLLOWED_KINDS or event.ended:
                events.append(event)
            if event.ended or (self.until == "reply" and event.completes):
                self.done = True
        return events

    def wait(self, object_id: str, poll: float) -> float:
        """How long to sleep before the next poll; ``ResultTimeoutError`` past the
        deadline."""
        if self.deadline is None:
            return poll
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeoutError(
                f"object {object_id!r} is still running after its follower's timeout; "
                f"follow again with after={self.after}")
        return min(poll, left)


def _reader(app: App, opened: bool) -> Callable[[list[Record]], list[Record]]:
    if not opened:
        return lambda records: records

    return app.client.opener(app.open_sealed).records


def _watch(app: App, object_id: str, callback: Callable[[str], None]
           ) -> tuple[Callable[[], None] | None, bool]:
    """Subscribe ``callback`` to pushes about ``object_id``: its changes where the store
    pushes them, else its end; the function that stops it (``None``: nothing is pushed),
    and whether changes are."""
    stop = app.store.subscribe_results(callback, object_id=object_id, changes=True)
    if stop is not None:
        return stop, True
    return app.store.subscribe_results(callback, object_id=object_id), False


def follow(app: App, object_id: str, after: int = 0, *, until: Until = "end",
           every: bool = False, timeout: float | None = None, poll: float = 0.05,
           stop: threading.Event | None = None, opened: bool = False
           ) -> Iterator[StreamEvent]:
    """Yield the object's records after ``after`` as ``StreamEvent``s while they are
    written: its model records, its emitted events and its terminal record, or every
    record with
    ``every=True``. Ends after the terminal record (or, with ``until="reply"``, after a
    call's outcome), when ``stop`` is set, or raises ``ResultTimeoutError`` once
    ``timeout`` seconds have gone by. ``ObjectNotFoundError`` if there is no such
    object. ``opened``: sealed values opened with the App's data keys (see the
    module)."""
    cursor = _Cursor(after, until, every, timeout)
    read = _reader(app, opened)
    pushed = threading.Event()
    unsubscribe, changes = _watch(app, object_id, lambda _oid: pushed.set())
    every_s = max(poll, 1.0) if changes else poll  # with changes pushed: a safety look
    try:
        while True:
            pushed.clear()  # before the read: a commit after it sets it again
            yield from cursor.take(read(app.history(object_id, after=cursor.after)))
            if cursor.done or (stop is not None and stop.is_set()):
                return
            pause = cursor.wait(object_id, every_s)
            if stop is None:
                pushed.wait(pause)
                continue
            until_s = time.monotonic() + pause
            while not pushed.is_set() and not stop.is_set():  # ``stop`` seen within 0.1 s
                left = until_s - time.monotonic()
                if left <= 0:
                    break
                pushed.wait(min(left, 0.1))
    finally:
        if unsubscribe is not None:
            unsubscribe()


async def afollow(app: App, object_id: str, after: int = 0, *, until: Until = "end",
                  every: bool = False, timeout: float | None = None,
                  poll: float = 0.05, opened: bool = False) -> AsyncIterator[StreamEvent]:
    """``follow`` as an async iterator: memory is read on the App's client threads
    (``app.aio``), so the event loop goes on meanwhile."""
    cursor = _Cursor(after, until, every, timeout)
    read = _reader(app, opened)
    loop = asyncio.get_running_loop()
    pushed = asyncio.Event()

    def heard(_oid: str) -> None:
        loop.call_soon_threadsafe(pushed.set)

    def batch() -> list[Record]:
        return read(app.history(object_id, after=cursor.after))

    unsubscribe, changes = await app.aio.to_thread(_watch, app, object_id, heard)
    every_s = max(poll, 1.0) if changes else poll  # with changes pushed: a safety look
    try:
        while True:
            pushed.clear()  # before the read: a commit after it sets it again
            records = await app.aio.to_thread(batch)
            for event in cursor.take(records):
                yield event
            if cursor.done:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pushed.wait(), cursor.wait(object_id, every_s))
    finally:
        if unsubscribe is not None:
            unsubscribe()
