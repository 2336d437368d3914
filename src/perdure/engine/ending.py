"""How a node ends an object, or stops it for a person.

``finish`` writes the terminal record; in the same transaction it signals the parent
and asks the live children to cancel, so neither is ever lost. A completion is
written only if no cancel is pending: an object whose agent returns while a cancel
waits ends cancelled. ``park`` stops an object until a person resumes it, with a
record saying why.
"""

from __future__ import annotations

import logging
from typing import Any

from perdure.core.bodies import Terminated
from perdure.core.lifecycle import Phase, Status
from perdure.core.records import Record, RecordDraft
from perdure.core.schedules import SCHEDULE_AGENT
from perdure.core.sealing import redact
from perdure.engine.failures import error_body
from perdure.engine.journal import Journal
from perdure.engine.leases import cancel_pending
from perdure.engine.lineage import parent_signal
from perdure.engine.node import Node
from perdure.errors import (
    CancelRequestedError,
    LeaseLostError,
    NonDeterminismError,
    StoreError,
)
from perdure.hooks import ObjectTerminated

__all__ = ["finish", "finish_failed", "park"]

log = logging.getLogger("perdure.worker")


async def finish(node: Node, journal: Journal, records: list[Record], ended_as: Terminated, *,
                 status: Status, result: bytes | None = None) -> None:
    """Write the terminal record (``ended_as``), signalling the parent in the same
    transaction.

    A completion is written only if no cancel is pending: an object whose agent
    returns while a cancel waits ends cancelled.
    """
    body = journal.redacted(RecordDraft(ended_as.kind, ended_as.encode())).body
    error = body.get("error")
    note = None
    if status is Status.FAILED and isinstance(error, dict):
        note = f"{_short_type(error.get('type'))}: {error.get('message', '')}"[:500]
    # The live children are asked to cancel in the terminal record's own transaction
    # (every object whose row names this one as parent: also a child whose delegation
    # record a crash kept from being written), so the request is never lost.
    # A schedule's runs are its children but outlive it: deleting it cancels none.
    children = node.policy.cancel_children and (
        records[0].body.get("intent", {}).get("agent") != SCHEDULE_AGENT)
    completing = status is Status.COMPLETED
    ended = status
    try:
        try:
            await journal.commit([RecordDraft(ended_as.kind, body)], status=status,
                                 phase=Phase.TERMINATION, ready_at=None, running=False,
                                 release=True, result=result, note=note,
                                 unless_cancelled=completing,
                                 signal=parent_signal(node, records, body),
                                 cancel_children=children)
        except LeaseLostError:
            # A refused completion: the lease is lost, or a cancel is pending (a store
            # may say either way); if this node still holds the object, it is the cancel.
            if not completing or not await cancel_pending(node, journal):
                raise
            raise CancelRequestedError(journal.object_id) from None
    except CancelRequestedError:
        ended = Status.CANCELLED
        cancelled = Terminated.cancelled("cancelled before the completion was recorded (the "
                                         "agent had returned)").encode()
        await journal.commit([RecordDraft(ended_as.kind, cancelled)],
                             status=Status.CANCELLED, phase=Phase.TERMINATION, ready_at=None,
                             running=False, release=True,
                             signal=parent_signal(node, records, cancelled),
                             cancel_children=children)
    if ended is Status.FAILED:  # every terminal failure is said where the node logs
        log.warning("%s failed: %s", journal.object_id, note or ended_as.reason,
                    extra={"action": "object_failed", "object_id": journal.object_id})
    node.held.drop(journal.object_id)
    try:  # an ended object has no superseding state left to keep (engine.slots)
        if journal.slot_rows is not False:  # (else it has none: no write transaction)
            await node.slots.drop_all(journal.object_id)
    except StoreError:
        log.warning("the checkpoint slots of ended object %s could not be deleted",
                    journal.object_id, exc_info=True, extra={"action": "slots_left"})
    if node.hooks.active:
        node.hooks.emit(ObjectTerminated(node.signer.node_id, journal.object_id,
                                         ended.value, node.clock() - journal.claimed_at))


async def finish_failed(node: Node, journal: Journal, records: list[Record],
                        exc: BaseException) -> None:
    """End the object as failed by ``exc`` (the agent's own exception)."""
    await finish(node, journal, records, Terminated.failed("agent raised", error_body(exc)),
                 status=Status.FAILED)


async def park(journal: Journal, err: Exception, record: RecordDraft | None) -> None:
    """Park the object for a person, with ``record`` saying why in memory."""
    if not isinstance(err, NonDeterminismError):
        log.error("parked %s: %s", journal.object_id, redact(str(err), journal.secrets),
                  extra={"action": "parked"})
    await journal.commit([record] if record is not None else [], status=Status.PARKED,
                         phase=Phase.EVALUATION, ready_at=None, running=False, release=True,
                         parked=True, note=str(err)[:500])


def _short_type(type_path: Any) -> str:
    """``module:Qual.Name`` as ``Name`` (for a one-line note)."""
    return str(type_path or "Error").rpartition(":")[2].rpartition(".")[2] or "Error"
