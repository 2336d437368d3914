"""Structured logs: one JSON object per line, for log shippers (Loki, Elasticsearch, ...).

Each line holds ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, the
``action`` perdure's log calls name (a stable key to filter on), the ``object_id`` where
known (given with the call, or the object whose step is running when the line is
logged, so an agent's own ``logging`` calls inside a step carry it), its ``trace_id``
(the one the object's records carry, learnt from what the node writes) and any other
``extra`` values; an exception adds ``exc_type`` and ``exc``.

    perdure worker --log-json               # or PERDURE_LOG_JSON=1
    perdure.telemetry.json_logging(app)     # in a program of your own
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from perdure.engine.context import current_step
from perdure.hooks import HookEvent, ObjectClaimed, RecordsWritten

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["JsonFormatter", "TraceIds", "json_logging"]

# Attributes every LogRecord has: whatever else it holds came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class TraceIds:
    """The trace id of the objects a node wrote records of lately (at most ``size``),
    learnt from its hooks."""

    def __init__(self, size: int = 10_000) -> None:
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def __call__(self, event: HookEvent) -> None:
        """Learn from ``ObjectClaimed`` and ``RecordsWritten`` (a hooks listener)."""
        if isinstance(event, ObjectClaimed):
            if event.trace_id:
                self._learn(event.object_id, event.trace_id)
        elif isinstance(event, RecordsWritten):
            for rec in event.records:
                self._learn(rec.object_id, rec.trace_id)

    def _learn(self, object_id: str, trace_id: str) -> None:
        if object_id in self._ids:
            return
        with self._lock:
            self._ids[object_id] = trace_id
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)

    def get(self, object_id: str) -> str | None:
        """The object's trace id, if known."""
        return self._ids.get(object_id)


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module); ``traces`` gives trace ids
    of object ids."""

    def __init__(self, traces: TraceIds | None = None) -> None:
        super().__init__()
        self.traces = traces

    def format(self, record: logging.LogRecord) -> str:
        """One JSON object, no newline inside."""
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if "object_id" not in out:
            with contextlib.suppress(RuntimeError):  # not inside a step
                out["object_id"] = current_step().object_id
        oid = out.get("object_id")
        if "trace_id" not in out and isinstance(oid, str) and self.traces is not None:
            trace = self.traces.get(oid)
            if trace is not None:
                out["trace_id"] = trace
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["exc_type"] = type(exc).__name__
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def json_logging(app: App | None = None, *, level: int | None = None,
                 stream: IO[str] | None = None) -> Callable[[], None]:
    """Make the root logger write one JSON object per line to ``stream`` (stderr),
    replacing its handlers; with ``app``, trace ids are learnt from what its node writes.
    ``level`` sets the root logger's level when given. Returns a function that undoes
    it (restores the handlers, stops listening)."""
    traces = TraceIds() if app is not None else None
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(traces))
    root = logging.getLogger()
    before = root.handlers[:]
    old_level = root.level
    for h in before:
        root.removeHandler(h)
    root.addHandler(handler)
    if level is not None:
        root.setLevel(level)
    stop = (app.hooks.subscribe(traces, ObjectClaimed, RecordsWritten)
            if app is not None and traces is not None else None)

    def undo() -> None:
        root.removeHandler(handler)
        for h in before:
            root.addHandler(h)
        root.setLevel(old_level)
        if stop is not None:
            stop()

    return undo
