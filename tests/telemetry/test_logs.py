"""JSON logs: a worker process with ``--log-json`` writes one JSON object per line."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.integration.engine_support import wait_until
from tests.telemetry import support


def test_a_worker_logs_one_json_object_per_line(sqlite_url: str, key_dir: Path,
                                                tmp_path: Path) -> None:
    """Every line the worker logs parses as JSON with time, level, logger and message;
    an agent's own log call inside a step carries its object id, its trace id and the
    ``action`` it gave; the node's own lines carry theirs."""
    app = support.app.with_settings(store=sqlite_url, key_dir=key_dir)
    handle = app.start(support.chain, 2)
    trace = app.store.records(handle.object_id)[0].trace_id
    log = tmp_path / "worker.log"
    proc = support.start_worker(sqlite_url, key_dir, log, "--log-json")
    try:
        assert handle.result(timeout=60) == 2
        assert wait_until(lambda: log.read_text().count('"test_step"') == 2, timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    lines = [line for line in log.read_text().splitlines()
             if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert docs, log.read_text()
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= set(doc)
        assert doc["time"].endswith("Z")
    steps = [d for d in docs if d.get("action") == "test_step"]
    assert [d["message"] for d in steps] == ["step 1 of 2 done", "step 2 of 2 done"]
    for doc in steps:
        assert doc["object_id"] == handle.object_id
        assert doc["trace_id"] == trace
        assert doc["logger"] == "tests.telemetry" and doc["level"] == "WARNING"
    # The node's own lines (its drain on SIGTERM) are JSON too, with their action.
    assert any(d["logger"].startswith("perdure") and "action" in d for d in docs), docs
