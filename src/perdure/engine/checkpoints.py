"""Progress markers inside a running step: ``perdure.current_step().checkpoint(cursor)``.

A long step (a migration of 100 statements, a crawl of 10,000 pages) records where it
is; a retry after a crash gets the last marker as ``current_step().last_checkpoint``
and continues from there instead of from zero.

Three markers, kept distinct:

- **completion**: the step's ``step_done`` record; a completed step never runs again;
- **idempotency**: ``current_step().idempotency_key``, the same on every attempt, for the
  targets of side effects to deduplicate with;
- **partial progress**: the step's checkpoint slot ``step:<pos>`` (``engine.slots``:
  outside the chain, signed, fenced, each marker replacing the one before), the cursor
  the code gave; it says how far an attempt got, never that anything completed. It is
  deleted once the step's outcome is recorded. (Memories written before slots existed
  hold ``step_checkpoint`` records at the position; they are still read.)

Batched by default: ``checkpoint(cursor)`` returns at once and the latest cursor is
written at most every ``CHECKPOINT_EVERY`` seconds (an earlier cursor given in between
is superseded, never written). The bound on loss: after a crash the last marker in
memory is at most ``CHECKPOINT_EVERY`` seconds (plus one commit) older than the last one
given. ``checkpoint(cursor, durable=True)`` (from a plain ``def`` step) or ``await
acheckpoint(cursor)`` (from an ``async def`` one) returns only once the marker is
durable: nothing given is lost. A step that raises has its pending marker written before
its failure is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import StepCheckpoint
from perdure.core.records import Kind, Record
from perdure.engine.commands.positions import top
from perdure.engine.payloads import recorded_payload
from perdure.engine.slots import step_slot

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["CHECKPOINT_EVERY", "Marks", "drop_step_slot", "last_marker", "slot_marker",
           "step_marks"]

log = logging.getLogger("perdure.checkpoints")

CHECKPOINT_EVERY = 0.5  # seconds: how long a batched marker may wait to be written
_CHECKPOINT = Kind.STEP_CHECKPOINT.value
_INVALIDATED = Kind.INVALIDATED.value


def last_marker(recs: Sequence[Record]) -> Any:
    """The cursor of the last progress marker memory holds at a step's position."""
    for rec in reversed(recs):
        if rec.kind == _CHECKPOINT:
            return rec.body["cursor"]
    return None


def slot_marker(run: Run, pos: int | str, name: str) -> tuple[bool, Any]:
    """``(True, cursor)`` when the step's checkpoint slot holds a marker of it (opened),
    else ``(False, None)``."""
    slot = run._slots.get(step_slot(pos))
    if slot is None:
        return False, None
    body = slot.value
    if not isinstance(body, dict) or body.get("name") != name or "cursor" not in body:
        return False, None
    at = top(pos)
    for rec in reversed(run._records):  # (rare: only a step whose slot holds a marker)
        if rec.seq <= slot.after_seq:
            break
        if rec.kind == _INVALIDATED and int(rec.body["from_pos"]) <= at:
            return False, None  # the step runs again from scratch: its marker is void
    return True, run._opened(body["cursor"])


def step_marks(run: Run, pos: int | str, name: str, attempt: int, recs: Sequence[Record]
               ) -> tuple[Any, tuple[Any, ...]]:
    """What a step's ``StepInfo`` carries about progress: the last marker memory holds
    at its position (its checkpoint slot, else a ``step_checkpoint`` record an older
    version wrote), and what this attempt's ``Marks`` are made of."""
    found, last = slot_marker(run, pos, name) if run._slots else (False, None)
    if not found and recs:
        last = last_marker(recs)
    # What the markers need, as a tuple: ``StepInfo`` makes the ``Marks`` at the first
    # marker (most steps give none, and this is on every step's path).
    return last, (run, pos, name, attempt, asyncio.get_running_loop())


