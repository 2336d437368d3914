"""What the dashboard and the HTTP API do to objects, and who did it: the one place that
calls ``App``'s acting API (start, send, pause, resume, cancel, retry, fork, tool
approvals, questions).

Every action puts a note in the object's inbox saying who acts and how
(``record_action``): a sealed refinement event that a node folds into the object's
memory as a ``progress`` record ``{"operator_action": {...}}`` before anything else,
a cancel included. The note goes first; for a retry of a parked object the unpark
waits until the note is recorded (see ``retry``).

A tool approval is a decision signed with the serving process's key (its node id is
the identity the gate checks against the approvers of the call's risk level); the
person logged in (or the API token's name) is named in the signed decision's reason and
in the note. A server whose identity may not decide on a call is refused before anything
is written.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from perdure.app import App
from perdure.approvals import decide, waiting_decision
from perdure.core.approvals import PendingApproval, pending_in
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.events import ACTION_NOTE, APPROVAL_EVENT, REFINE_EVENT, is_reserved
from perdure.core.lifecycle import Status
from perdure.core.names import check_name
from perdure.core.questions import Question as AskedQuestion
from perdure.core.questions import may_ask
from perdure.errors import (
    ApprovalError,
    ConfigurationError,
    ObjectTerminatedError,
    RecordDecodeError,
)
from perdure.handle import Handle
from perdure.info import ObjectInfo
from perdure.web._auth import Principal

__all__ = ["SCHEDULE_ACTIONS", "Question", "approve", "cancel", "fork", "pause",
           "pending_approvals", "questions", "record_action", "reject", "resume", "retry",
           "schedule_control", "send", "start"]

_NONCE = re.compile(r"[A-Za-z0-9_-]{8,64}")
_MAX_REASON = 2000


def record_action(app: App, object_id: str, who: Principal, action: str, *,
                  dedupe_key: str | None = None, **details: Any) -> bool:
    """Put the note "``who`` did ``action``" in the object's inbox, sealed by this node,
    for its memory (see the module's docstring); ``False`` when ``dedupe_key`` was used
    before (the same form sent twice)."""
    note = {"action": action, "by": who.name, "role": who.role, "method": who.method,
            "via": who.via, "at": time.time(), **details}
    if who.credential is not None:
        note["token"] = who.credential
    data = encode({ACTION_NOTE: note}, what="action note", max_depth=MAX_DEPTH)
    return app.store.send(object_id, REFINE_EVENT, data, dedupe_key, time.time(),
                          app.client.seal_event(object_id, REFINE_EVENT, data, dedupe_key))


# -- what the API of today does ------------------------------------------------------


def start(app: App, who: Principal, agent: str, args: list[Any], kwargs: dict[str, Any],
          *, object_id: str | None = None, deadline: float | None = None,
          max_failures: int | None = None, labels: dict[str, str] | None = None,
          budget: Any = None) -> Handle:
    """Start an object running ``agent(*args, **kwargs)`` with these start options (see
    ``App.options``); the note of who started it goes into its memory when this call
    created it (an id that exists already gives that object, and notes nothing)."""
    handle = app.options(object_id=object_id, deadline=deadline, max_failures=max_failures,
                         labels=labels, budget=budget).start(agent, *args, **kwargs)
    if handle.created:
        record_action(app, handle.object_id, who, "start", agent=agent)
    return handle


def send(app: App, who: Principal, object_id: str, event: str, payload: Any,
         nonce: str | None = None, *, dedupe_key: str | None = None) -> bool:
    """Send ``event`` with ``payload`` (the answer to a question, say); ``nonce`` (one per
    form shown) makes a form sent twice deliver its event, and its note, once: ``False``
    for the second. ``dedupe_key`` (the API's) is the event's own dedupe key, as
    ``App.send`` takes it; its note is sent once per key too."""
    app.get(object_id, explain=False)
    check_name(event, "event name")
    if is_reserved(event):
        raise ConfigurationError(f"event name {event!r} is reserved; use another name")
    if nonce is not None and not _NONCE.fullmatch(nonce):
        raise ConfigurationError("the form's nonce is damaged; reload the page")
    note_key: str | None
    event_key: str | None
    if dedupe_key is not None:
        check_name(dedupe_key, "dedupe key")
        note_key, event_key = f"api-note:{dedupe_key}", dedupe_key
    elif nonce is not None:
        note_key, event_key = f"ui-note:{nonce}", f"ui-send:{nonce}"
    else:
        note_key = event_key = None
    noted = record_action(app, object_id, who, "send", event=event, dedupe_key=note_key)
    if not noted:
        return False
    return app.send(object_id, event, payload, dedupe_key=event_key)


def pause(app: App, who: Principal, object_id: str) -> ObjectInfo:
    """Hold the object at its next command boundary."""
    app.get(object_id, explain=False)
    record_action(app, object_id, who, "pause")
    return app.pause(object_id)


def resume(app: App, who: Principal, object_id: str) -> ObjectInfo:
    """Release a paused object."""
    app.get(object_id, explain=False)
    record_action(app, object_id, who, "resume")
    return app.resume(object_id)


def cancel(app: App, who: Principal, object_id: str) -> ObjectInfo:
    """Ask the object to stop; the note of who asked is folded in before it ends."""
    app.get(object_id, explain=False)
    record_action(app, object_id, who, "cancel")
    return app.cancel(object_id)


# -- schedules ---------------------------------------------------------------------------

#: What a person may do to a schedule from the dashboard (``ScheduleHandle``'s methods).
SCHEDULE_ACTIONS = ("pause", "resume", "trigger", "delete")


def schedule_control(app: App, who: Principal, name: str, action: str) -> None:
    """Pause, resume, trigger or delete the schedule ``name``: the note of who did it goes
    into the schedule's memory first (``schedule_pause``, ...), then the control, as
    ``ScheduleHandle`` sends it. A schedule that is not there, or was deleted, is refused
    before anything is written."""
    if action not in SCHEDULE_ACTIONS:
        raise ConfigurationError(f"unknown schedule action {action!r}")
    handle = app.schedule_handle(name)  # ObjectNotFoundError: nothing written
    info = app.get(handle.object_id, explain=False)
    if info.terminal:
        raise ObjectTerminatedError(f"schedule {name!r} was deleted; it takes no control")
    record_action(app, handle.object_id, who, f"schedule_{action}", schedule=name)
    getattr(handle, action)()


# -- retry, fork -----------------------------------------------------------------------


def retry(app: App, who: Principal, object_id: str, *, settle: float = 5.0) -> ObjectInfo:
    """Retry a parked object (``app.retry``; ``NotParkedError`` if it is not parked).

    The note goes first and is let settle: a note wakes a parked object, a node records
    it and lets the object go still parked; an unpark made while that node held it would
    be written over. So the unpark waits (up to ``settle`` seconds) until the note is in
    memory and no node holds the object.
    """
    info = app.get(object_id, explain=False)
    if info.status != "parked":
        app.retry(object_id)  # NotParkedError, worded as everywhere; nothing written
    mark = secrets.token_hex(8)
    record_action(app, object_id, who, "retry", mark=mark)
    _settle(app, object_id, mark, settle)
    return app.retry(object_id)


def _settle(app: App, object_id: str, mark: str, timeout: float) -> None:
    """Wait until the note ``mark`` is in the object's memory and no node holds it (or
    ``timeout`` passes: no live node took it, so none can write over what follows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = app.store.get(object_id)
        if row is None:
            return
        held = row.lease_owner is not None and (row.lease_expires or 0) > time.time()
        if not held:
            recent = app.store.records(object_id, max(0, row.head_seq - 20))
            if any(isinstance(r.body.get("fields"), dict)
                   and isinstance(r.body["fields"].get("operator_action"), dict)
                   and r.body["fields"]["operator_action"].get("mark") == mark
                   for r in recent if r.kind == "progress"):
                return
        time.sleep(0.05)


def fork(app: App, who: Principal, object_id: str, at: int, new_id: str | None) -> str:
    """A new object from the verified prefix of ``object_id``'s memory up to ``at``
    (``app.fork``); its id. The note of who forked goes into the new object's memory."""
    app.get(object_id, explain=False)
    made: Handle = app.fork(object_id, at=at, new_id=new_id)
    record_action(app, made.object_id, who, "fork", source=object_id, at=at)
    return made.object_id


# -- questions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Question:
    """An object asking something of a person: the event it waits for, its words and the
    answers it offers (``None``: any payload)."""

    object_id: str
    agent: str
    event: str
    prompt: Any
    since: float
    choices: tuple[Any, ...] | None = None

    @classmethod
    def asked(cls, q: AskedQuestion) -> Question:
        """The dashboard's form of a question ``app.questions()`` found."""
        return cls(q.object_id, q.agent, q.event, q.prompt, q.asked_at, q.choices)


def questions(app: App) -> list[Question]:
    """Open questions, newest first: what ``app.questions()`` finds (and ``perdure
    questions`` prints), every pending wait for an event sent from outside, with its
    prompt and choices or without. An object whose row waits for such an event but
    whose memory this node cannot vouch for (another cluster's key) is listed too, from
    its row, without its words: what it asks is not shown, the wait is."""
    found = [Question.asked(q) for q in app.questions(limit=200)]
    listed = {q.object_id for q in found}
    for row in app.store.list(status=Status.DORMANT.value, limit=200):
        if (row.object_id not in listed and row.waiting_event is not None
                and may_ask(row.note, row.waiting_event)):
            found.append(Question(row.object_id, row.agent, row.waiting_event, None,
                                  row.updated_at))
    found.sort(key=lambda q: q.since, reverse=True)
    return found


# -- tool approvals ------------------------------------------------------------------------


def pending_approvals(app: App) -> tuple[list[PendingApproval], list[str]]:
    """Pending tool approvals across objects, newest first (what ``app.approvals()``
    lists), and what could not be read: an object whose memory cannot be decoded is
    named there, and the others are still listed."""
    try:
        found = app.approvals()
        problems: list[str] = []
    except RecordDecodeError:  # one damaged object: read them one by one
        found, problems = [], []
        for row in app.store.list(status="dormant", phase=None, agent=None, parent=None,
                                  limit=1000):
            if row.waiting_event != APPROVAL_EVENT:
                continue
            try:
                found.extend(pending_in(app.history(row.object_id, opened=True)))
            except RecordDecodeError as exc:
                problems.append(f"object {row.object_id}: its memory cannot be read "
                                f"({exc}); see `perdure verify {row.object_id}`")
    return sorted(found, key=lambda a: a.requested_at, reverse=True), problems


def _waiting(app: App, object_id: str, proposal_id: str) -> PendingApproval:
    """The proposal, if a decision on it may be signed (``approvals.waiting_decision``:
    the one policy of the CLI, the API and the dashboard), before the dashboard notes who
    decides; else the error saying why, nothing written."""
    app.get(object_id, explain=False)
    return waiting_decision(app, object_id, proposal_id)


def _note_decision(app: App, who: Principal, target: PendingApproval, action: str,
                   **details: Any) -> None:
    """The note of who decides, once per proposal and serving identity (the dashboard
    and the API of one key folder share it, as they share the signature): a decision
    this identity sent already (not yet folded into memory) is refused, nothing
    written."""
    key = f"ui-decision:{target.proposal_id}:{target.args_hash[:16]}:{app.node_id}"
    if not record_action(app, target.object_id, who, action, dedupe_key=key,
                         proposal=target.proposal_id, tool=target.tool, **details):
        place = "this dashboard" if who.via == "dashboard" else f"this server ({app.node_id})"
        raise ApprovalError(f"proposal {target.proposal_id!r} of object "
                            f"{target.object_id!r} was decided from {place} already "
                            "(the object has not taken the decision up yet); a decision "
                            "cannot be changed")


def _signed_reason(who: Principal, reason: str) -> str:
    """The decision's reason, naming the person logged in (it is signed with it)."""
    said = f"{who.name} ({who.role}, {who.method}) via {who.via}"
    return f"{reason} [{said}]" if reason else f"by {said}"


def _reason(reason: str, *, required: bool) -> str:
    reason = reason.strip()
    if required and not reason:
        raise ConfigurationError("say why the proposal is rejected")
    if len(reason) > _MAX_REASON:
        raise ConfigurationError(f"the reason is longer than {_MAX_REASON} characters")
    return reason


def approve(app: App, who: Principal, object_id: str, proposal_id: str,
            edit: dict[str, Any] | None = None, *, reason: str = "") -> PendingApproval:
    """Approve a pending tool call (with ``edit``: new arguments for the same tool,
    which go through the gate again); the decision is signed with this process's key and
    names ``who`` (after ``reason``, if given)."""
    if edit is not None and not isinstance(edit, dict):
        raise ConfigurationError("edited arguments must be a JSON object, e.g. "
                                 '{"amount": 90}')
    reason = _reason(reason, required=False)
    target = _waiting(app, object_id, proposal_id)
    _note_decision(app, who, target, "edit" if edit is not None else "approve",
                   **({"reason": reason} if reason else {}))
    return decide(app, object_id, proposal_id, "approve" if edit is None else "edit",
                  reason=_signed_reason(who, reason), edit=edit)


def reject(app: App, who: Principal, object_id: str, proposal_id: str,
           reason: str) -> PendingApproval:
    """Reject a pending tool call, saying why (the model is told ``reason``)."""
    reason = _reason(reason, required=True)
    target = _waiting(app, object_id, proposal_id)
    _note_decision(app, who, target, "reject", reason=reason)
    return decide(app, object_id, proposal_id, "reject", reason=_signed_reason(who, reason))
