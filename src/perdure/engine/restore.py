"""Reentry: bring back every resource the object holds, all or nothing, before its code runs.

Memory is read from the newest record back: the latest descriptor of each resource
decides (superseded ones are never decoded again; a descriptor recaptured since its
declaration is in the resource's checkpoint slot, ``engine.slots``, verified before it
is used), a resource whose latest state is
``closed`` stays closed, and a declaration an ``invalidated`` record voided is skipped.
Each resource is restored from its descriptor and validated, in declaration order:

- fresh: kept; stale: its ``on_stale`` policy decides — ``refresh`` (recapture and record
  the new descriptor), ``invalidate:<step>`` (record an invalidation: replay runs the
  commands from that step's position on again), ``park`` or ``fail``;
- if any fails, those already restored are closed again (rollback) and the failure is
  recorded: ``CannotRestoreError`` as a negative capability of this node (the object
  moves to another), an unknown descriptor version or a permanent error parks it, anything
  else makes it retry with semantic backoff.

Every reentry that has resources writes one restore report (what, how long, what was
stale or failed, the outcome) before the agent continues; ``perdure show`` prints it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.backoff import ErrorClass, Failure, RetryPolicy, classify, next_delay
from perdure.core.bodies import CapabilityMissing, Invalidated, Parked, RestoreReport
from perdure.core.lifecycle import Status
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.commands.positions import top
from perdure.engine.commands.resources import Held, clean_descriptor, put_descriptors
from perdure.engine.signals import Park, Suspend
from perdure.engine.slots import Slot, resource_slot
from perdure.errors import (
    CannotRestoreError,
    DescriptorVersionError,
    PerdureSignal,
    ResourceStaleError,
)
from perdure.resources._protocol import Stale, recipe_for

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["RESTORE_RETRY", "close_resources", "held_resources", "restore_resources"]

log = logging.getLogger("perdure.resources")

RESTORE_RETRY = RetryPolicy()  # how failed restores are paced (then the object parks)
_RESOURCE = Kind.RESOURCE.value
_INVALIDATED = Kind.INVALIDATED.value
_REPORT = Kind.RESTORE_REPORT.value
_CLASSES = frozenset(c.value for c in ErrorClass)


@dataclass(frozen=True, slots=True)
class _Declared:
    name: str
    pos: int | str
    body: dict[str, Any]  # the latest descriptor: its record's body, or its slot's
    seq: int = 0  # the latest resource record's position in the chain


def held_resources(records: Sequence[Record], slots: Mapping[str, Slot] | None = None,
                   opened: Callable[[Any], Any] | None = None) -> list[_Declared]:
    """The resources memory says are held, each by its latest descriptor, in declaration
    order; read from the newest record back, so superseded descriptors are not decoded.

    A resource's checkpoint slot (``slots``, verified; its value through ``opened``)
    holds a newer descriptor than its records when it follows the latest of them."""
    latest: dict[str, _Declared] = {}
    voided_from: int | None = None  # the lowest position an invalidation seen so far voids
    for rec in reversed(records):
        kind = rec.kind
        if kind == _INVALIDATED:
            at = int(rec.body["from_pos"])
            voided_from = at if voided_from is None else min(voided_from, at)
            continue
        if kind != _RESOURCE:
            continue
        body = rec.body
        decl = body.get("pos", body.get("decl"))
        if decl is None or (voided_from is not None and top(decl) >= voided_from):
            continue
        name = str(body["name"])
        if name not in latest:
            latest[name] = _Declared(name, decl, body, rec.seq)
    found = [d for d in latest.values() if d.body.get("state") == "open"]
    if slots:
        found = [_slotted(d, slots, opened) for d in found]
    return sorted(found, key=lambda d: (top(d.pos), str(d.pos)))


def _slotted(declared: _Declared, slots: Mapping[str, Slot],
             opened: Callable[[Any], Any] | None) -> _Declared:
    """``declared`` with its slot's descriptor when the slot follows its latest record
    (a slot older than that record, left by a crash before its deletion, is ignored)."""
    slot = slots.get(resource_slot(declared.name))
    if slot is None or slot.after_seq < declared.seq:
        return declared
    body = opened(slot.value) if opened is not None else slot.value
    if not isinstance(body, dict) or body.get("name") != declared.name or (
            body.get("state") != "open"):
        raise ValueError(f"checkpoint slot of resource {declared.name!r} holds no open "
                         f"descriptor of it")
    return _Declared(declared.name, declared.pos, {**declared.body, **body}, declared.seq)


class _StaleStopError(Exception):
    """A stale resource whose policy parks the object or fails it (never leaves this
    module: it is turned into a park or a ``ResourceStaleError``)."""

    def __init__(self, name: str, reason: str, policy: str) -> None:
        super().__init__(reason)
        self.name, self.reason, self.policy = name, reason, policy


async def restore_resources(run: Run, records: Sequence[Record]) -> None:
    """Restore what ``records`` say ``run`` holds into ``run._held`` (see the module)."""
    try:
        declared = held_resources(records, run._slots, run._opened)
    except (KeyError, TypeError, ValueError) as exc:  # a body no node of ours writes
        why = f"a resource record in memory is malformed ({type(exc).__name__}: {exc})"
        raise Park(RuntimeError(why), Parked(why, "resource", 0).draft()) from None
    if not declared:
        return
    node = run._journal.signer.node_id
    began = time.perf_counter()
    entries: list[dict[str, Any]] = []
    drafts: list[RecordDraft] = []
    restored: list[Held] = []
    invalidate: list[tuple[int, str, str, str]] = []  # (from_pos, step, resource, reason)
    refreshed: list[Held] = []  # their new descriptors go to their slots
    current: _Declared | None = None
    t0 = began
    try:
        for current in declared:
            t0 = time.perf_counter()
            held = await _restore_one(current)
            restored.append(held)
            validity = await held.recipe.validate(held.descriptor, held.live)
            entry: dict[str, Any] = {"name": held.name, "type": current.body["type"],
                                     "status": "restored"}
            if isinstance(validity, Stale):
                entry["reason"] = validity.reason
                policy = held.on_stale
                if policy == "refresh":
                    held.descriptor = clean_descriptor(held.name, await held.recipe.recapture(
                        held.descriptor, held.live))
                    refreshed.append(held)
                    entry["status"] = "refreshed"
                elif policy.startswith("invalidate:"):
                    step = policy.partition(":")[2]
                    at = _first_step(run, step)
                    if at is not None:
                        invalidate.append((at, step, held.name, validity.reason))
                    held.descriptor = clean_descriptor(held.name, await held.recipe.recapture(
                        held.descriptor, held.live))
                    drafts.append(held.record(run).draft())
                    entry["status"] = "invalidated" if at is not None else "refreshed"
                else:
                    entry["status"] = "stale"
                    entry["seconds"] = round(time.perf_counter() - t0, 6)
                    entries.append(entry)
                    raise _StaleStopError(held.name, validity.reason, policy)
            entry["seconds"] = round(time.perf_counter() - t0, 6)
            entries.append(entry)
    except BaseException as exc:
        await _rollback(restored)
        rolled = {h.name for h in restored}
        for entry in entries:
            if entry["name"] in rolled:
                entry["rolled_back"] = True
        if current is not None and not isinstance(exc, _StaleStopError | PerdureSignal):
            entries.append({"name": current.name, "type": current.body["type"],
                            "status": "failed", "reason": _reason(exc),
                            "seconds": round(time.perf_counter() - t0, 6)})
        done = {e["name"] for e in entries}
        entries.extend({"name": d.name, "type": d.body["type"], "status": "not restored",
                        "seconds": 0.0} for d in declared if d.name not in done)
        if isinstance(exc, PerdureSignal):
            raise
        await _failed(run, records, node, began, entries, current, exc)
        raise  # _failed always raises; this keeps the type checker sure of it
    # All restored: invalidate first (voided resources are declared again by the code).
    if invalidate:
        start = min(at for at, _, _, _ in invalidate)
        for at, step, name, reason in invalidate:
            drafts.append(Invalidated(at, step, name, reason).draft())
        keep = []
        for held in restored:
            if top(held.pos) >= start:
                await _rollback([held])
            else:
                keep.append(held)
        restored = keep
        run._invalidate(start)
    report = RestoreReport("restored", node, round(time.perf_counter() - began, 6), entries)
    try:
        await run._journal.commit([*drafts, report.draft()])
        kept = [h for h in refreshed if h in restored]
        if kept:
            await put_descriptors(run, kept)
    except BaseException:  # (a lost lease, the store gone): nothing stays open
        await _rollback(restored)
        raise
    run._held.update((h.name, h) for h in restored)


async def _restore_one(declared: _Declared) -> Held:
    body = declared.body
    recipe = recipe_for(str(body["type"]))
    version = int(body["version"])
    if version not in recipe.versions:
        raise DescriptorVersionError(declared.name, str(body["type"]), version,
                                     tuple(recipe.versions))
    descriptor = dict(body["descriptor"])
    live = await recipe.restore(descriptor)
    return Held(declared.name, recipe, declared.pos, version, str(body["on_stale"]),
                descriptor, live)


def _first_step(run: Run, step: str) -> int | None:
    """The first top-level position memory holds a step named ``step`` at."""
    found = [pos for pos, recs in run._history.items()
             if isinstance(pos, int) and recs[0].body.get("cmd") == "step"
             and recs[0].body.get("name") == step]
    found += [pos for pos, rec in run._done.items()
              if isinstance(pos, int) and rec.body.get("name") == step]
    return min(found) if found else None


async def _rollback(restored: Sequence[Held]) -> None:
    for held in reversed(restored):
        try:
            await held.recipe.close(held.live)
        except Exception:
            log.warning("closing resource %s during rollback failed", held.name,
                        exc_info=True, extra={"action": "resource_close_failed"})


async def close_resources(run: Run) -> None:
    """Close every resource the run holds (the node lets the object go); they stay held
    in memory and come back at the next reentry."""
    held, run._held = list(run._held.values()), {}
    again, run._replayed = list(run._replayed.values()), {}
    await _rollback([*again, *held])


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _earlier_failures(records: Sequence[Record]) -> list[Failure]:
    """The failed restores since the last good one (newest last)."""
    failed: list[Failure] = []
    for rec in reversed(records):
        if rec.kind != _REPORT:
            continue
        if rec.body.get("outcome") == "restored":
            break
        named = next((e.get("error_class") for e in rec.body["resources"]
                      if e.get("status") == "failed"), None)
        error_class = ErrorClass(named) if named in _CLASSES else ErrorClass.UNKNOWN
        failed.append(Failure(len(failed) + 1, error_class, 0.0, None))
    failed.reverse()
    return [Failure(i + 1, f.error_class, f.latency, f.retry_after)
            for i, f in enumerate(failed)]


async def _failed(run: Run, records: Sequence[Record], node: str, began: float,
                  entries: list[dict[str, Any]], current: _Declared | None,
                  exc: BaseException) -> None:
    """Record a restore that did not go through, and unwind as its cause says."""
    seconds = round(time.perf_counter() - began, 6)
    name = current.name if current is not None else "?"
    pos = current.pos if current is not None else 0
    now = run._clock()
    if isinstance(exc, CannotRestoreError):
        report = RestoreReport("moved", node, seconds, entries)
        raise Suspend([report.draft(), CapabilityMissing.cannot(
            node, f"resource {name}", exc.reason, pos, now).draft()],
            ready_at=now, status=Status.READY, avoid_node=node,
            reason=f"node {node} cannot restore resource {name}: {exc.reason}",
            note=f"node {node} cannot restore resource {name}: {exc.reason}"[:500]) from None
    if isinstance(exc, _StaleStopError) and exc.policy == "fail":
        await run._journal.commit([RestoreReport("failed", node, seconds, entries).draft()])
        raise ResourceStaleError(exc.name, exc.reason) from None
    if isinstance(exc, _StaleStopError | DescriptorVersionError):
        why = (f"resource {name!r} is stale: {exc.reason}" if isinstance(exc, _StaleStopError)
               else str(exc))
        await run._journal.commit([RestoreReport("parked", node, seconds, entries).draft()])
        raise Park(RuntimeError(why), Parked(why, "resource", 0).draft()) from None
    error_class = classify(exc)
    for entry in entries:
        if entry["status"] == "failed":
            entry["error_class"] = str(error_class)
    history = [*_earlier_failures(records)]
    history.append(Failure(len(history) + 1, error_class, seconds, None))
    delay = next_delay(history, RESTORE_RETRY, salt=f"{run.object_id}/restore/{name}")
    if delay is None:
        why = (f"resource {name!r} could not be restored ({_reason(exc)}) after "
               f"{len(history)} attempt(s); fix the cause, then `perdure resume "
               f"{run.object_id}`")
        await run._journal.commit([RestoreReport("parked", node, seconds, entries).draft()])
        raise Park(RuntimeError(why), Parked(why, "resource", 0).draft()) from None
    retry_at = now + delay
    raise Suspend([RestoreReport("rolled_back", node, seconds, entries, retry_at).draft()],
                  ready_at=retry_at,
                  reason=f"restoring resource {name} failed; retry in {delay:.3f}s") from None
