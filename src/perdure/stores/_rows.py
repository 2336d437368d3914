"""What every SQL backend does the same way: rows to values, values to query parameters.

Each backend passes in only what differs: how it encodes a list of capability
names (a JSON array in SQLite, a text array in PostgreSQL) and how it decodes one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perdure.core.chain import CommitSeal, check_links
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.core.records import Record, record_from_columns
from perdure.stores.base import (
    AlertRow,
    Append,
    CheckpointRow,
    Claim,
    DataKeyRow,
    NewObject,
    ObjectFilter,
    ObjectRow,
)

__all__ = [
    "ENDED",
    "alert_of",
    "append_params",
    "browse_params",
    "checked_chain",
    "checkpoint_row",
    "claim_from_row",
    "create_params",
    "data_key_row",
    "list_query",
    "notices_cancel",
    "object_row",
    "record_from_row",
    "record_params",
    "seal_from_row",
    "seal_params",
]


def object_row(data: Mapping[str, Any], decode_names: Callable[[Any], Sequence[str]]
               ) -> ObjectRow:
    """An ``objects`` row (column name -> value) as an ``ObjectRow``."""
    result = data["result"]
    return ObjectRow(
        object_id=data["object_id"],
        agent=data["agent"],
        agent_version=data["agent_version"],
        status=data["status"],
        phase=data["phase"],
        epoch=int(data["epoch"]),
        lease_owner=data["lease_owner"],
        lease_expires=data["lease_expires"],
        ready_at=data["ready_at"],
        waiting_event=data["waiting_event"],
        paused=bool(data["paused"]),
        cancel_requested=bool(data["cancel_requested"]),
        parked=bool(data["parked"]),
        note=data["note"],
        head_seq=int(data["head_seq"]),
        head_hash=bytes(data["head_hash"]).hex(),
        result=bytes(result) if result is not None else None,
        parent_id=data["parent_id"],
        created_at=data["created_at"],
        updated_at=data["updated_at"],
        requires=tuple(decode_names(data["requires"])) if data.get("requires") else (),
        avoid=tuple(decode_names(data["avoid"])) if data.get("avoid") else (),
    )


def alert_of(row: Sequence[Any]) -> AlertRow:
    """An ``AlertRow`` from ``rule, subject, state, summary, node_id, fired_at,
    resolved_at``."""
    rule, subject, state, summary, node_id, fired_at, resolved_at = row[:7]
    return AlertRow(str(rule), str(subject), str(state), str(summary), str(node_id),
                    float(fired_at), None if resolved_at is None else float(resolved_at))


def data_key_row(row: Sequence[Any]) -> DataKeyRow:
    """A ``DataKeyRow`` from ``(object_id, key_id, wrapped, seal_all)``."""
    return DataKeyRow(str(row[0]), str(row[1]), bytes(row[2]), bool(row[3]))


def list_query(*, status: str | None, agent: str | None, parent: str | None) -> str:
    """The name of the ``list_*`` query for these filters: the one led by a filter an
    index serves (children by parent, then status, then agent); every other filter the
    query matches as given or, when ``None``, not at all."""
    if parent is not None:
        return "list_children"
    if status is not None:
        return "list_by_status"
    if agent is not None:
        return "list_by_agent"
    return "list_objects"


#: The statuses ``Browse.ended_since`` counts, in the order the figures name them.
ENDED = ("completed", "failed", "cancelled")


def browse_params(where: ObjectFilter, after: tuple[float, str] | None, limit: int,
                  now: float) -> dict[str, Any]:
    """The parameters of the ``browse_*`` queries: each filter as given (``None``: not
    filtered), the label's key and value, and the page key ``after`` as ``c_at``/``c_id``."""
    key, value = where.label if where.label is not None else (None, None)
    c_at, c_id = after if after is not None else (None, None)
    return {"status": where.status, "phase": where.phase, "agent": where.agent,
            "version": where.version, "parent": where.parent, "node": where.node,
            "since": where.since, "until": where.until, "q": where.prefix,
            "lk": key, "lv": value, "c_at": c_at, "c_id": c_id, "limit": limit, "now": now}


def claim_from_row(row: Sequence[Any]) -> Claim:
    """``(object_id, epoch, lease_expires, cancel_requested, paused, crashes)`` as a
    ``Claim``."""
    return Claim(object_id=row[0], epoch=int(row[1]), lease_expires=float(row[2]),
                 cancel_requested=bool(row[3]), paused=bool(row[4]),
                 crashes=int(row[5] or 0) if len(row) > 5 else 0)


