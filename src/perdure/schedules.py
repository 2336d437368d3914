"""Schedules from outside: creating one, listing them, and steering one by name.

``app.schedule(name, agent, *args, cron=... | interval=..., ...)`` creates (once: the
call is idempotent on ``name``) a schedule object that starts ``agent(*args,
**kwargs)`` at every fire, and returns a ``ScheduleHandle``; ``app.schedules()`` lists
what each schedule's memory says (``ScheduleInfo``); ``app.schedule_handle(name)``
steers an existing one. Each control (pause, resume, trigger, backfill, update,
delete) is a signed event the schedule's memory receives, the next time a node looks at
it (at once when a worker runs). The rules are in ``perdure.core.schedules``, the agent
in ``perdure.engine.schedules``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from perdure.core.arguments import check_arguments
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.events import SCHEDULE_EVENT
from perdure.core.lifecycle import Status
from perdure.core.records import Kind
from perdure.core.schedules import (
    MAX_FIRES,
    SCHEDULE_AGENT,
    ScheduleInfo,
    ScheduleSpec,
    control_payload,
    read_schedule,
    schedule_id,
)
from perdure.engine.instantiate import instantiate
from perdure.engine.schedules import definition
from perdure.errors import (
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    ScheduleError,
)
from perdure.info import ObjectInfo
from perdure.keys.sealer import needs_sealing

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["ScheduleHandle", "ScheduleInfo", "create_schedule", "list_schedules"]

_SPEC_OPTIONS = ("cron", "timezone", "interval", "overlap", "catch_up_window", "jitter")


def _instant(value: Any, what: str) -> float:
    """Seconds since the epoch from a number or an aware ``datetime``."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ScheduleError(f"{what} is a datetime with a time zone, or seconds since "
                                "the epoch")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScheduleError(f"{what} is seconds since the epoch or an aware datetime, not "
                            f"{value!r}")
    return float(value)


class ScheduleHandle:
    """A schedule, by name, from outside. ``created`` is true when ``app.schedule``
    created it; ``differs`` says how an existing schedule of that name differs from the
    spec asked (it is left as it is: ``update`` changes it)."""

    def __init__(self, app: App, name: str, *, created: bool = False,
                 differs: str | None = None) -> None:
        self.app = app
        self.name = name
        self.object_id = schedule_id(name)
        self.created = created
        self.differs = differs

    def __repr__(self) -> str:
        return f"ScheduleHandle({self.name!r})"

    def info(self) -> ScheduleInfo:
        """What the schedule's memory says now: spec, state, next and last fire."""
        self.app.get(self.object_id, explain=False)
        return read_schedule(self.app.store.records(self.object_id))

    def runs(self, limit: int = 100) -> builtins.list[ObjectInfo]:
        """The runs it started (its child objects), newest first."""
        return self.app.list(parent=self.object_id, limit=limit)

    def _control(self, op: str, **values: Any) -> None:
        row = self.app.store.get(self.object_id)
        if row is None or row.agent != SCHEDULE_AGENT:
            raise ObjectNotFoundError(f"no schedule {self.name!r} in {self.app.store_url}")
        if row.status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED):
            raise ObjectTerminatedError(f"schedule {self.name!r} was deleted (its object "
                                        f"{self.object_id!r} has ended)")
        payload = control_payload(op, self.app.clock(), **values)
        data = encode(payload, what="schedule control", max_depth=MAX_DEPTH)
        self.app.store.send(self.object_id, SCHEDULE_EVENT, data, None, self.app.clock(),
                            self.app.client.seal_event(self.object_id, SCHEDULE_EVENT, data,
                                                       None))

    def pause(self) -> None:
        """Stop firing; fires while paused are dropped (resuming never catches up)."""
        self._control("pause")

    def resume(self) -> None:
        """Fire again from now on."""
        self._control("resume")

    def trigger(self) -> None:
        """Start a run now (``name@<now>-manual``), by the overlap policy, paused or not."""
        self._control("trigger")

    def delete(self) -> None:
        """End the schedule: it starts nothing more; its runs go on, its memory stays,
        and its name stays taken."""
        self._control("delete")

    def backfill(self, start: float | datetime, end: float | datetime) -> int:
        """Start the runs of the fires in ``[start, end)`` (seconds since the epoch or
        aware datetimes) by the overlap policy, oldest first; a fire whose run exists
        already is not started again. Returns how many fires the range holds (at most
        ``MAX_FIRES``, else ``ScheduleError``)."""
        low, high = _instant(start, "start"), _instant(end, "end")
        if high <= low:
            raise ScheduleError("a backfill's end comes after its start")
        spec = self.info().spec
        count = len([f for f in spec.fires_between(low - 1e-6, high, MAX_FIRES + 2)
                     if f < high])
        if count > MAX_FIRES:
            raise ScheduleError(f"the range holds more than {MAX_FIRES} fires; backfill it "
                                "in parts")
        self._control("backfill", start=low, end=high)
        return count

    def update(self, **changes: Any) -> ScheduleSpec:
        """Change the spec: ``cron``, ``timezone``, ``interval``, ``overlap``,
        ``catch_up_window``, ``jitter``, ``args`` (a list), ``kwargs`` (a mapping); to go
        from a cron to an interval, give ``interval=...`` and ``cron=None``. Checked here
        (``ScheduleError``) before it is sent; returns the new spec."""
        unknown = set(changes) - {*_SPEC_OPTIONS, "args", "kwargs"}
        if unknown:
            raise ScheduleError(f"a schedule's {', '.join(sorted(unknown))} cannot be "
                                "updated")
        old = self.info().spec
        merged = {key: getattr(old, key) for key in _SPEC_OPTIONS}
        if "interval" in changes and changes["interval"] is not None:
            merged["cron"] = None
            merged["timezone"] = None
        if "cron" in changes and changes["cron"] is not None:
            merged["interval"] = None
        if merged["interval"] is not None:
            merged["timezone"] = None
        merged.update({k: v for k, v in changes.items() if k in _SPEC_OPTIONS})
        args = tuple(changes.get("args", old.args))
        kwargs = dict(changes.get("kwargs", old.kwargs))
        definition_fn = self.app._resolve(old.agent)
        check_arguments(definition_fn.fn, args, kwargs, agent=old.agent)
        spec = ScheduleSpec.make(self.name, old.agent, args, kwargs, **merged)
        _check_plain(self.app, old.agent, args, kwargs)
        self._control("update", spec=spec.to_body())
        return spec


