"""What the dashboard does to objects, and who did it: the one place that calls ``App``'s
acting API, including the calls that this version of perdure may not have yet (tool
approvals, questions with a prompt, fork, retry).

Every action puts a note in the object's inbox saying who acts and how
(``record_action``): a sealed refinement event that a node folds into the object's
memory as a ``progress`` record ``{"operator_action": {...}}`` before anything else,
a cancel included. The note goes first; for a retry of a parked object the unpark
waits until the note is recorded (see ``retry``). The API calls that may be absent are
looked up with ``getattr``; when absent, the dashboard says "not available" and does
nothing.
"""

from __future__ import annotations

import inspect
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from perdure.app import App
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.names import check_name
from perdure.engine.actions import ACTION_NOTE, REFINE_EVENT
from perdure.errors import ConfigurationError
from perdure.handle import ObjectInfo
from perdure.web._auth import Principal

__all__ = ["NOT_AVAILABLE", "Question", "approve", "available", "cancel", "fork",
           "pause", "pending_approvals", "questions", "record_action", "reject", "resume",
           "retry", "send"]

NOT_AVAILABLE = "not available in this version of perdure"
_NONCE = re.compile(r"[A-Za-z0-9_-]{8,64}")


def available(app: App, name: str) -> bool:
    """Whether ``app`` has the API ``name`` (``approvals``, ``approve``, ``reject``,
    ``questions``, ``fork``, ``retry``)."""
    return callable(getattr(app, name, None))


