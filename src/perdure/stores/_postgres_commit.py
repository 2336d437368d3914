"""PostgreSQL's group commit: fenced appends of many objects in one statement.

Appends that neither consume events nor signal go in one ``append`` statement (row
updates, records and wake-ups together, run on its own as a transaction: the whole
group commit is one round trip), on the write thread's pooled connection
(``apply_plain``) or on the event loop's asynchronous one (the store's ``apply_async``,
with ``batch_params``). An append that consumes events or signals gets a savepoint of
its own (``apply_alone``), but a lone one that consumes events can go on the loop in a
transaction of its own (``consume_async``). Every append is still judged on its own:
one refused by its fence writes nothing.
"""

from __future__ import annotations

import binascii
import builtins
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
from psycopg import errors as pg_errors

from perdure.core.chain import CommitSeal
from perdure.errors import CancelRequestedError, LeaseLostError
from perdure.stores._postgres_db import Q
from perdure.stores._rows import append_params, notices_cancel, record_params
from perdure.stores.base import Append

__all__ = [
    "Refused",
    "RetryWithSavepoints",
    "append_query",
    "apply_alone",
    "apply_plain",
    "batch_params",
    "careful",
    "consume_async",
    "distinct_runs",
    "fenced_out",
    "outcome",
    "releases_waiting",
    "seals_param",
]

# The columns of ``record_params``, in order: the keys of a record in ``append``'s JSON.
_RECORD_COLUMNS = ("object_id", "seq", "trace_id", "ts_us", "node_id", "policy_ref", "kind",
                   "body", "prev_hash", "hash", "signature")


