"""Recorded values (``run.now``, ``run.uuid``, ``run.random``) and progress notes.

The replay rule: a ``value`` record at the position is the value, whatever the clock
or the random source says now. The execution rule: draw the value and record it with
the next durable commit (a step commits such pending values before its body runs, so
a value that reaches the outside world is always in memory first).

Progress notes (``run.progress``) take no position and are not replayed: a note is
written with the next record while the agent does new work, and skipped while it is
still replaying.
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from perdure.core.bodies import Progress, Value
from perdure.core.codec import detached
from perdure.core.records import Kind
from perdure.engine.commands.positions import find

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["now", "progress", "random", "recorded_value", "uuid"]


def recorded_value(run: Run, cmd: Literal["now", "uuid", "random"],
                   make: Callable[[], Any]) -> Any:
    """The value memory holds for command ``cmd`` at the next position, or ``make()``'s,
    recorded with the next commit."""
    pos, recs = run._take(cmd, None)
    rec = find(recs, Kind.VALUE)
    if rec is not None:
        return detached(rec.body["value"])
    value = make()
    run._journal.defer(Value(pos, cmd, value).draft())
    return value


async def now(self: Run) -> float:
    """The current time, recorded: replay sees the same value."""
    return float(recorded_value(self, "now", self._clock))


async def uuid(self: Run) -> str:
    """A random UUID (hex string), recorded."""
    return str(recorded_value(self, "uuid", lambda: str(_uuid.uuid4())))


async def random(self: Run) -> float:
    """A random float in [0, 1), recorded."""
    return float(recorded_value(self, "random", _random.random))


async def progress(self: Run, **fields: Any) -> None:
    """Note progress in memory (shown by ``perdure show``); not part of replay.

    While the agent is still replaying recorded commands the note is skipped:
    it was written (or lost with the crash) the first time round. A note issued
    right after the last recorded command may appear once more after a resume. The
    note is written with the next record (a step's result, say), never on its own:
    a crash in between loses it.
    """
    if self.replaying:
        return
    stored, _ = self._stored(fields, what="progress note")
    self._journal.defer(Progress(stored).draft(), volatile=False)
