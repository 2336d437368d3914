"""What a running step can know about itself: ``perdure.current_step()``."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

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


_current: ContextVar[StepInfo | None] = ContextVar("perdure_step", default=None)


def current_step() -> StepInfo:
    """The step this code runs in; ``RuntimeError`` outside a step."""
    info = _current.get()
    if info is None:
        raise RuntimeError("perdure.current_step() is only available inside run.step(...)")
    return info


step_scope = _current