class Refused(Exception):  # noqa: N818 - internal control flow
    """Rolls back an asynchronous transaction whose append the store refuses."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class RetryWithSavepoints(Exception):  # noqa: N818 - internal control flow
    """A batch hit an error that aborted its transaction; retry it op by op."""


def careful(op: Append) -> bool:
    """Whether ``op`` needs a savepoint of its own: it consumes events or signals."""
    return bool(op.consume_event_ids) or op.signal is not None


def append_query(ops: Sequence[tuple[int, Append]]) -> bytes:
    """``append``, or ``append_ending`` when an object of the batch ends and asks its
    children to cancel."""
    return Q["append_ending"] if any(op.cancel_children for _, op in ops) else Q["append"]


def _json(value: Any) -> Any:
    """A query parameter as a JSON value: bytes as base64 text, the rest as it is."""
    return binascii.b2a_base64(value, newline=False).decode() if isinstance(value, bytes) else value


def seals_param(seals: Sequence[CommitSeal]) -> str:
    """Commit seals as the JSON the ``append`` and ``insert_seals`` statements read."""
    return _dumps([{"digest": _json(s.digest), "node_id": s.node_id,
                    "hashes": _json(s.hashes), "signature": _json(s.signature)}
                   for s in seals])


def batch_params(ops: Sequence[tuple[int, Append]], now: float,
                   seals: Sequence[CommitSeal] = ()) -> dict[str, Any]:
    """The ``append`` parameters of ``(index, append)`` pairs for distinct objects.

    Each append is ``append_params`` as a JSON object (without ``now``, which is
    shared), each record ``record_params``; both carry the append's index.
    """
    appends: builtins.list[dict[str, Any]] = []
    records: builtins.list[dict[str, Any]] = []
    for index, op in ops:
        params = append_params(op, now, builtins.list)
        del params["now"]
        appends.append({"i": index} | {key: _json(value) for key, value in params.items()})
        for rec in op.records:
            values = map(_json, record_params(rec))
            records.append({"i": index} | dict(zip(_RECORD_COLUMNS, values, strict=True)))
    return {"ops": _dumps(appends), "records": _dumps(records), "now": now,
            "seals": seals_param(seals),
            "ending": [op.object_id for _, op in ops if op.cancel_children]}


def _dumps(value: Any) -> str:
    """JSON text for a ``::jsonb`` parameter (orjson: the group commit's hot path)."""
    return orjson.dumps(value).decode()


def distinct_runs(ops: Sequence[Append]) -> builtins.list[builtins.list[tuple[int, Append]]]:
    """``ops`` (indexed) cut into consecutive runs that touch each object at most once.

    One statement updates each row once, so a second append to the same object (which
    chains onto the first) goes into the next statement, after it.
    """
    runs: builtins.list[builtins.list[tuple[int, Append]]] = [[]]
    seen: set[str] = set()
    for index, op in enumerate(ops):
        if op.object_id in seen:
            runs.append([])
            seen.clear()
        seen.add(op.object_id)
        runs[-1].append((index, op))
    return runs


def releases_waiting(ops: Sequence[Append]) -> builtins.list[str]:
    """The objects ``ops`` let go of while they wait for an event (see ``rewake``)."""
    return [op.object_id for op in ops if op.release and op.waiting_event is not None]


def outcome(op: Append, cancel: bool) -> BaseException | None:
    """The outcome of an append the store took: ``CancelRequestedError`` when a cancel is
    pending and the node would keep running the object, else ``None``."""
    if cancel and notices_cancel(op):
        return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested")
    return None


def fenced_out(op: Append) -> LeaseLostError:
    """The refusal of an append whose fence (epoch and head) no longer holds."""
    return LeaseLostError(
        f"object {op.object_id!r}: epoch {op.epoch} no longer holds the lease or the "
        "chain moved on (another node took it over); this node stops touching it"
    )


def apply_plain(conn: psycopg.Connection[Any], ops: Sequence[Append], now: float,
                seals: Sequence[CommitSeal] = ()) -> builtins.list[BaseException | None]:
    """Appends without events or signals: one ``append`` statement for all of them.

    When an object appends twice (parallel branches), the statements (one per run
    of distinct objects, in order) go together in pipeline mode: still one round
    trip; the first statement also stores ``seals``. A failed statement aborts the
    transaction; the batch is then retried
    with a savepoint per append. The statement is prepared on its first use on a
    connection rather than its sixth: planning it costs half as much again as
    running it, and the pool hands the write thread each of its connections in turn.
    """
    runs = distinct_runs(ops)
    waits = releases_waiting(ops)
    try:
        if len(runs) == 1 and not waits:
            cursors = [conn.execute(append_query(runs[0]),
                                    batch_params(runs[0], now, seals), prepare=True)]
        else:
            # One implicit transaction up to the pipeline's sync; ``rewake`` last, so
            # that it sees an event sent while a release waited for its row.
            with conn.pipeline():
                cursors = [conn.cursor().execute(
                    append_query(run), batch_params(run, now, seals if n == 0 else ()),
                    prepare=True) for n, run in enumerate(runs)]
                if waits:
                    conn.execute(Q["rewake"], {"ids": waits, "now": now}, prepare=True)
    except pg_errors.UniqueViolation as exc:
        raise RetryWithSavepoints from exc
    done = {row[0]: row[2] for cur in cursors for row in cur.fetchall()}
    return [outcome(op, done[index]) if index in done else fenced_out(op)
            for index, op in enumerate(ops)]


def apply_alone(conn: psycopg.Connection[Any], op: Append, now: float
                ) -> BaseException | None:
    """One append in a savepoint of its own: a refusal undoes only this append.

    After the append, the events it consumes (each exactly once) and the signal it
    sends to another object, whom it wakes.
    """
    try:
        with conn.transaction():
            cur = conn.execute(append_query([(0, op)]), batch_params([(0, op)], now),
                               prepare=True)
            taken = cur.fetchone()
            if taken is None:
                if op.unless_cancelled:
                    state = conn.execute(Q["cancel_state"], (op.object_id,)).fetchone()
                    if state is not None and state[0] == op.epoch and state[1]:
                        return CancelRequestedError(
                            f"object {op.object_id!r}: a cancel was requested; the "
                            "completion was not written")
                return fenced_out(op)
            for event_id in op.consume_event_ids:
                assert op.records, "consuming an event needs the record that receives it"
                cur = conn.execute(Q["consume_event"],
                                   (op.records[-1].seq, event_id, op.object_id))
                if cur.rowcount != 1:
                    raise LeaseLostError(  # rolls the savepoint back
                        f"object {op.object_id!r}: event {event_id} was consumed by "
                        "another node"
                    )
            if op.signal is not None:
                sig = op.signal
                conn.execute(Q["insert_event"],
                             (sig.object_id, sig.name, sig.payload, sig.dedupe_key, now,
                              sig.seal))
                conn.execute(Q["wake_for_event"],
                             {"now": now, "object_id": sig.object_id, "name": sig.name})
                conn.execute(Q["notify"], (sig.object_id,))
    except pg_errors.UniqueViolation:
        return LeaseLostError(f"object {op.object_id!r}: another node appended first")
    except LeaseLostError as exc:
        return exc
    if op.release and op.waiting_event is not None:
        conn.execute(Q["rewake"], {"ids": [op.object_id], "now": now}, prepare=True)
    return outcome(op, bool(taken[2]))


async def consume_async(conn: psycopg.AsyncConnection[Any], op: Append,
                        now: float, seals: Sequence[CommitSeal]) -> BaseException | None:
    """One append that consumes events (an agent receiving what it waited for), in a
    transaction of its own. The transaction's start, the append and every
    consumption go to the server together (pipeline mode: one round trip), then the
    commit; a refusal of either rolls both back."""
    assert op.records, "consuming an event needs the record that receives it"
    seq = op.records[-1].seq
    try:
        async with conn.pipeline() as pipeline, conn.transaction():
            appended = await conn.execute(
                append_query([(0, op)]), batch_params([(0, op)], now, seals),
                prepare=True)
            consumed = [conn.cursor() for _ in op.consume_event_ids]
            for cur, event_id in zip(consumed, op.consume_event_ids, strict=True):
                await cur.execute(Q["consume_event"], (seq, event_id, op.object_id),
                                  prepare=True)
            if op.release and op.waiting_event is not None:
                await conn.execute(Q["rewake"], {"ids": [op.object_id], "now": now},
                                   prepare=True)
            await pipeline.sync()
            taken = await appended.fetchall()
            if not taken:
                raise Refused(fenced_out(op))
            if any(cur.rowcount != 1 for cur in consumed):
                raise Refused(LeaseLostError(
                    f"object {op.object_id!r}: an event it consumes was consumed by "
                    "another node"))
    except Refused as refused:
        return refused.error
    return outcome(op, bool(taken[0][2]))

