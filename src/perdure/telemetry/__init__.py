"""Operations: metrics, traces and logs that operators' own tools read.

Everything here listens on an ``App``'s hooks (``perdure.hooks``) or reads its store, as
any program could; nothing in the engine changes for it, and a node with none of it
configured builds nothing and pays nothing.

- :func:`prometheus_metrics`: Prometheus metrics of the node and of the store (extra
  ``perdure[prometheus]``); ``perdure worker --metrics PORT`` serves them, and so does
  the dashboard at ``/metrics``.
- :func:`json_logging`: one JSON object per log line, with the object id, the trace id
  and the ``action`` of perdure's log calls (``perdure worker --log-json``).
- :class:`Alerts` (``perdure.telemetry.alerts``): alert and notification rules every
  worker evaluates against the store, fired and resolved once whatever the number of
  nodes, delivered to the log and to a signed webhook.
- :func:`otel_traces`: OpenTelemetry traces of objects, steps, waits, tool and model
  calls, sent over OTLP/HTTP (extra ``perdure[otel]``; ``perdure worker --otlp URL``).

See docs/howto/operations.md for the metric and span names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perdure.errors import ConfigurationError
from perdure.telemetry.alerts import (
    Alert,
    Alerts,
    ApprovalWaiting,
    FailureRate,
    FewWorkers,
    NewApproval,
    NewQuestion,
    NoProgress,
    Parked,
    Rule,
)
from perdure.telemetry.logs import JsonFormatter, json_logging

if TYPE_CHECKING:
    from perdure.app import App
    from perdure.telemetry.prometheus import PrometheusMetrics
    from perdure.telemetry.traces import OtelTraces

__all__ = [
    "Alert",
    "Alerts",
    "ApprovalWaiting",
    "FailureRate",
    "FewWorkers",
    "JsonFormatter",
    "NewApproval",
    "NewQuestion",
    "NoProgress",
    "Parked",
    "Rule",
    "json_logging",
    "otel_traces",
    "prometheus_metrics",
]


def _need(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise ConfigurationError(f"this needs perdure[{extra}]: pip install "
                                 f"'perdure[{extra}]'") from None


def prometheus_metrics(app: App, *, hooks: bool = True,
                       store_cache_seconds: float = 10.0) -> PrometheusMetrics:
    """The node's and the store's Prometheus metrics, in a registry of their own
    (``.registry``); listening on ``app.hooks`` unless ``hooks`` is False. Serve them
    with ``.serve(port, host)`` or hand ``.exposition()`` to a route.
    ``ConfigurationError`` without the ``perdure[prometheus]`` extra."""
    _need("prometheus_client", "prometheus")
    from perdure.telemetry.prometheus import PrometheusMetrics

    return PrometheusMetrics(app, hooks=hooks, store_cache_seconds=store_cache_seconds)


def otel_traces(app: App, endpoint: str | None = None, **options: Any) -> OtelTraces:
    """Send OpenTelemetry traces of what ``app``'s node writes to the OTLP/HTTP
    ``endpoint`` (``http://host:4318/v1/traces``; None: the exporter's own settings,
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``).
    ``options`` go to ``OtelTraces``. ``ConfigurationError`` without ``perdure[otel]``."""
    _need("opentelemetry.sdk", "otel")
    _need("opentelemetry.exporter.otlp.proto.http", "otel")
    from perdure.telemetry.traces import OtelTraces

    return OtelTraces(app, endpoint, **options)
