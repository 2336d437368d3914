"""The in-memory store's ``Browse`` reads, as the SQL stores' ``browse_*`` and figures
queries make them, on Python values. Callers hold the store's lock.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from typing import Any

from perdure.core.lifecycle import Status
from perdure.stores._memory_rows import TERMINAL, Row, Tables
from perdure.stores._rows import ENDED
from perdure.stores.base import ObjectFilter, ObjectRow, RecordBody

__all__ = ["awaiting_outside", "bodies_since", "browse", "ended_since", "lease_holders",
           "queue_key_holders",
           "records_of_kinds", "sent_at", "updated_since"]

_KIND, _BODY = 6, 7  # a stored record's columns (``record_params``' order)


def _status_matches(row: Row, status: str, now: float) -> bool:
    """``browse_objects``' status term: a derived status, else the stored one (only on
    rows neither parked nor paused, unless it is terminal)."""
    if status == Status.PARKED:
        return row.parked
    if status == Status.PAUSED:
        return row.paused and not row.parked
    if status == Status.RUNNING:
        return _live(row, now)
    return row.status == status and (row.status in TERMINAL
                                     or not (row.parked or row.paused))


def _live(row: Row, now: float) -> bool:
    return row.lease_owner is not None and row.lease_expires is not None \
        and row.lease_expires > now


def _label(t: Tables, object_id: str) -> dict[str, Any]:
    """The labels the object was started with (its first record's context)."""
    first = t.records.get(object_id, {}).get(1)
    if first is None or first[_KIND] != "instantiated":
        return {}
    try:
        body = json.loads(first[_BODY])
    except (ValueError, TypeError):
        return {}
    context = body.get("context") if isinstance(body, dict) else None
    labels = context.get("labels") if isinstance(context, dict) else None
    return labels if isinstance(labels, dict) else {}


def _matches(t: Tables, row: Row, where: ObjectFilter, now: float) -> bool:
    if where.status is not None and not _status_matches(row, where.status, now):
        return False
    if ((where.phase is not None and row.phase != where.phase)
            or (where.agent is not None and row.agent != where.agent)
            or (where.version is not None and row.agent_version != where.version)
            or (where.parent is not None and row.parent_id != where.parent)
            or (where.since is not None and row.created_at < where.since)
            or (where.until is not None and row.created_at > where.until)
            or (where.prefix is not None and not row.object_id.startswith(where.prefix))):
        return False
    if where.node is not None and not (
            _live(row, now) and (row.lease_owner or "").startswith(where.node + "/")):
        return False
    if where.label is not None:
        key, value = where.label
        return _label(t, row.object_id).get(key) == value
    return True


def browse(t: Tables, where: ObjectFilter, after: tuple[float, str] | None, limit: int,
           now: float) -> builtins.list[ObjectRow]:
    """``browse_objects``: newest first by ``(created_at, object_id)`` (ids ascending
    among equal times), after the key ``after``, at most ``limit``."""
    rows = [row for row in t.objects.values()
            if (after is None or row.created_at < after[0]
                or (row.created_at == after[0] and row.object_id > after[1]))
            and _matches(t, row, where, now)]
    rows.sort(key=lambda row: row.object_id)
    rows.sort(key=lambda row: row.created_at, reverse=True)
    return [row.value() for row in rows[:max(0, limit)]]


def records_of_kinds(t: Tables, object_id: str, kinds: Sequence[str], limit: int
                     ) -> builtins.list[tuple[Any, ...]]:
    """``records_of_kinds``: the object's stored records of ``kinds``, by seq."""
    wanted = set(kinds)
    found = [rec for _, rec in sorted(t.records.get(object_id, {}).items())
             if rec[_KIND] in wanted]
    return found[:max(0, limit)]


def awaiting_outside(t: Tables, limit: int) -> builtins.list[ObjectRow]:
    """``awaiting_outside``: dormant, unleased, waiting for an event not ``perdure:``."""
    rows = [row for row in t.objects.values()
            if row.waiting_event is not None and row.lease_owner is None
            and not row.waiting_event.startswith("perdure:") and row.status == "dormant"]
    rows.sort(key=lambda row: row.object_id)
    rows.sort(key=lambda row: row.updated_at, reverse=True)
    return [row.value() for row in rows[:max(0, limit)]]


def lease_holders(t: Tables, now: float, limit: int) -> builtins.list[tuple[str, str]]:
    """``lease_holders``: live leases by object id."""
    held = sorted((row.object_id, row.lease_owner) for row in t.objects.values()
                  if _live(row, now) and row.lease_owner is not None)
    return held[:max(0, limit)]


def queue_key_holders(t: Tables, queue: str, now: float, limit: int
                      ) -> builtins.list[tuple[str | None, int]]:
    """``queue_key_holders``: the keys of ``queue`` holding slots, most first."""
    counts: dict[str | None, int] = {}
    for row in t.objects.values():
        if row.queue == queue and _live(row, now):
            counts[row.queue_key] = counts.get(row.queue_key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0] is not None, item[0] or ""))
    return ranked[:max(0, limit)]


def ended_since(t: Tables, since: float) -> builtins.list[tuple[str, float]]:
    """``ended_since``: ``(status, updated_at)`` of objects ended at or after ``since``."""
    return [(row.status, row.updated_at) for row in t.objects.values()
            if row.updated_at >= since and row.status in ENDED]


def updated_since(t: Tables, since: float, limit: int) -> builtins.list[str]:
    """``updated_since``: ids updated at or after ``since``, latest first."""
    rows = sorted((row for row in t.objects.values() if row.updated_at >= since),
                  key=lambda row: row.object_id)
    rows.sort(key=lambda row: row.updated_at, reverse=True)
    return [row.object_id for row in rows[:max(0, limit)]]


def bodies_since(t: Tables, object_ids: Sequence[str], kinds: Sequence[str],
                 since_us: int) -> builtins.list[RecordBody]:
    """``bodies_since``: the records of ``object_ids`` and ``kinds`` written since
    ``since_us``, by object id then seq."""
    wanted = set(kinds)
    found = []
    for object_id in sorted(set(object_ids)):
        for seq, rec in sorted(t.records.get(object_id, {}).items()):
            if rec[_KIND] in wanted and rec[3] >= since_us:
                found.append(RecordBody(object_id, seq, rec[_KIND], rec[3], bytes(rec[_BODY])))
    return found


def sent_at(t: Tables, event_ids: Sequence[int]) -> dict[int, float]:
    """``sent_at``: when each of ``event_ids`` was sent."""
    wanted = set(event_ids)
    return {event.event_id: event.sent_at for events in t.inbox.values()
            for event in events.values() if event.event_id in wanted}
