"""``App.fork``: a new object whose memory is a verified prefix of another's.

The original's memory is checked first (``Client.checked_memory``: links, signatures
under trusted keys, its row's head, heads this node saw). The fork's memory is a chain
of its own, signed by this node: its first record is the original's ``instantiated``
record with a new context (the new id, a new trace, no parent, and ``forked_from``:
the original's id and the seq and hash of the last record copied, which ties the fork
to the verified prefix); records 2..SEQ follow with their kinds, bodies and
timestamps unchanged, chained and signed anew under the new id. Nothing of the
original changes.

The fork then runs from there with the code this App's workers run: the recorded
commands replay (steps are not run again), the rest runs. A fork point is a record
after which a crash could have left the memory, and which the fork can go on from
alone. ``fork`` refuses (``ForkError``, naming the fork points around it) a SEQ:

- past the object's head, or at its terminal record (fork before it);
- between a non-idempotent step's ``step_started`` and its outcome (the fork would hold
  a step in doubt that the original finished): fork before the start, or at the outcome;
- inside a ``gather`` (between the first and last record of its branches): fork before
  the gather or at its last record;
- after a ``delegated`` record whose child's end is not in the prefix: the child
  belongs to the original and signals only it, so the fork would wait for it forever.

The fork keeps the original's intent (arguments, deadline, budget, labels) as the
prefix leaves it. Sealed values are copied as they are: each names the original
(``of``), so the fork's worker, its queries and its followers open them with the
original's data key; the fork gets a data key of its own (made here, with the original's
``encrypt`` setting) for what it seals from then on.

With ``new_id`` the call is idempotent: forking again with the same object, SEQ and id
returns the fork made before (finishing one a crash cut short).
"""

from __future__ import annotations

import bisect
import dataclasses
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from perdure.core.bodies import Instantiated, decode
from perdure.core.chain import seal
from perdure.core.lifecycle import HELD_BACK_UNTIL, Phase, Status
from perdure.core.names import check_object_id
from perdure.core.records import GENESIS_HASH, Kind, Record, RecordDraft
from perdure.engine.commands.positions import top
from perdure.errors import ConfigurationError, ForkError, ObjectConflictError, RecordDecodeError
from perdure.handle import Handle
from perdure.stores.base import Append, NewObject

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["build", "fork", "fork_problem", "forked_first"]

_STEP_STARTED = Kind.STEP_STARTED.value
_STEP_ENDS = frozenset({Kind.STEP_DONE.value, Kind.STEP_FAILED.value,
                        Kind.STEP_IN_DOUBT.value})


def fork_problem(records: Sequence[Record], at: int) -> str | None:
    """Why memory ``records`` cannot be forked after record ``at`` (see the module), or
    ``None`` when it can. One pass over memory, whatever its length."""
    last = records[at - 1]
    if last.kind == Kind.TERMINATED:
        return (f"#{at} is the object's terminal record; fork at #{at - 1} or before "
                "to run its end again")
    step_ends: dict[object, list[int]] = {}
    child_ends: dict[object, int] = {}
    for rec in records:
        if rec.kind in _STEP_ENDS:
            step_ends.setdefault(_key(rec.body.get("pos")), []).append(rec.seq)
        elif rec.kind == Kind.CHILD_FINISHED:
            child_ends.setdefault(_key(rec.body.get("child_id")), rec.seq)
    for rec in records[:at]:
        body = rec.body
        if rec.kind == _STEP_STARTED:
            ends = step_ends.get(_key(body.get("pos")), [])
            after = bisect.bisect_right(ends, rec.seq)
            end = ends[after] if after < len(ends) else None
            if end is not None and end > at:
                return (f"#{at} falls between the start of step {body.get('name')!r} (#{rec.seq})"
                        f" and its outcome (#{end}); fork at #{rec.seq - 1} or #{end}")
        elif rec.kind == Kind.DELEGATED:
            child = body.get("child_id")
            end = child_ends.get(_key(child))
            if end is None or end > at:
                later = f" or at #{end} or later" if end is not None else ""
                return (f"#{at} is after child {child!r} was delegated (#{rec.seq}) and before"
                        f" its end; the child signals only its own parent: fork before "
                        f"#{rec.seq}{later}")
    gather = _gather_span(records, at)
    if gather is not None:
        pos, first, final = gather
        return (f"#{at} falls inside the gather at position {pos} (#{first}..#{final}); "
                f"fork at #{first - 1} or #{final}")
    return None