def _call(app: App, name: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(app, name, None)
    if not callable(fn):
        raise ConfigurationError(f"{name}: {NOT_AVAILABLE}")
    return fn(*args, **kwargs)


def record_action(app: App, object_id: str, who: Principal, action: str, *,
                  dedupe_key: str | None = None, **details: Any) -> bool:
    """Put the note "``who`` did ``action``" in the object's inbox, sealed by this node,
    for its memory (see the module's docstring); ``False`` when ``dedupe_key`` was used
    before (the same form sent twice)."""
    note = {"action": action, "by": who.name, "role": who.role, "method": who.method,
            "via": "dashboard", "at": time.time(), **details}
    data = encode({ACTION_NOTE: note}, what="action note", max_depth=MAX_DEPTH)
    return app.store.send(object_id, REFINE_EVENT, data, dedupe_key, time.time(),
                          app._seal(object_id, REFINE_EVENT, data, dedupe_key))


# -- what the API of today does ------------------------------------------------------


def send(app: App, who: Principal, object_id: str, event: str, payload: Any,
         nonce: str | None = None) -> bool:
    """Send ``event`` with ``payload`` (the answer to a question, say); ``nonce`` (one per
    form shown) makes a form sent twice deliver its event, and its note, once: ``False``
    for the second."""
    app.get(object_id, explain=False)
    check_name(event, "event name")
    if event.startswith("perdure:"):
        raise ConfigurationError(f"event name {event!r} is reserved; use another name")
    if nonce is not None and not _NONCE.fullmatch(nonce):
        raise ConfigurationError("the form's nonce is damaged; reload the page")
    noted = record_action(app, object_id, who, "send", event=event,
                          dedupe_key=None if nonce is None else f"ui-note:{nonce}")
    if not noted:
        return False
    return app.send(object_id, event, payload,
                    dedupe_key=None if nonce is None else f"ui-send:{nonce}")


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


# -- what may not exist yet ------------------------------------------------------------


def retry(app: App, who: Principal, object_id: str, *, settle: float = 5.0) -> ObjectInfo:
    """Retry a parked object (``app.retry``, else ``app.resume``, which unparks).

    The note goes first and, for a parked object, is let settle: a note wakes a parked
    object, a node records it and lets the object go still parked; an unpark made while
    that node held it would be written over. So the unpark waits (up to ``settle``
    seconds) until the note is in memory and no node holds the object.
    """
    row = app.store.get(object_id)
    if row is None:
        app.get(object_id, explain=False)  # ObjectNotFoundError, worded as everywhere
    mark = secrets.token_hex(8)
    record_action(app, object_id, who, "retry", mark=mark)
    if row is not None and row.parked:
        _settle(app, object_id, mark, settle)
    if available(app, "retry"):
        result = _call(app, "retry", object_id)
        return result if isinstance(result, ObjectInfo) else app.get(object_id)
    return app.resume(object_id)


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
    """A new object from the verified prefix of ``object_id``'s memory up to ``at``;
    its id. ``ConfigurationError`` when this perdure has no ``app.fork``."""
    if not available(app, "fork"):
        raise ConfigurationError(f"fork: {NOT_AVAILABLE}")
    app.get(object_id, explain=False)
    params = inspect.signature(app.fork).parameters
    kwargs: dict[str, Any] = {}
    at_name = next((n for n in ("at", "seq", "at_seq") if n in params), None)
    if at_name is None:
        raise ConfigurationError(f"fork: this perdure's app.fork takes no record number "
                                 f"({NOT_AVAILABLE} from the dashboard)")
    kwargs[at_name] = at
    if new_id is not None:
        id_name = next((n for n in ("new_id", "fork_id", "new_object_id", "as_id", "id")
                        if n in params), None)
        if id_name is None:
            raise ConfigurationError("fork: this perdure's app.fork chooses the new id "
                                     "itself; leave the new id empty")
        kwargs[id_name] = new_id
    made = _call(app, "fork", object_id, **kwargs)
    new = str(getattr(made, "object_id", made))
    record_action(app, new, who, "fork", source=object_id, at=at)
    return new


@dataclass(frozen=True, slots=True)
class Question:
    """An object asking something of a person: the event it waits for, and its words."""

    object_id: str
    agent: str
    event: str
    prompt: Any
    since: float


def questions(app: App, rows: list[Any]) -> list[Question]:
    """Open questions, newest first: what ``app.questions()`` finds (waits with a
    prompt) and every other object waiting for an event (``rows``, from the
    dashboard's query)."""
    found = [Question(q.object_id, q.agent, q.event, q.prompt, q.asked_at)
             for q in app.questions()]
    asked = {q.object_id for q in found}
    # an object waiting for an event without a prompt is a question too: the event answers
    found += [Question(r.object_id, r.agent, str(r.waiting_event), None, r.updated_at)
              for r in rows if r.object_id not in asked]
    found.sort(key=lambda q: q.since, reverse=True)
    return found


def pending_approvals(app: App) -> list[dict[str, Any]] | None:
    """Pending tool approvals across objects, newest first, each as a dict (object_id,
    proposal_id, tool, arguments, risk, requested_at, expires_at); ``None`` when this
    perdure has no approvals."""
    if not available(app, "approvals"):
        return None
    out = []
    for item in _call(app, "approvals"):
        get = item.get if isinstance(item, dict) else (lambda k, i=item: getattr(i, k, None))
        out.append({k: get(k) for k in ("object_id", "proposal_id", "tool", "arguments",
                                        "risk", "requested_at", "expires_at")})
    out.sort(key=lambda a: float(a.get("requested_at") or 0), reverse=True)
    return out


def approve(app: App, who: Principal, object_id: str, proposal_id: str,
            edit: Any = None) -> None:
    """Approve a pending tool call (with ``edit``: changed arguments, gated again)."""
    if not available(app, "approve"):
        raise ConfigurationError(f"approve: {NOT_AVAILABLE}")
    record_action(app, object_id, who, "approve", proposal=proposal_id,
                  edited=edit is not None)
    _call(app, "approve", object_id, proposal_id, edit=edit)


def reject(app: App, who: Principal, object_id: str, proposal_id: str, reason: str) -> None:
    """Reject a pending tool call, saying why."""
    if not available(app, "reject"):
        raise ConfigurationError(f"reject: {NOT_AVAILABLE}")
    record_action(app, object_id, who, "reject", proposal=proposal_id, reason=reason)
    _call(app, "reject", object_id, proposal_id, reason=reason)
