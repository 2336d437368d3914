"""``ObjectInfo``: what the store's index says about one object, as a person sees it.

``info_from_row`` derives the status a person sees from the stored row: a lapsed lease is
no longer running, the parked and paused flags override the stored status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perdure.core.cycle import moment
from perdure.core.lifecycle import HELD_BACK_UNTIL, Status
from perdure.core.questions import Question
from perdure.stores.base import ObjectRow

__all__ = ["ObjectInfo", "info_from_row"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the store's index says about an object right now."""

    object_id: str
    agent: str
    agent_version: str
    status: Status
    phase: str
    epoch: int
    lease_owner: str | None
    ready_at: float | None
    waiting_event: str | None
    records: int
    note: str | None
    parent_id: str | None
    created_at: float
    updated_at: float
    requires: tuple[str, ...] = ()
    #: The questions the object asks while it waits (``run.wait_for(..., prompt=...)``),
    #: oldest first; filled by ``App.get`` and ``App.list`` (empty when it asks none, and
    #: with ``explain=False``).
    asking: tuple[Question, ...] = ()
    #: ``{"object_id", "seq", "hash"}`` of the object and record this one was forked
    #: from (``App.fork``), as its first record says; filled by ``App.get`` (``App.list``
    #: and ``explain=False`` leave it ``None``).
    forked_from: dict[str, Any] | None = None
    #: The node processes (``node_id/pid``) that said they cannot do its next step (a
    #: missing key, package or local resource); ``App.get`` notes when no other live
    #: node could take it.
    avoid: tuple[str, ...] = ()

    @property
    def prompt(self) -> Any:
        """The prompt of the first question the object asks (``asking``), or ``None``."""
        return self.asking[0].prompt if self.asking else None

    @property
    def terminal(self) -> bool:
        """True once the object has completed, failed or been cancelled."""
        return self.status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


def info_from_row(row: ObjectRow, now: float) -> ObjectInfo:
    """Derive the status a person sees from the row (leases expire; flags override)."""
    status = Status(row.status) if row.status in set(Status) else Status.READY
    terminal = status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
    if not terminal:
        if row.parked:
            status = Status.PARKED
        elif row.paused:
            status = Status.PAUSED
        elif row.lease_owner is not None and (row.lease_expires or 0) > now:
            status = Status.RUNNING
        elif status is Status.RUNNING:
            status = Status.READY  # its node died; the lease lapsed and it waits to be claimed
    note = row.note
    if (status is Status.READY and row.epoch == 0 and note is None
            and row.ready_at is not None and now < row.ready_at < HELD_BACK_UNTIL):
        # Never claimed and not due: a delayed start (``app.options(start_at=...)``), not
        # an object held back while its records are written (a fork's: it stays ready).
        status, note = Status.DORMANT, f"waits to start at {moment(row.ready_at)}"
    return ObjectInfo(
        object_id=row.object_id,
        agent=row.agent,
        agent_version=row.agent_version,
        status=status,
        phase=row.phase,
        epoch=row.epoch,
        lease_owner=row.lease_owner if status is Status.RUNNING else None,
        ready_at=row.ready_at,
        waiting_event=row.waiting_event,
        records=row.head_seq,
        note=note,
        parent_id=row.parent_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        requires=row.requires,
        avoid=row.avoid,
    )
