"""``python -m bench --only model --quick``: the model-call figures are all there.

Speed is never checked, nor the bounds (PASS/FAIL is a figure): only that each figure
is present and positive, and that LangGraph's is a figure or "n/a" with its reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]


def test_model_bench_quick_prints_every_figure(tmp_path: Path) -> None:
    """Bytes per turn at each quick length (perdure, LangGraph or n/a) and the stream's
    tokens per second for the plain SDK, perdure's client and ``run.model``."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "model", "--dir", str(tmp_path),
         "--backends", "sqlite_full"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["parts"] == ["model"]
    conv = report["model"]["conversation"]
    assert conv["verdict"] in ("PASS", "FAIL")
    lengths = [k for k in conv if k.isdigit()]
    assert lengths
    for key in lengths:
        got = conv[key]
        assert got["turns"] == int(key)
        assert got["unique_messages"] == 2 * got["turns"] + 1
        for figure in ("store_bytes_per_turn", "record_bytes_per_turn",
                       "unique_message_bytes_per_turn", "records_to_unique"):
            assert got[figure] > 0, figure
        peer = got["langgraph"]
        if "na" in peer:
            assert peer["na"]
        else:
            assert peer["messages"] == got["unique_messages"]
            assert peer["store_bytes_per_turn"] > 0
            assert got["langgraph_to_perdure_store"] > 0
            saver = got["langgraph_perdure_saver"]
            assert saver["messages"] == got["unique_messages"]
            assert saver["checkpoints"] == peer["checkpoints"]
            assert got["perdure_saver_to_sqlite_saver"] > 0
    for key in ("stream", "stream_paced"):
        stream = report["model"][key]
        for figure in ("plain_sdk_tokens_per_s", "client_tokens_per_s",
                       "run_model_tokens_per_s", "batches_per_stream"):
            assert stream[figure] > 0, figure
        assert stream["verdict"] in ("PASS", "FAIL")
    assert report["model"]["stream_paced"]["pace_s"] > 0
    from bench.render import render

    tables = render(report)
    assert "Model calls: storage of a conversation" in tables
    assert "Model calls: the stream journal's cost" in tables