def _check_plain(app: App, agent: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                 ) -> None:
    """A schedule keeps its runs' arguments in its own memory, in clear."""
    if needs_sealing(args, kwargs, seal_all=app._resolve(agent).encrypt):
        raise ScheduleError(
            f"agent {agent!r} seals its arguments (perdure.Secret values, or encrypt=True) "
            "but a schedule keeps them in its memory in clear; give the runs a reference "
            "(a secret's name) instead")


def create_schedule(app: App, name: str, agent: Callable[..., Any] | str,
                    args: tuple[Any, ...], kwargs: dict[str, Any],
                    options: Mapping[str, Any]) -> ScheduleHandle:
    """``App.schedule``: check everything, then create the schedule object once."""
    target = app._resolve(agent)
    spec = ScheduleSpec.make(name, target.name, args, kwargs, **options)
    check_arguments(target.fn, args, kwargs, agent=target.name)
    _check_plain(app, target.name, args, kwargs)
    encode(spec.to_body(), what=f"arguments of schedule {name!r}", max_depth=MAX_DEPTH)
    oid = schedule_id(name)
    row = app.store.get(oid)
    if row is None:
        now = app.clock()
        new = instantiate(definition(), (spec.to_body(), now), {}, object_id=oid,
                          signer=app.client.certified(), policy_ref=app.policy.ref, now=now)
        if app.store.create(new, now):
            app.anchors.note(oid, new.first.hash, new.first.seq, new.first.hash)
            return ScheduleHandle(app, name, created=True)
        row = app.store.get(oid)
    if row is not None and row.agent != SCHEDULE_AGENT:
        raise ObjectConflictError(f"object {oid!r} exists and is no schedule (it runs agent "
                                  f"{row.agent!r})")
    handle = ScheduleHandle(app, name)
    was = handle.info().spec
    if was != spec:
        mine, theirs = spec.to_body(), was.to_body()
        keys = [k for k in mine if mine[k] != theirs.get(k)]
        handle.differs = (f"schedule {name!r} exists with another {', '.join(keys)}; it is "
                          "left as it is (ScheduleHandle.update changes it)")
    return handle


def list_schedules(app: App, limit: int = 1000) -> builtins.list[ScheduleInfo]:
    """Every schedule in the store, by name, as its memory says."""
    found = []
    for row in app.store.list(agent=SCHEDULE_AGENT, limit=limit):
        records = app.store.records(row.object_id)
        if records and records[0].kind == Kind.INSTANTIATED:
            found.append(read_schedule(records))
    return sorted(found, key=lambda info: info.name)
