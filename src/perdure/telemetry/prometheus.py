"""Prometheus metrics of a node and of its store, through the official client.

:class:`PrometheusMetrics` listens on an ``App``'s hooks for what the node does (claims,
steps, commits, wake-ups, lost leases, the event loop's lag, and the records it writes:
model calls with their tokens and cost, retries, steps in doubt, failed restores), and
reads what the store holds at scrape time (objects by agent and status, approvals
waiting, queue depths and slots, schedule lag) through a collector whose answer is kept
for ``store_cache_seconds``: one grouped read per scrape window, never one per object.

No label holds an object id: every label takes its values from a bounded set (statuses,
reasons, outcomes) or from what the code names (agents, queues, schedules, providers and
models), and values read from records are capped (``MAX_LABEL_VALUES`` per label, the
rest counted as ``other``), so the number of series does not grow with the number of
objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from perdure.core.records import Kind, Record
from perdure.errors import PerdureError
from perdure.hooks import (
    ClaimRound,
    CommitBatch,
    HookEvent,
    IntegrityFailure,
    LeaseLost,
    LoopLag,
    ObjectClaimed,
    ObjectDormant,
    ObjectTerminated,
    ObjectWoke,
    RecordsWritten,
    StepRecorded,
)

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["CONTENT_TYPE", "MAX_LABEL_VALUES", "PrometheusMetrics"]

log = logging.getLogger("perdure.telemetry")

#: The media type of the text exposition format this module serves.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Distinct values one label may take from records (models, providers, reasons); past
#: that, a new value is counted as ``other``.
MAX_LABEL_VALUES = 50
_MAX_SCHEDULES = 100

# Seconds: from a millisecond commit to a minutes-long model call.
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
         300.0)
_LATE = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Bounded:
    """The values a label has taken; a new one past the cap is ``other``."""

    def __init__(self, cap: int = MAX_LABEL_VALUES) -> None:
        self._seen: set[str] = set()
        self._cap = cap
        self._lock = threading.Lock()

    def __call__(self, value: object) -> str:
        text = value if isinstance(value, str) else str(value)
        text = text[:80] or "unknown"
        if text in self._seen:
            return text
        with self._lock:
            if len(self._seen) >= self._cap:
                return "other"
            self._seen.add(text)
        return text


class PrometheusMetrics:
    """A node's and its store's metrics in a registry of their own.

    ``PrometheusMetrics(app)`` subscribes to ``app.hooks`` at once (``hooks=False``: only
    the store's figures, as a dashboard without a worker serves); ``serve(port)`` starts
    the exposition server in a thread, ``exposition()`` gives the text a ``/metrics``
    route returns, ``close()`` unsubscribes.
    """

    def __init__(self, app: App, *, registry: CollectorRegistry | None = None,
                 hooks: bool = True, store_cache_seconds: float = 10.0) -> None:
        self.app = app
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._model = _Bounded()
        self._provider = _Bounded()
        self._reason = _Bounded()
        self.claim_rounds = Counter(
            "perdure_claim_rounds_total", "Claim rounds: the node asked the store for work.",
            ["result"], registry=r)
        self.claim_seconds = Histogram(
            "perdure_claim_duration_seconds",
            "From a claim to the object's checked memory, before agent code runs.",
            ["memory"], buckets=_FAST, registry=r)
        self.step_seconds = Histogram(
            "perdure_step_duration_seconds", "How long a step's body ran.", ["outcome"],
            buckets=_SLOW, registry=r)
        self.model_seconds = Histogram(
            "perdure_model_call_duration_seconds",
            "How long a model call attempt took (as recorded).",
            ["provider", "model", "outcome"], buckets=_SLOW, registry=r)
        self.tokens = Counter(
            "perdure_model_tokens_total", "Tokens of recorded model calls.",
            ["provider", "model", "type"], registry=r)
        self.cost = Counter(
            "perdure_model_cost_dollars_total", "Priced cost of recorded model calls.",
            ["provider", "model"], registry=r)
        self.wake_seconds = Histogram(
            "perdure_wake_delay_seconds",
            "From a dormant object's due time to the moment its agent runs again.",
            ["reason"], buckets=_LATE, registry=r)
        self.dormant = Counter(
            "perdure_dormant_total", "Objects that let go of their lease to wait.",
            ["reason"], registry=r)
        self.ended = Counter(
            "perdure_objects_ended_total", "Objects whose terminal record this node wrote.",
            ["status"], registry=r)
        self.commits = Counter(
            "perdure_commits_total", "Group commits of the node.", registry=r)
        self.commit_records = Counter(
            "perdure_committed_records_total", "Records the node committed.", registry=r)
        self.commit_refused = Counter(
            "perdure_commit_refused_total", "Appends the store refused (fenced).",
            registry=r)
        self.commit_seconds = Histogram(
            "perdure_commit_duration_seconds", "How long the store took for one commit.",
            buckets=_FAST, registry=r)
        self.lease_lost = Counter(
            "perdure_lease_lost_total", "Objects this node learnt it no longer held.",
            registry=r)
        self.integrity = Counter(
            "perdure_integrity_failures_total",
            "Objects parked because their memory did not verify.", registry=r)
        self.loop_lag = Histogram(
            "perdure_event_loop_lag_seconds",
            "How late the node's event loop ran a periodic timer.", buckets=_LATE,
            registry=r)
        self.loop_lag_worst = Gauge(
            "perdure_event_loop_lag_worst_seconds",
            "The worst event-loop lag since the node started.", registry=r)
        self.retries = Counter(
            "perdure_retries_total", "Failed attempts that will be retried.",
            ["what", "reason"], registry=r)
        self.in_doubt = Counter(
            "perdure_in_doubt_total",
            "Steps and tool calls found in doubt (started, never known to end).",
            ["what"], registry=r)
        self.tool_calls = Counter(
            "perdure_tool_calls_total", "How recorded tool calls ended.", ["outcome"],
            registry=r)
        self.restore_failures = Counter(
            "perdure_restore_failures_total",
            "Reentries whose restore of live resources did not succeed.", ["outcome"],
            registry=r)
        self._store = _StoreCollector(app, store_cache_seconds)
        r.register(self._store)
        self._unsubscribe: Callable[[], None] | None = None
        if hooks:
            self._unsubscribe = app.hooks.subscribe(self._on)

    # -- serving -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the text exposition format (what ``/metrics`` returns)."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the server
        (``server.shutdown()`` stops it). Port 0 picks a free one
        (``server.server_port``)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server

    def close(self) -> None:
        """Stop listening to the node's hooks."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    # -- the node's events ---------------------------------------------------------------

    def _on(self, event: HookEvent) -> None:
        match event:
            case StepRecorded():
                self.step_seconds.labels("ok" if event.ok else "failed").observe(event.seconds)
            case CommitBatch():
                self.commits.inc()
                self.commit_records.inc(event.records)
                if event.refused:
                    self.commit_refused.inc(event.refused)
                self.commit_seconds.observe(event.seconds)
            case RecordsWritten():
                for rec in event.records:
                    self._record(rec)
            case ObjectClaimed():
                self.claim_seconds.labels("held" if event.held else "read").observe(
                    event.seconds)
            case ClaimRound():
                result = "failed" if event.failed else "claimed" if event.claimed else "empty"
                self.claim_rounds.labels(result).inc()
            case ObjectDormant():
                self.dormant.labels(self._reason(event.reason)).inc()
            case ObjectWoke():
                if event.late is not None:
                    self.wake_seconds.labels(self._reason(event.reason)).observe(
                        max(0.0, event.late))
            case ObjectTerminated():
                self.ended.labels(self._reason(event.status)).inc()
            case LeaseLost():
                self.lease_lost.inc()
            case IntegrityFailure():
                self.integrity.inc()
            case LoopLag():
                self.loop_lag.observe(event.seconds)
                self.loop_lag_worst.set(event.worst)
            case _:
                pass

    def _record(self, rec: Record) -> None:
        kind = rec.kind
        body = rec.body
        if kind == Kind.MODEL_CALL:
            self._model_call(body)
        elif kind == Kind.MODEL_FAILED:
            provider = self._provider(body.get("provider", ""))
            model = self._model(body.get("model", ""))
            latency = body.get("latency")
            if isinstance(latency, int | float):
                self.model_seconds.labels(provider, model, "failed").observe(latency)
            if not body.get("final"):
                failure = body.get("failure") or {}
                self.retries.labels("model", self._reason(failure.get("kind", "unknown"))
                                    ).inc()
        elif kind == Kind.STEP_FAILED:
            if not body.get("final"):
                self.retries.labels("step", self._reason(body.get("error_class", "unknown"))
                                    ).inc()
        elif kind == Kind.STEP_IN_DOUBT:
            self.in_doubt.labels("step").inc()
        elif kind == Kind.TOOL_RESULT:
            outcome = self._reason(body.get("outcome", "unknown"))
            self.tool_calls.labels(outcome).inc()
            if outcome == "in_doubt":
                self.in_doubt.labels("tool").inc()
        elif kind == Kind.RESTORE_REPORT:
            restored = body.get("outcome")
            if restored not in ("restored", "moved"):
                self.restore_failures.labels(self._reason(restored)).inc()

    def _model_call(self, body: dict[str, Any]) -> None:
        reply = body.get("reply") or {}
        request = body.get("request") or {}
        provider = self._provider(reply.get("provider") or body.get("provider", ""))
        model = self._model(reply.get("model") or request.get("model", ""))
        latency = reply.get("latency")
        if isinstance(latency, int | float):
            self.model_seconds.labels(provider, model, "ok").observe(latency)
        usage = reply.get("usage") or {}
        for key, kind in (("input_tokens", "input"), ("output_tokens", "output"),
                          ("cached_input_tokens", "cached_input")):
            value = usage.get(key)
            if type(value) is int and value > 0:
                self.tokens.labels(provider, model, kind).inc(value)
        cost = body.get("cost")
        if cost is not None:
            try:
                dollars = float(Decimal(str(cost)))
            except (InvalidOperation, ValueError):
                return
            if dollars > 0:
                self.cost.labels(provider, model).inc(dollars)


class _StoreCollector(Collector):
    """What the store holds, read at scrape time and kept for ``ttl`` seconds."""

    def __init__(self, app: App, ttl: float) -> None:
        self._app = app
        self._ttl = ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] = (-1e18, [])

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time only: registering reads nothing

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            at, metrics = self._cached
            now = time.monotonic()
            if now - at >= self._ttl:
                metrics = self._read()
                self._cached = (now, metrics)
        yield from metrics

    def _read(self) -> list[Metric]:
        up = GaugeMetricFamily("perdure_store_up",
                               "Whether the last read of the store for metrics succeeded.")
        try:
            out = [*self._objects(), *self._queues(), *self._schedules()]
        except (PerdureError, OSError) as exc:
            log.warning("metrics: the store could not be read: %s", exc,
                        extra={"action": "metrics_store_failed"})
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *out]

    def _objects(self) -> list[Metric]:
        objects = GaugeMetricFamily("perdure_objects", "Objects by agent and status "
                                    "(parked and paused shown as such).",
                                    labels=["agent", "status"])
        approvals = GaugeMetricFamily("perdure_approvals_waiting",
                                      "Objects waiting for a decision on a tool call.",
                                      labels=["agent"])
        waiting: dict[str, int] = {}
        for count in self._app.store.object_counts():
            objects.add_metric([count.agent, count.status], count.count)
            waiting[count.agent] = waiting.get(count.agent, 0) + count.approvals
        for agent, n in sorted(waiting.items()):
            approvals.add_metric([agent], n)
        return [objects, approvals]

    def _queues(self) -> list[Metric]:
        held = GaugeMetricFamily("perdure_queue_slots_held",
                                 "Slots of the queue held (objects under a live lease).",
                                 labels=["queue"])
        ready = GaugeMetricFamily("perdure_queue_ready",
                                  "Objects of the queue runnable now, waiting for a slot "
                                  "or a worker.", labels=["queue"])
        waiting = GaugeMetricFamily("perdure_queue_waiting",
                                    "Objects of the queue sleeping or waiting for an event.",
                                    labels=["queue"])
        limit = GaugeMetricFamily("perdure_queue_concurrency_limit",
                                  "The queue's concurrency limit (queues with one).",
                                  labels=["queue"])
        for stats in self._app.store.queue_stats(time.time()):
            name = stats.queue.name
            held.add_metric([name], stats.held)
            ready.add_metric([name], stats.ready)
            waiting.add_metric([name], stats.waiting)
            if stats.queue.concurrency is not None:
                limit.add_metric([name], stats.queue.concurrency)
        return [held, ready, waiting, limit]

    def _schedules(self) -> list[Metric]:
        lag = GaugeMetricFamily("perdure_schedule_lag_seconds",
                                "How late the schedule's last run was created after its "
                                "planned fire time.", labels=["schedule"])
        nxt = GaugeMetricFamily("perdure_schedule_next_fire_timestamp_seconds",
                                "When the schedule fires next (seconds since the epoch).",
                                labels=["schedule"])
        store = self._app.store
        for info in self._app.schedules()[:_MAX_SCHEDULES]:
            if info.state == "deleted":
                continue
            if info.next_fire is not None:
                nxt.add_metric([info.name], info.next_fire)
            if info.last_fire is not None and info.last_run:
                row = store.get(info.last_run)
                if row is not None:
                    lag.add_metric([info.name], max(0.0, row.created_at - info.last_fire))
        return [lag, nxt]
