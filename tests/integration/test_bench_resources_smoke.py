"""``python -m bench --only resources --quick`` runs and prints its figures."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.integration.test_bench_smoke import _bench_backends, _run


def test_resources_bench_prints_its_figures(tmp_path: Path) -> None:
    """Per checkpoint count: resume and restore times and the memory's length, which
    checkpoints do not grow (they go to slots outside the chain); the resume ratio
    against the floor (speed itself is not checked)."""
    report = _run([sys.executable, "-m", "bench", "--only", "resources", "--no-peers"],
                  tmp_path)
    for name in _bench_backends():
        figures = report["backends"][name]["resources"]
        for count in ("1", "200"):
            assert figures[count]["ms_resume"] > 0 and figures[count]["ms_restore"] > 0
        assert figures["200"]["records"] == figures["1"]["records"]
        assert figures["restore_ratio"] > 0 and figures["resume_ratio"] > 0
        assert isinstance(figures["within_floor"], bool) and figures["floor"] > 1