def record_params(rec: Record) -> tuple[Any, ...]:
    """The ``insert_record`` parameters of a record, in column order."""
    return (rec.object_id, rec.seq, rec.trace_id, rec.ts_us, rec.node_id, rec.policy_ref,
            rec.kind, rec.body_bytes, bytes.fromhex(rec.prev_hash), bytes.fromhex(rec.hash),
            rec.signature)


def seal_params(seal: CommitSeal) -> tuple[bytes, str, bytes, bytes]:
    """The ``insert_seal`` parameters of a commit seal, in column order."""
    return (seal.digest, seal.node_id, seal.hashes, seal.signature)


def seal_from_row(row: Sequence[Any]) -> CommitSeal:
    """A ``seals`` row ``(digest, node_id, hashes, signature)`` as a ``CommitSeal``."""
    return CommitSeal(bytes(row[0]), str(row[1]), bytes(row[2]), bytes(row[3]))


def notices_cancel(op: Append) -> bool:
    """Whether a pending cancel is reported back for ``op`` once it is written: the node
    keeps running the object after it (not a release, not a terminal status)."""
    return not op.release and op.status not in TERMINAL_STATUSES


def record_from_row(row: Sequence[Any]) -> Record:
    """Decode one ``records`` row; a column of the wrong storage type is damage (fails closed)."""
    return record_from_columns(*row)


def checked_chain(object_id: str, got: list[Record] | None, after_seq: int, start_hash: str,
                  full: Callable[[], list[Record]]) -> list[Record]:
    """``got`` (what ``chain_from_rows`` made of the compact rows); when it is ``None``
    (the compact read failed or held anything unusual), the records from ``full()``
    through ``check_links``, which name exactly what is wrong."""
    if got is not None:
        return got
    records = full()
    check_links(object_id, records, start_hash=start_hash, start_seq=after_seq + 1)
    return records


def create_params(new: NewObject, now: float, encode_names: Callable[[list[str]], Any]
                  ) -> dict[str, Any]:
    """The ``insert_object`` parameters of a new object."""
    return {
        "object_id": new.object_id,
        "agent": new.agent,
        "agent_version": new.agent_version,
        "ready_at": new.ready_at,
        "head_seq": new.first.seq,
        "head_hash": bytes.fromhex(new.first.hash),
        "parent_id": new.parent_id,
        "requires": encode_names(sorted(new.requires)),
        "now": now,
        "queue": new.queue,
        "queue_key": new.queue_key,
        "priority": new.priority,
        "dedupe_key": new.dedupe_key,
    }


def append_params(op: Append, now: float, encode_names: Callable[[list[Any]], Any]
                  ) -> dict[str, Any]:
    """The ``append_update`` parameters of a fenced append (``encode_names`` turns a list
    into the parameter the backend reads: the capabilities required, the events
    consumed)."""
    first = op.records[0] if op.records else None
    last = op.records[-1] if op.records else None
    return {
        "head_seq": last.seq if last else None,
        "head_hash": bytes.fromhex(last.hash) if last else None,
        "status": op.status,
        "phase": op.phase,
        "waiting_event": op.waiting_event,
        "ready_at": op.ready_at,
        "result": op.result,
        "release": op.release,
        "parked": op.parked,
        "note": op.note,
        "requires": None if op.requires is None else encode_names(sorted(op.requires)),
        # The events this append consumes: no longer pending once it is taken, so they
        # do not make the object runnable again at once (see ``Append``).
        "consumed": encode_names([int(e) for e in op.consume_event_ids]),
        "avoid_node": op.avoid_node,
        "clear_avoid": op.clear_avoid,
        "now": now,
        "object_id": op.object_id,
        "epoch": op.epoch,
        "expected_head": first.seq - 1 if first else None,
        "unless_cancelled": op.unless_cancelled,
        "cancel_children": op.cancel_children,
    }



def checkpoint_row(row: Sequence[Any]) -> CheckpointRow:
    """A ``CheckpointRow`` from the ``checkpoints`` query's columns."""
    return CheckpointRow(str(row[0]), str(row[1]), int(row[2]), int(row[3]), str(row[4]),
                         _blob(row[5]), str(row[6]), _blob(row[7]), float(row[8]))


def _blob(value: Any) -> bytes:
    """A BLOB column's bytes; text that a hand edit put there, as its UTF-8 bytes (its
    signature check then fails: never a crash)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return bytes(value)
