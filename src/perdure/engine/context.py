"""What a running step can know about itself: ``perdure.current_step()``."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StepInfo", "current_step", "step_scope"]


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step now running.

    ``idempotency_key`` is the same on every attempt and every node
    (``object_id/position/name``): pass it to side-effect targets so a
    re-executed step lands once. ``epoch`` is the fencing token of the lease the
    step runs under: a target that remembers the highest epoch it has seen can
    refuse a late write from a node that lost its lease.
    """

    object_id: str
    name: str
    position: int | str
    attempt: int
    idempotency_key: str
    epoch: int
    #: The cursor of the last progress marker an earlier attempt recorded (``None``:
    #: none): where a retry after a crash continues from.
    last_checkpoint: Any = None
    _marks: Any = field(default=None, repr=False, compare=False)

    def checkpoint(self, cursor: Any, *, durable: bool = False) -> None:
        """Record a progress marker (any JSON value) for this step.

        Batched: returns at once and the latest cursor is written within
        ``perdure.engine.checkpoints.CHECKPOINT_EVERY`` (0.5 s), so a crash loses at
        most that much progress. ``durable=True`` (from a plain ``def`` step) returns
        once the marker is in memory. A retry reads it as ``last_checkpoint``.
        """
        self._markers().checkpoint(cursor, durable=durable)

    async def acheckpoint(self, cursor: Any) -> None:
        """Record a progress marker and return once it is durable (``async def`` steps)."""
        await self._markers().acheckpoint(cursor)

    def _markers(self) -> Any:
        """This attempt's ``engine.checkpoints.Marks``, made at the first marker."""
        marks = self._marks
        if type(marks) is tuple:
            from perdure.engine.checkpoints import Marks

            marks = Marks(*marks)
            object.__setattr__(self, "_marks", marks)  # (frozen for the step's code)
        if marks is None:
            raise RuntimeError("this step cannot record checkpoints")
        return marks


_current: ContextVar[StepInfo | None] = ContextVar("perdure_step", default=None)


def current_step() -> StepInfo:
    """The step this code runs in; ``RuntimeError`` outside a step."""
    info = _current.get()
    if info is None:
        raise RuntimeError("perdure.current_step() is only available inside run.step(...)")
    return info


step_scope = _current
