"""``python -m bench --only dormant --quick`` runs and prints its figures."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.integration.test_bench_smoke import _bench_backends, _run


def test_dormant_bench_prints_its_figures(tmp_path: Path) -> None:
    """Per dormant count: the store holds that many dormant objects (copies of two real
    ones), and the idle queries, the idle worker's CPU and a new object's latency are
    there (speed itself is not checked)."""
    report = _run([sys.executable, "-m", "bench", "--only", "dormant", "--no-peers"],
                  tmp_path)
    for name in _bench_backends():
        figures = report["backends"][name]["dormant"]
        assert set(figures) == {"0", "2000", "10000"}
        for count, got in figures.items():
            assert got["dormant_rows"] == int(count)
            assert got["next_ready_at_us"] > 0 and got["empty_claim_us"] > 0
            assert got["idle_cpu_pct"] >= 0 and got["idle_s"] > 0
            assert 0 < got["start_to_step_ms_p50"] <= got["start_to_result_ms_max"]
            assert got["starts"] == 3
    from bench.render import render

    assert "Dormant objects" in render(report)
