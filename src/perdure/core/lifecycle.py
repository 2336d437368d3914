"""Lifecycle phases and the user-facing status of an object, and how an object can end.

``TERMINAL_STATUSES`` is the one definition of "ended" in Python (the SQL keeps its
own literals): a terminated record's ``outcome`` names one of them, and an object's
row says it once its terminal record is written.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["HELD_BACK_UNTIL", "TERMINAL_STATUSES", "Phase", "Status", "outcome_status"]

#: The ``ready_at`` of an object whose records are still being written (a fork's copied
#: prefix): no worker claims it, and it is no delayed start (which must come before:
#: 10000-01-01T00:00:00Z, past every instant a ``datetime`` can name).
HELD_BACK_UNTIL = 253_402_300_800.0


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

    @property
    def terminal(self) -> bool:
        """Whether an object with this status has ended (see ``TERMINAL_STATUSES``)."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: frozenset[Status] = frozenset(
    {Status.COMPLETED, Status.FAILED, Status.CANCELLED}
)
"""How an object can end: the statuses a terminated record's ``outcome`` names."""

_TERMINAL_VALUES = frozenset(status.value for status in TERMINAL_STATUSES)


def outcome_status(outcome: object) -> Status:
    """The terminal status a terminated record's ``outcome`` names.

    Raises ``ValueError`` for anything else (a status that is not an ending, too).
    """
    if isinstance(outcome, str) and outcome in _TERMINAL_VALUES:
        return Status(outcome)
    raise ValueError(f"{outcome!r} is not a valid outcome")
