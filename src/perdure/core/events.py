"""Reserved event names: the events perdure itself sends to an object's inbox.

Every name that starts with ``perdure:`` is perdure's own; ``send`` refuses it from a
user, and the inbox of the dashboard and ``perdure questions`` never list a wait for one.
Each is defined here once, for the API that sends it and the engine that takes it.
"""

from __future__ import annotations

__all__ = ["ACTION_NOTE", "APPROVAL_EVENT", "DEBOUNCED_START", "REFINE_EVENT", "RESERVED_PREFIX",
           "SCHEDULE_EVENT", "UPDATE_EVENT", "is_reserved"]

#: The prefix of every event name perdure reserves for itself.
RESERVED_PREFIX = "perdure:"
#: A decision on a proposed tool call (one name for every proposal of an object).
APPROVAL_EVENT = "perdure:approval"
#: An intent refinement, or an operator's action, in an object's inbox.
REFINE_EVENT = "perdure:refine"
#: A control of a schedule object (pause, resume, trigger, backfill, update, delete).
SCHEDULE_EVENT = "perdure:schedule"
#: An update request (``App.update``) in an object's inbox, ``{"id", "name", "args"}``;
#: the object's reply is an emitted event of the same name, ``{"id", "name", "ok", ...}``.
UPDATE_EVENT = "perdure:update"
#: A refinement event whose payload is ``{ACTION_NOTE: {...}}`` records who acted on the
#: object (pause, resume, cancel, ...) instead of changing its intent.
ACTION_NOTE = "perdure:action"
#: A refinement event whose payload is ``{DEBOUNCED_START: {"args", "kwargs", "start_at",
#: ...}}`` is a later start collapsed into a debounced object that has not run yet: its
#: arguments replace the intent's, and its start time is put off to ``start_at``.
DEBOUNCED_START = "perdure:debounce"


def is_reserved(name: str) -> bool:
    """Whether ``name`` is one of perdure's own event names (``perdure:...``)."""
    return name.startswith(RESERVED_PREFIX)
