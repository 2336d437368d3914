"""The schedule agent: how a schedule object runs (its rules are ``core.schedules``).

A schedule is an object like any other, so any node carries it and there is no
scheduler process. Its agent loops: a step records the plan of this look (which fires are
due and what they start, skip or cancel, ``core.schedules.plan``), the runs are
delegated as children under ids derived from the fire time, and the object waits for a
control event (``SCHEDULE_EVENT``) until its next fire, or, with a buffered fire, until
the live run ends. Replayed after a crash, the recorded plan gives the same runs, and a
run created before the crash is found by its id, never created twice.

Every ``App`` registers this agent (``definition()``), so every worker serves schedules.
"""

from __future__ import annotations

import contextlib
from typing import Any

from perdure.core.events import SCHEDULE_EVENT
from perdure.core.records import Kind
from perdure.core.schedules import (
    PLAN_STEP,
    SCHEDULE_AGENT,
    Plan,
    ScheduleSpec,
    ScheduleState,
    apply_control,
    plan,
)
from perdure.engine.commands.lineage import _delegate
from perdure.engine.commands.waits import watch_wait
from perdure.engine.run import Run
from perdure.engine.settings import AgentDef
from perdure.errors import CannotDo, ObjectNotFoundError, UnknownAgentError

__all__ = ["CANCEL_STEP", "definition", "schedule"]

CANCEL_STEP = "perdure.schedule.cancel"


def definition() -> AgentDef:
    """The schedule agent, as an ``App`` registers it."""
    return AgentDef(name=SCHEDULE_AGENT, version="1", fn=schedule, is_async=True,
                    requires=frozenset(), encrypt=False)


def _started(run: Run) -> set[str]:
    """The runs this schedule's memory (and this claim) delegated so far."""
    found = {str(rec.body.get("child_id")) for recs in run._history.values()
             for rec in recs if rec.kind == Kind.DELEGATED}
    found.update(run._journal.delegated)
    return found


async def schedule(run: Run, spec_body: dict[str, Any], since: float) -> dict[str, Any]:
    """Run the schedule ``spec_body`` (``ScheduleSpec.to_body``) made at ``since``, until
    it is deleted; its result counts what it did."""
    spec = ScheduleSpec.from_body(spec_body)
    state = ScheduleState(cursor=float(since))
    while True:
        made = Plan.from_body(await run.step(_look, run, spec, state, name=PLAN_STEP))
        state = made.state
        for rid in made.cancel:
            await run.step(_cancel, run, rid, name=CANCEL_STEP)
        for item in made.start:
            begins = float(item["start_at"])
            try:
                await _delegate(run, spec.agent, tuple(spec.args), dict(spec.kwargs),
                                str(item["id"]), begins if begins > item["fire"] else None)
            except UnknownAgentError as exc:  # another node may serve it
                raise CannotDo(str(exc)) from None
        got, payload = await watch_wait(run, SCHEDULE_EVENT, made.next_fire, made.watch)
        if got:
            spec, state = apply_control(spec, state, payload)
            if state.deleted:
                return {"deleted": True, "started": state.started, "skipped": state.skipped,
                        "dropped": state.dropped, "last_run": state.last_run}


def _look(run: Run, spec: ScheduleSpec, state: ScheduleState) -> dict[str, Any]:
    """The plan of this look. Runs only when memory holds no plan at this position yet:
    what memory holds now is what the schedule knows at this look (the plan's record
    makes it so on every replay)."""
    started = _started(run)
    return plan(spec, state, run._clock(), set(run._children), started.__contains__
                ).to_body()


async def _cancel(run: Run, object_id: str) -> str:
    """Ask a previous run to cancel (``overlap="cancel_previous"``)."""
    if run._cancel is not None:
        with contextlib.suppress(ObjectNotFoundError):  # gone: nothing to cancel
            await run._cancel(object_id)
    return object_id
