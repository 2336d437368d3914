"""Prometheus metrics: a real ``perdure worker --metrics`` process scraped over HTTP and
parsed with the official parser; series bounded whatever the number of objects."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from perdure.telemetry import prometheus_metrics
from tests.integration.engine_support import wait_until
from tests.integration.test_semantics import running
from tests.telemetry import support

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all((k, w) in ls for k, w in labels.items()))


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def test_a_worker_serves_its_metrics_over_http(store_url: str, key_dir: Path,
                                               tmp_path: Path) -> None:
    """A worker with ``--metrics 0`` serves /metrics; after it ran a few objects the
    scrape says what it did: objects by agent and status from the store, steps and
    their durations, a retry by its reason, commits, claims, wake-ups, loop lag."""
    app = support.app.with_settings(store=store_url, key_dir=key_dir)
    handles = [app.start(support.chain, 3) for _ in range(4)]
    handles.append(app.start(support.flaky, str(tmp_path / "marks")))
    log = tmp_path / "worker.log"
    proc = support.start_worker(store_url, key_dir, log, "--metrics", "0")
    try:
        port = int(support.wait_for_line(log, r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                                         proc).group(1))
        for handle in handles:
            handle.result(timeout=60)
        url = f"http://127.0.0.1:{port}/metrics"
        samples: Samples = {}

        def caught_up() -> bool:
            samples.clear()
            samples.update(_samples(_scrape(url)))
            # ... and the worker's count of ends, heard a moment after the commit that a
            # result() returns on.
            return (_value(samples, "perdure_objects", agent="chain", status="completed") == 4
                    and _value(samples, "perdure_objects_ended_total",
                               status="completed") == 5)
        # The store's figures are kept for a few seconds between reads.
        assert wait_until(caught_up, timeout=30, interval=0.5), samples
        assert _value(samples, "perdure_store_up") == 1
        assert _value(samples, "perdure_objects", agent="flaky", status="completed") == 1
        assert _value(samples, "perdure_step_duration_seconds_count", outcome="ok") >= 13
        assert _value(samples, "perdure_step_duration_seconds_count", outcome="failed") >= 1
        assert _value(samples, "perdure_retries_total", what="step", reason="transient") == 1
        assert _value(samples, "perdure_commits_total") >= 5
        assert _value(samples, "perdure_claim_duration_seconds_count") >= 5
        assert _value(samples, "perdure_wake_delay_seconds_count") >= 1
        assert _value(samples, "perdure_objects_ended_total", status="completed") == 5
        assert ("perdure_event_loop_lag_worst_seconds", ()) in samples
        assert not any("object_id" in dict(labels) for _, labels in samples)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_port_in_use_is_one_line(sqlite_url: str, key_dir: Path, tmp_path: Path) -> None:
    """A metrics port already taken: the worker says so in one line and exits 1."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "worker.log"
        proc = support.start_worker(sqlite_url, key_dir, log, "--metrics", str(port))
        assert proc.wait(timeout=60) == 1
    assert f"error: cannot serve metrics on 127.0.0.1:{port}" in log.read_text()


def test_series_stay_bounded_with_ten_thousand_objects(sqlite_url: str, key_dir: Path
                                                       ) -> None:
    """10,000 objects of a few agents and statuses, some of them run by a node: the
    scrape holds fewer than 500 series, and no label names an object."""
    app = support.app.with_settings(store=sqlite_url, key_dir=key_dir)
    metrics = prometheus_metrics(app, store_cache_seconds=0)
    try:
        started = time.monotonic()
        for i in range(10_000):
            app.options(delay=3600 if i % 10 else None).start(support.chain, 0)
        assert time.monotonic() - started < 60
        with running(app):
            assert wait_until(lambda: _value(_samples(metrics.exposition().decode()),
                                             "perdure_objects", status="completed") > 100,
                              timeout=30, interval=0.2)
        samples = _samples(metrics.exposition().decode())
        assert _value(samples, "perdure_objects") == 10_000
        assert len(samples) < 500, len(samples)
        assert not any("object_id" in dict(labels) for _, labels in samples)
    finally:
        metrics.close()


def test_the_dashboard_serves_metrics_to_a_token(sqlite_url: str, key_dir: Path) -> None:
    """The dashboard's /metrics: the store's figures to a bearer token with the read
    scope; refused without one (and a session cookie is no token)."""
    from contextlib import closing

    from perdure import web
    from tests.web.support import serve, stop_serving

    app = support.app.with_settings(store=sqlite_url, key_dir=key_dir)
    app.start(support.chain, 1)
    app.options(delay=3600).start(support.chain, 1)
    dashboard = serve(sqlite_url, key_dir)
    try:
        token, _ = web.api_tokens(key_dir).create("prometheus", ["read"])
        with closing(dashboard.client()) as client:
            assert client.get("/metrics").status_code == 401
            assert client.get("/metrics", headers={
                "Authorization": "Bearer nope"}).status_code == 401
            got = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert got.status_code == 200, got.text
            samples = _samples(got.text)
        assert _value(samples, "perdure_objects", agent="chain") == 2
        assert _value(samples, "perdure_store_up") == 1
    finally:
        stop_serving(dashboard)
