"""SQLite's group commit: fenced appends of many objects in one write transaction.

An append refused by its fence writes nothing, so most appends need no savepoint
(each costs tens of µs on the commit path); one that consumes events or signals
another object gets one. A batch of step appends to distinct objects (the common
group commit) is two statements whatever its size. If a record insert still fails
after its row moved, ``RetryWithSavepoints`` rolls the whole batch back, and the
store applies it again with a savepoint per append, so that only the offender is
refused.
"""

from __future__ import annotations

import builtins
import functools
import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from perdure.core.chain import CommitSeal
from perdure.errors import CancelRequestedError, LeaseLostError
from perdure.stores._rows import append_params, notices_cancel, record_params, seal_params
from perdure.stores._sqlite_file import Q
from perdure.stores.base import Append, Outcomes

__all__ = ["RetryWithSavepoints", "apply_batch"]

T = TypeVar("T")

_ROWS_PER_STATEMENT = 200  # rows of one grouped statement (8 or 11 parameters each)
_SAVEPOINT, _ROLLBACK_TO, _RELEASE = Q["savepoint"], Q["rollback_to_savepoint"], Q["release"]


class RetryWithSavepoints(Exception):  # noqa: N818 - internal control flow
    """A record insert failed after its row moved; retry the batch op by op."""


def _is_step_append(op: Append) -> bool:
    """Whether ``op`` only adds records while the node keeps running the object.

    Such an append changes nothing in the row but the head when the row already says
    running, in this phase, ready at this time, waiting for nothing: it is tried with the
    narrower ``append_step`` statement first, which leaves the indexed columns (and their
    index pages) alone. PostgreSQL needs no such split: an update that leaves indexed
    values as they were can be a heap-only (HOT) update there.
    """
    return (bool(op.records) and op.status == "running" and not op.release
            and op.waiting_event is None and op.result is None and not op.consume_event_ids
            and not op.parked and op.note is None and op.signal is None and op.requires is None
            and op.avoid_node is None and not op.clear_avoid and not op.cancel_children)


@functools.cache
def _grouped(name: str, rows: int) -> str:
    """Query ``name`` for ``rows`` rows: its ``{rows}`` as that many parameter tuples."""
    width = 11 if name == "insert_records" else 8
    row = "(" + ",".join("?" * width) + ")"
    return Q[name].format(rows=",".join([row] * rows))


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for at in range(0, len(items), size):
        yield items[at:at + size]


def _cancel_pending(op: Append) -> CancelRequestedError:
    """The outcome of an append written while a cancel is pending for its object."""
    return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested")


def apply_batch(conn: sqlite3.Connection, ops: Sequence[Append], now: float,
                seals: Sequence[CommitSeal], *, savepoints: bool) -> Outcomes:
    """Apply ``ops`` and store ``seals`` inside the write transaction open on ``conn``;
    each append's outcome. ``RetryWithSavepoints`` when the batch must be rolled back
    and applied again with ``savepoints``."""
    results: list[BaseException | None] = []
    if seals:
        conn.executemany(Q["insert_seal"], [seal_params(seal) for seal in seals])
    grouped = None if savepoints else _apply_steps(conn, ops, now)
    if grouped is not None:
        return grouped
    for op in ops:
        guarded = savepoints or bool(op.consume_event_ids) or op.signal is not None
        if guarded:
            conn.execute(_SAVEPOINT)
        try:
            cancel = _apply_one(conn, op, now)
        except (LeaseLostError, CancelRequestedError, sqlite3.IntegrityError) as exc:
            if not guarded:
                if isinstance(exc, sqlite3.IntegrityError):
                    raise RetryWithSavepoints from exc
                results.append(exc)  # refused by the fence: nothing was written
                continue
            conn.execute(_ROLLBACK_TO)
            conn.execute(_RELEASE)
            if isinstance(exc, sqlite3.IntegrityError):
                exc = LeaseLostError(
                    f"object {op.object_id!r}: another node appended first ({exc})"
                )
            results.append(exc)
            continue
        if guarded:
            conn.execute(_RELEASE)
        results.append(_cancel_pending(op) if cancel else None)
    return results


