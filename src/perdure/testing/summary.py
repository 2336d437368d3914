"""``Summary``: where an object stands after ``Environment.run``, in one value.

Ended (its result or error), or waiting: for an event or an answer to a question, for a
person to decide on a tool call, for its children, for its timer, to be resumed or
retried. Read from the store's row and the object's memory, the way ``App.get``,
``App.questions`` and ``App.approvals`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.approvals import PendingApproval, pending_in
from perdure.core.events import APPROVAL_EVENT
from perdure.core.lifecycle import Status
from perdure.core.questions import Question, pending_questions
from perdure.engine.run import CHILD_EVENT

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["Summary", "summarize"]


@dataclass(frozen=True, slots=True)
class Summary:
    """Where one object stands: ``status``, and what it waits for.

    ``waiting_for`` is ``None`` once the object ended (``done``), else one of
    ``"event"`` (a ``run.wait_for``: ``event`` names it, ``questions`` holds what it
    asks), ``"approval"`` (tool calls waiting for a person: ``approvals``),
    ``"children"`` (``children`` still running or waiting), ``"timer"`` (a sleep, a
    retry's pause: due at ``wake_at``), ``"resume"`` (paused), ``"retry"`` (parked:
    ``note`` says why) or ``"node"`` (runnable, but no node of the environment can take
    it: ``note`` says why). ``wake_at`` is when it is looked at again even without
    what it waits for (a wait's timeout, an approval's deadline, the object's deadline);
    ``now`` is the environment's time when this was read. A completed object has its
    ``result``; a failed one its ``error`` (``{"type", "message"}``).
    """

    object_id: str
    status: Status
    waiting_for: str | None
    now: float
    event: str | None = None
    wake_at: float | None = None
    questions: tuple[Question, ...] = ()
    approvals: tuple[PendingApproval, ...] = ()
    children: tuple[str, ...] = ()
    result: Any = None
    error: dict[str, Any] | None = None
    note: str | None = None

    @property
    def done(self) -> bool:
        """True once the object completed, failed or was cancelled."""
        return self.status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

    @property
    def question(self) -> Question | None:
        """The first question the object asks, or ``None``."""
        return self.questions[0] if self.questions else None

    @property
    def approval(self) -> PendingApproval | None:
        """The first tool call waiting for a person, or ``None``."""
        return self.approvals[0] if self.approvals else None

    def __str__(self) -> str:
        head = f"{self.object_id}: {self.status}"
        if self.status is Status.COMPLETED:
            return f"{head}, result {self.result!r}"
        if self.status is Status.FAILED and self.error is not None:
            return f"{head}: {self.error.get('type')}: {self.error.get('message')}"
        if self.waiting_for is None:
            return head
        what = {"event": f"event {self.event!r}", "children": "children " + ", ".join(
            self.children), "approval": "approval of " + ", ".join(
            f"{p.tool} ({p.proposal_id})" for p in self.approvals)}.get(
            self.waiting_for, self.waiting_for)
        if self.question is not None and self.question.prompt is not None:
            what += f" (asking {self.question.prompt!r})"
        if self.wake_at is not None:
            what += f", looked at again in {max(0.0, self.wake_at - self.now):g}s"
        if self.note and self.waiting_for in ("retry", "node", "resume"):
            what += f": {self.note}"
        return f"{head}, waiting for {what}"


def summarize(app: App, object_id: str, *, runnable: bool = True) -> Summary:
    """Where ``object_id`` stands now in ``app``'s store (``runnable=False``: a runnable
    object counts as one no node takes: ``waiting_for`` is ``"node"``)."""
    info = app.get(object_id)
    now = app.clock()
    status = info.status
    base: dict[str, Any] = {"object_id": object_id, "status": status, "now": now,
                            "note": info.note, "event": info.waiting_event,
                            "wake_at": info.ready_at}
    if info.terminal:
        body = app.outcome(object_id)
        error = body.get("error")
        return Summary(**{**base, "event": None, "wake_at": None}, waiting_for=None,
                       result=body.get("result"),
                       error=dict(error) if isinstance(error, dict) else (
                           {"type": "cancelled" if status is Status.CANCELLED else "unknown",
                            "message": str(body.get("reason", ""))}
                           if status is not Status.COMPLETED else None))
    if status is Status.PARKED:
        return Summary(**base, waiting_for="retry")
    if status is Status.PAUSED:
        return Summary(**base, waiting_for="resume")
    if status in (Status.READY, Status.RUNNING):
        due = info.ready_at is not None and info.ready_at <= now
        waiting = None if runnable or status is Status.RUNNING else (
            "node" if due else "timer")
        return Summary(**base, waiting_for=waiting)
    event = info.waiting_event
    if event is None:
        return Summary(**base, waiting_for="timer")
    if event == CHILD_EVENT:
        children = tuple(child.object_id for child in app.list(parent=object_id,
                                                               limit=10_000)
                         if not child.terminal)
        return Summary(**base, waiting_for="children", children=children)
    records = app.history(object_id, opened=True)
    if event == APPROVAL_EVENT:
        return Summary(**base, waiting_for="approval", approvals=tuple(pending_in(records)))
    return Summary(**base, waiting_for="event",
                   questions=tuple(pending_questions(records, info.agent)))