class Marks:
    """The progress markers of one attempt of one step (see the module)."""

    __slots__ = (
        "_attempt",
        "_count",
        "_error",
        "_flight",
        "_has",
        "_last_write",
        "_loop",
        "_name",
        "_pending",
        "_pos",
        "_run",
        "_timer",
    )

    def __init__(self, run: Run, pos: int | str, name: str, attempt: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._run, self._pos, self._name, self._attempt = run, pos, name, attempt
        self._loop = loop
        self._count = 0
        self._pending: Any = None
        self._has = False
        self._flight: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_write = 0.0
        self._error: BaseException | None = None

    @property
    def used(self) -> bool:
        """Whether the step gave any marker."""
        return self._count > 0 or self._has

    def _clean(self, cursor: Any) -> Any:
        return recorded_payload(cursor, what=f"checkpoint of step {self._name!r}")

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def checkpoint(self, cursor: Any, *, durable: bool = False) -> None:
        """Record ``cursor`` (batched; ``durable=True`` waits until it is in memory)."""
        clean = self._clean(cursor)
        self._raise_error()
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            if durable:
                raise RuntimeError("checkpoint(cursor, durable=True) blocks: in an async "
                                   "step use `await current_step().acheckpoint(cursor)`")
            self._offer(clean)
        elif durable:
            asyncio.run_coroutine_threadsafe(self._now(clean), self._loop).result()
        else:
            self._loop.call_soon_threadsafe(self._offer, clean)

    async def acheckpoint(self, cursor: Any) -> None:
        """Record ``cursor`` and return once it is durable (``async def`` steps)."""
        clean = self._clean(cursor)
        self._raise_error()
        if asyncio.get_running_loop() is self._loop:
            await self._now(clean)
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._now(clean),
                                                                       self._loop))

    async def _now(self, cursor: Any) -> None:
        if self._flight is not None:
            await asyncio.shield(self._flight)
        self._has = False
        self._pending = None
        await self._write(cursor)

    def _offer(self, cursor: Any) -> None:
        self._pending, self._has = cursor, True
        if self._flight is None and self._timer is None:
            self._schedule()

    def _schedule(self) -> None:
        delay = self._last_write + CHECKPOINT_EVERY - time.monotonic()
        if delay <= 0:
            self._start()
        else:
            self._timer = self._loop.call_later(delay, self._kick)

    def _kick(self) -> None:
        self._timer = None
        if self._has and self._flight is None:
            self._start()

    def _start(self) -> None:
        cursor, self._pending, self._has = self._pending, None, False
        self._flight = self._loop.create_task(self._background(cursor))

    async def _background(self, cursor: Any) -> None:
        try:
            await self._write(cursor)
        except BaseException as exc:  # noqa: BLE001 - raised at the step's next marker
            self._error = exc
        finally:
            self._flight = None
        if self._has and self._timer is None and self._error is None:
            self._schedule()

    @property
    def written(self) -> bool:
        """Whether a marker of this attempt was written."""
        return self._count > 0

    async def _write(self, cursor: Any) -> None:
        self._count += 1
        run = self._run
        stored, _ = run._stored(cursor, what=f"checkpoint of step {self._name!r}")
        body = StepCheckpoint(self._pos, self._name, self._attempt, self._count, stored)
        slots = run._journal.slots
        if slots is None:
            await run._journal.commit([body.draft()])
        else:
            await slots.put(run._journal, step_slot(self._pos), body.encode())
        self._last_write = time.monotonic()

    async def close(self, *, flush: bool) -> None:
        """The step ended: write a pending marker if ``flush`` (it failed), else drop it
        (its completion supersedes every marker); wait for a write in flight."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flight is not None:  # (it keeps its own error: it never raises)
            await asyncio.shield(self._flight)
        if flush and self._has and self._error is None:
            self._has = False
            try:
                await self._write(self._pending)
            except Exception:
                log.warning("the last progress marker of step %s could not be written",
                            self._name, exc_info=True,
                            extra={"action": "checkpoint_lost"})


async def drop_step_slot(run: Run, pos: int | str, marks: Any) -> None:
    """The step at ``pos`` has its outcome in memory: delete its checkpoint slot, if
    this attempt (``marks``: its ``StepInfo._marks``) or an earlier one wrote it."""
    slots = run._journal.slots
    key = step_slot(pos)
    if slots is None:
        return
    if key in run._slots or (isinstance(marks, Marks) and marks.written):
        await slots.drop(run._journal, [key])
        run._slots.pop(key, None)
