"""OpenTelemetry traces of objects, made from the records a node writes.

One trace per object tree: its trace id is the ``trace_id`` every record of the object
carries (a child shares its parent's). The spans:

- ``invoke_agent {agent}``: the object, from its creation to its terminal record (sent
  when it ends; a child's is under its parent's);
- ``claim {agent}``: a node's claim, up to the checked memory;
- ``step {name}``: a step's body, ended by its ``step_done`` or ``step_failed`` record;
- ``wait {what}``: from a ``dormant`` record to the record that resumed the object;
- ``chat {model}``: a model call attempt, with the GenAI conventions' ``gen_ai.*``
  attributes (provider, models, usage tokens, finish reasons, ``error.type``);
- ``execute_tool {name}``: a tool call that ran.

Replay-safe by construction: spans come only from records the node has just written
(``RecordsWritten``), never from memory it replays, and every span id derives from what
identifies it (the record's hash, the object id, the claim's epoch), so a worker killed
and replaced mid-run yields each span once. The hook listener only queues; a thread of
its own builds the spans and hands them to the SDK's batch processor, which exports
them over OTLP/HTTP: the node's event loop does no I/O for tracing.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from perdure.core.records import Kind, Record
from perdure.errors import PerdureError
from perdure.hooks import HookEvent, ObjectClaimed, RecordsWritten
from perdure.llm import provider_name

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["OtelTraces", "span_id_of"]

log = logging.getLogger("perdure.telemetry")

_WAKES = frozenset((Kind.WOKE, Kind.EVENT_RECEIVED, Kind.WAIT_TIMED_OUT,
                    Kind.CHILD_FINISHED))
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def span_id_of(*parts: object) -> int:
    """A 64-bit span id derived from ``parts`` (never 0)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class _GivenIds(IdGenerator):
    """Hands out the span id the builder chose for the next span (one thread builds)."""

    def __init__(self) -> None:
        self.span_id = 1
        self.trace_id = 1

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class OtelTraces:
    """Traces of ``app``'s node, exported over OTLP/HTTP to ``endpoint`` (or through
    ``exporter``, any SDK ``SpanExporter``). Subscribes at once; ``close()`` stops
    listening, builds what is queued and flushes the exporter."""

    def __init__(self, app: App, endpoint: str | None = None, *,
                 exporter: SpanExporter | None = None,
                 schedule_delay_millis: int = 200) -> None:
        self.app = app
        self._ids = _GivenIds()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": "perdure",
                                      "service.instance.id": app.node_id}),
            id_generator=self._ids)
        chosen = exporter if exporter is not None else OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(
            BatchSpanProcessor(chosen, schedule_delay_millis=schedule_delay_millis))
        self._tracer = self.provider.get_tracer("perdure")
        self._queue: queue.SimpleQueue[tuple[HookEvent, float] | None] = queue.SimpleQueue()
        self._claims: dict[str, tuple[int, float, float]] = {}  # oid: epoch, start, end
        self._dormant: dict[str, Record] = {}
        self._objects: dict[str, tuple[str, float, str | None]] = {}
        self._thread = threading.Thread(target=self._drain, name="perdure-traces",
                                        daemon=True)
        self._thread.start()
        self._unsubscribe = app.hooks.subscribe(self._on, RecordsWritten, ObjectClaimed)

    def _on(self, event: HookEvent) -> None:
        """On the node's loop: queue the event, nothing more."""
        self._queue.put((event, time.time()))

    def close(self) -> None:
        """Stop listening, build the spans still queued, export and shut down."""
        self._unsubscribe()
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.provider.force_flush()
        self.provider.shutdown()

    # -- on the tracing thread -------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, at = item
            try:
                if isinstance(event, ObjectClaimed):
                    self._claims[event.object_id] = (event.epoch, at - event.seconds, at)
                elif isinstance(event, RecordsWritten):
                    for rec in event.records:
                        self._record(rec)
            except Exception as exc:  # noqa: BLE001 - tracing never stops the node
                log.warning("traces: a span could not be built: %s: %s",
                            type(exc).__name__, exc, extra={"action": "traces_failed"})

    def _object(self, oid: str) -> tuple[str, float, str | None]:
        """Agent, creation time and parent of ``oid`` (read once from the store)."""
        known = self._objects.get(oid)
        if known is None:
            try:
                row = self.app.store.get(oid)
            except PerdureError:
                row = None
            known = ((row.agent, row.created_at, row.parent_id) if row is not None
                     else ("?", time.time(), None))
            if len(self._objects) > 10_000:
                self._objects.clear()
            self._objects[oid] = known
        return known

    def _span(self, rec: Record, name: str, span_id: int, start: float, end: float,
              attributes: dict[str, Any], *, parent: int | None = None,
              error: str | None = None, kind: SpanKind = SpanKind.INTERNAL) -> None:
        trace_id = int(rec.trace_id, 16) if len(rec.trace_id) == 32 else span_id_of(
            rec.trace_id) << 64 | span_id_of(rec.trace_id, 1)
        parent_id = parent if parent is not None else span_id_of("object", rec.object_id)
        context = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id, parent_id, is_remote=False, trace_flags=_SAMPLED)))
        self._ids.span_id = span_id
        self._ids.trace_id = trace_id
        attributes["perdure.object.id"] = rec.object_id
        span = self._tracer.start_span(name, context=context, kind=kind,
                                       attributes=attributes,
                                       start_time=_ns(min(start, end)))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))

    def _record(self, rec: Record) -> None:
        oid, kind, body, ts = rec.object_id, rec.kind, rec.body, rec.ts
        claim = self._claims.pop(oid, None)
        if claim is not None:
            epoch, start, end = claim
            agent = self._object(oid)[0]
            self._span(rec, f"claim {agent}", span_id_of("claim", oid, epoch), start, end,
                       {"perdure.epoch": epoch, "perdure.node.id": rec.node_id})
        if kind in (Kind.STEP_DONE, Kind.STEP_FAILED):
            latency = float(body.get("latency") or 0.0)
            failed = kind == Kind.STEP_FAILED
            self._span(rec, f"step {body.get('name')}", span_id_of(rec.hash), ts - latency,
                       ts, {"perdure.step.name": str(body.get("name")),
                            "perdure.step.position": str(body.get("pos")),
                            "perdure.step.attempt": int(body.get("attempt") or 0)},
                       error=str(body.get("error_class") or "failed") if failed else None)
        elif kind == Kind.STEP_IN_DOUBT:
            self._span(rec, f"step {body.get('name')}", span_id_of(rec.hash), ts, ts,
                       {"perdure.step.name": str(body.get("name")),
                        "perdure.step.position": str(body.get("pos"))}, error="in_doubt")
        elif kind in (Kind.MODEL_CALL, Kind.MODEL_FAILED):
            self._model(rec)
        elif kind == Kind.TOOL_RESULT and body.get("latency") is not None:
            latency = float(body["latency"])
            outcome = str(body.get("outcome"))
            self._span(rec, f"execute_tool {body.get('name')}", span_id_of(rec.hash),
                       ts - latency, ts, {"gen_ai.operation.name": "execute_tool",
                                          "gen_ai.tool.name": str(body.get("name")),
                                          "gen_ai.tool.call.id": str(body.get("proposal")),
                                          "perdure.tool.outcome": outcome},
                       error=None if outcome == "done" else outcome)
        elif kind == Kind.DORMANT:
            self._dormant[oid] = rec
        elif kind in _WAKES:
            slept = self._dormant.pop(oid, None)
            if slept is not None:
                what = str(slept.body.get("reason") or slept.body.get("cmd") or kind)
                self._span(slept, f"wait {what}", span_id_of(slept.hash), slept.ts, ts,
                           {"perdure.wait.reason": what, "perdure.wait.ended_by": kind})
        elif kind == Kind.TERMINATED:
            self._dormant.pop(oid, None)
            agent, created, parent = self._object(oid)
            status = str(body.get("status") or "")
            self._span(rec, f"invoke_agent {agent}", span_id_of("object", oid), created, ts,
                       {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                        "gen_ai.agent.id": oid, "perdure.status": status},
                       parent=span_id_of("object", parent) if parent else 0,
                       error=None if status == "completed" else status)
            self._objects.pop(oid, None)

    def _model(self, rec: Record) -> None:
        body, ts = rec.body, rec.ts
        if rec.kind == Kind.MODEL_CALL:
            reply = body.get("reply") or {}
            request = body.get("request") or {}
            model = str(request.get("model", ""))
            provider = str(reply.get("provider") or body.get("provider", ""))
            latency = float(reply.get("latency") or 0.0)
            usage = reply.get("usage") or {}
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                "gen_ai.provider.name": provider_name(provider),
                "gen_ai.response.model": str(reply.get("model") or model)}
            for key in ("input_tokens", "output_tokens"):
                if type(usage.get(key)) is int:
                    attrs[f"gen_ai.usage.{key}"] = usage[key]
            if reply.get("finish_reason"):
                attrs["gen_ai.response.finish_reasons"] = [str(reply["finish_reason"])]
            if body.get("cost") is not None:
                attrs["perdure.cost_dollars"] = str(body["cost"])
            self._span(rec, f"chat {model}", span_id_of(rec.hash), ts - latency, ts, attrs,
                       kind=SpanKind.CLIENT)
        else:
            model = str(body.get("model", ""))
            failure = body.get("failure") or {}
            latency = float(body.get("latency") or 0.0)
            self._span(rec, f"chat {model}", span_id_of(rec.hash), ts - latency, ts,
                       {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                        "gen_ai.provider.name": provider_name(str(body.get("provider", ""))),
                        "error.type": str(failure.get("kind") or "error")},
                       error=str(failure.get("kind") or "error"), kind=SpanKind.CLIENT)