def _apply_steps(conn: sqlite3.Connection, ops: Sequence[Append], now: float
                 ) -> Outcomes | None:
    """The common group commit, if it applies: every append is a step append of a
    distinct object. Then two statements do it all: one moves every head whose row
    still holds its fence (``append_steps``), one inserts every record. An append
    whose row did not move (its fence or its row state differs, as for the first
    append after a claim) goes on alone. Returns each append's outcome, or ``None``
    when the batch is not of that kind (nothing was written).

    Each statement gives up the GIL while SQLite works and must win it back from the
    event loop (one release per row with ``executemany``), so one statement for all
    the heads and one for all the records cost far less than two per append.
    """
    if len(ops) < 2 or not all(map(_is_step_append, ops)):
        return None
    if len({op.object_id for op in ops}) != len(ops):
        return None
    # Rows changed, from the connection's running total: ``rowcount`` is -1 for a
    # statement that opens with ``WITH`` (the module does not take it for an update).
    before = conn.total_changes
    for chunk in _chunks(ops, _ROWS_PER_STATEMENT):
        params: list[Any] = []
        for op in chunk:
            last = op.records[-1]
            params += (op.object_id, last.seq, bytes.fromhex(last.hash), op.epoch,
                       op.records[0].seq - 1, op.status, op.phase, op.ready_at)
        params.append(now)
        conn.execute(_grouped("append_steps", len(chunk)), params)
    moved = conn.total_changes - before
    left = [] if moved == len(ops) else _unmoved(conn, ops)
    alone = {id(op) for op in left}
    records = [record_params(rec) for op in ops if id(op) not in alone
               for rec in op.records]
    try:
        for rows in _chunks(records, _ROWS_PER_STATEMENT):
            conn.execute(_grouped("insert_records", len(rows)),
                         [value for row in rows for value in row])
    except sqlite3.IntegrityError as exc:
        raise RetryWithSavepoints from exc
    failures: dict[int, BaseException] = {}
    for op in left:  # not moved by append_steps: append_update decides, as for one op
        try:
            if _apply_one(conn, op, now):
                failures[id(op)] = _cancel_pending(op)
        except LeaseLostError as exc:
            failures[id(op)] = exc
        except sqlite3.IntegrityError as exc:
            raise RetryWithSavepoints from exc
    return [failures.get(id(op)) for op in ops]


def _unmoved(conn: sqlite3.Connection, ops: Sequence[Append]) -> builtins.list[Append]:
    """The appends whose rows ``append_steps`` did not move to their new heads."""
    heads: dict[str, tuple[int, bytes]] = {}
    for chunk in _chunks(ops, _ROWS_PER_STATEMENT):
        sql = Q["heads_of"].format(marks=",".join("?" * len(chunk)))
        for object_id, seq, digest in conn.execute(sql, [op.object_id for op in chunk]):
            heads[object_id] = (seq, bytes(digest))
    return [op for op in ops
            if heads.get(op.object_id) != (op.records[-1].seq,
                                           bytes.fromhex(op.records[-1].hash))]


def _apply_one(conn: sqlite3.Connection, op: Append, now: float) -> bool:
    """Apply one append; whether a cancel is pending for its object (``True`` only
    where ``notices_cancel``). Raises ``LeaseLostError`` (or ``CancelRequestedError``
    for a refused completion) when it is refused."""
    last = op.records[-1] if op.records else None
    params = append_params(op, now, json.dumps)
    cancel = False
    # ``append_step`` only moves a row with no cancel pending.
    if not (_is_step_append(op) and conn.execute(Q["append_step"], params).rowcount == 1):
        taken = conn.execute(Q["append_update"], params).fetchall()
        if len(taken) != 1:
            if op.unless_cancelled:
                state = conn.execute(Q["cancel_state"], (op.object_id,)).fetchone()
                if state is not None and state[0] == op.epoch and state[1]:
                    raise CancelRequestedError(
                        f"object {op.object_id!r}: a cancel was requested; the "
                        "completion was not written")
            raise LeaseLostError(
                f"object {op.object_id!r}: epoch {op.epoch} no longer holds the lease "
                "(another node took it over); this node stops touching it"
            )
        cancel = bool(taken[0][0]) and notices_cancel(op)
    conn.executemany(Q["insert_record"], [record_params(rec) for rec in op.records])
    for event_id in op.consume_event_ids:
        assert last is not None, "consuming an event needs the record that receives it"
        cur = conn.execute(Q["consume_event"], (last.seq, event_id, op.object_id))
        if cur.rowcount != 1:
            raise LeaseLostError(
                f"object {op.object_id!r}: event {event_id} was consumed by another node"
            )
    if op.signal is not None:
        sig = op.signal
        conn.execute(Q["insert_event"],
                     (sig.object_id, sig.name, sig.payload, sig.dedupe_key, now, sig.seal))
        conn.execute(Q["wake_for_event"],
                     {"now": now, "object_id": sig.object_id, "name": sig.name})
    if op.cancel_children:
        conn.execute(Q["cancel_children"],
                     {"now": now, "object_id": op.object_id})
    return cancel
