"""Lifecycle phases and the user-facing status of an object."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TERMINAL_STATUSES", "Phase", "Status"]


class Phase(StrEnum):
    """Where an object is in its lifecycle; derivable from memory, stored only as an index."""

    INSTANTIATED = "instantiated"
    EVALUATION = "evaluation"
    EXECUTION = "execution"
    MUTATION = "mutation"
    DELEGATION = "delegation"
    DORMANCY = "dormancy"
    REENTRY = "reentry"
    TERMINATION = "termination"


class Status(StrEnum):
    """What a person wants to know: is it running, waiting, done, or stuck?"""

    READY = "ready"  # runnable, no node holds it
    RUNNING = "running"  # a node holds its lease
    DORMANT = "dormant"  # waiting for a timer, an event or a retry
    PAUSED = "paused"  # held by a person; resumes on `resume`
    PARKED = "parked"  # cannot continue without a person (non-determinism, damage)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
