"""``python -m bench --only quota --quick``: the model-quota figures are all there.

Speed is never checked, nor the floors (PASS/FAIL is a figure): only that every call
completed, that the provider's window never held more than the quota, and that each
figure is present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]


def test_quota_bench_quick_prints_every_figure(tmp_path: Path) -> None:
    """Share of the quota used, calls answered 429, the provider's peak window."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "quota", "--dir", str(tmp_path),
         "--backends", "sqlite_full", "--no-peers"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["parts"] == ["quota"]
    got = report["quota"]
    assert got["completed"] == got["objects"] > 0
    assert 0 < got["peak_window"] <= got["cap_tokens"]
    assert got["served_tokens"] > 0 and got["requests"] >= got["objects"]
    assert 0 < got["used"] <= 1 and 0 <= got["refused"] <= 1
    assert got["verdict"] in ("PASS", "FAIL")
    from bench.render import render

    assert "Model quotas: share used, calls refused" in render(report)