def _key(value: object) -> object:
    """A position or id as a dict key (a JSON list or object in a damaged body is not
    hashable: its text stands for it)."""
    return value if isinstance(value, int | str | None) else repr(value)


def _top(pos: object) -> int | None:
    """The top-level position of a branch position (``"3.1.0"``: 3), else ``None``."""
    if not isinstance(pos, str):
        return None
    try:
        return top(pos)
    except ValueError:
        return None


def _gather_span(records: Sequence[Record], at: int) -> tuple[int, int, int] | None:
    """``(position, first seq, last seq)`` of a gather ``at`` falls inside, or ``None``:
    its records are its branches' (positions ``P.b.n``) and its own dormancy (``P``)."""
    branch_top = None
    for rec in reversed(records[:at]):
        pos = rec.body.get("pos")
        if isinstance(pos, str):
            branch_top = _top(pos)
            break
        if isinstance(pos, int) and not isinstance(pos, bool):
            if rec.body.get("cmd") == "gather":
                branch_top = pos
            break
    if branch_top is None:
        return None

    def under(rec: Record) -> bool:
        pos = rec.body.get("pos")
        return _top(pos) == branch_top or (
            pos == branch_top and rec.body.get("cmd") == "gather")

    seqs = [rec.seq for rec in records if under(rec)]
    if not seqs or seqs[-1] <= at:
        return None
    return branch_top, seqs[0], seqs[-1]


def _origin_of(records: Sequence[Record]) -> dict[str, object] | None:
    if not records:
        return None
    context = records[0].body.get("context")
    origin = context.get("forked_from") if isinstance(context, dict) else None
    return origin if isinstance(origin, dict) else None


def _own_data_key(app: App, object_id: str, oid: str) -> None:
    """Give the fork of an object that has a data key one of its own (the original's
    ``encrypt`` setting with it). The copied records keep their sealed values, each
    naming the original (``of``), so they open under the original's key; what the fork
    seals from now on is sealed under its own. ``DataKeyError`` if this App cannot make
    one (it holds no key-encryption key)."""
    row = app.store.data_key(object_id)
    if row is None or app.store.data_key(oid) is not None:
        return
    from perdure.keys.sealer import Sealer

    Sealer(app.store, app.data_keys, oid, seal_all=row.seal_all).data_key(create=True)


def fork(app: App, object_id: str, at: int, new_id: str | None = None) -> Handle:
    """See ``App.fork``."""
    oid = check_object_id(new_id) if new_id is not None else uuid.uuid4().hex
    new, rest, origin, prefix = build(app, object_id, at, oid)
    existing = app.store.get(oid)
    if existing is not None:
        return _existing(app, oid, origin, existing.head_seq, prefix)
    _own_data_key(app, object_id, oid)
    now = app.clock()
    if not app.store.create(new, now):
        existing = app.store.get(oid)
        return _existing(app, oid, origin, existing.head_seq if existing else 0, prefix)
    if rest:
        _finish(app, oid, rest, now)
    head = rest[-1] if rest else new.first
    app.anchors.note(oid, new.first.hash, head.seq, head.hash)
    return Handle(app, oid, created=True)


def forked_first(first: Record, oid: str, trace_id: str, origin: dict[str, object]
                 ) -> Instantiated:
    """The first record's body of fork ``oid`` of the object whose first record is
    ``first``: the same intent (every refinement after it is copied as it is), a new
    context naming its ``origin`` and starting a lineage of its own. ``RecordDecodeError``
    if ``first`` does not decode."""
    body = decode(first)
    if not isinstance(body, Instantiated):
        raise RecordDecodeError(first.object_id, first.seq, "the first record is not "
                                "instantiated")
    context = dataclasses.replace(body.context, object_id=oid, trace_id=trace_id,
                                  parent_id=None, root_id=oid, depth=0, forked_from=origin)
    return Instantiated(body.intent, context)


def build(app: App, object_id: str, at: int, oid: str
          ) -> tuple[NewObject, list[Record], dict[str, object], list[Record]]:
    """The fork ``oid`` of ``object_id`` at record ``at``, not yet stored: its row and
    first record (held back from workers while more records follow), the records after
    the first, its origin (``forked_from``) and the original's verified prefix.
    ``ForkError``, ``IntegrityError`` or ``ObjectNotFoundError`` as ``App.fork`` says."""
    if isinstance(at, bool) or not isinstance(at, int):
        raise ConfigurationError(f"a fork point is a record's seq (a whole number), not {at!r}")
    row, records = app.client.checked_memory(object_id)
    if not 1 <= at <= len(records):
        raise ForkError(f"object {object_id!r} has records #1..#{len(records)}; "
                        f"#{at} is not one of them")
    problem = fork_problem(records, at)
    if problem is not None:
        raise ForkError(f"cannot fork object {object_id!r} at #{at}: {problem}")
    prefix = records[:at]
    origin: dict[str, object] = {"object_id": object_id, "seq": at, "hash": prefix[-1].hash}
    signer = app.client.certified()
    trace_id = uuid.uuid4().hex
    first = forked_first(prefix[0], oid, trace_id, origin)
    now = app.clock()
    copied: list[Record] = []
    prev = GENESIS_HASH
    for rec in prefix:
        draft = (first.draft() if rec.seq == 1
                 else RecordDraft(Kind(rec.kind), rec.body, rec.body_bytes))
        new = seal(draft, object_id=oid, seq=rec.seq, prev_hash=prev, trace_id=trace_id,
                   ts_us=rec.ts_us if rec.seq > 1 else int(now * 1_000_000),
                   policy_ref=rec.policy_ref, signer=signer)
        copied.append(new)
        prev = new.hash
    held = at > 1
    made = NewObject(
        object_id=oid, agent=row.agent, agent_version=first.intent.version, first=copied[0],
        ready_at=HELD_BACK_UNTIL if held else now, parent_id=None,
        requires=first.intent.requires)
    return made, copied[1:], origin, prefix


def _finish(app: App, oid: str, rest: Sequence[Record], now: float) -> None:
    """Append the copied records after the fork's first one and make it runnable."""
    outcome = app.store.apply([Append(
        object_id=oid, epoch=0, records=list(rest), status=Status.READY.value,
        phase=Phase.REENTRY.value, ready_at=now, release=True)], now)
    if outcome and outcome[0] is not None:
        raise outcome[0]


def _existing(app: App, oid: str, origin: dict[str, object], head_seq: int,
              prefix: Sequence[Record]) -> Handle:
    """The fork made before under ``oid`` (finished if a crash cut it short), or
    ``ObjectConflictError`` when ``oid`` is another object."""
    records = app.store.records(oid)
    if _origin_of(records) != origin:
        raise ObjectConflictError(
            f"object {oid!r} already exists and is not a fork of {origin['object_id']!r} "
            f"at #{origin['seq']}; fork under another id")
    if head_seq == 1 and len(prefix) > 1:  # made, then cut short before its records
        trace_id = records[0].trace_id
        copied = [records[0]]
        signer = app.client.certified()
        for rec in prefix[1:]:
            copied.append(seal(RecordDraft(Kind(rec.kind), rec.body, rec.body_bytes),
                               object_id=oid, seq=rec.seq, prev_hash=copied[-1].hash,
                               trace_id=trace_id, ts_us=rec.ts_us,
                               policy_ref=rec.policy_ref, signer=signer))
        _finish(app, oid, copied[1:], app.clock())
        app.anchors.note(oid, copied[0].hash, copied[-1].seq, copied[-1].hash)
    return Handle(app, oid, created=False)
