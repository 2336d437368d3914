"""The step benchmark runs end to end in quick mode and prints the figures it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_steps_bench_quick_prints_json_with_every_figure(tmp_path: Path) -> None:
    """``bench/steps.py --quick`` prints JSON with floor, sequential and concurrent figures.

    Speed is not checked: only that each figure is there and is a positive number.
    """
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "steps.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["quick"] is True
    assert {"cpus", "python", "sqlite", "db_dir", "disk"} <= set(report["machine"])
    assert report["baseline"]["us_per_call"] > 0
    assert set(report["modes"]) == {"full", "normal"}
    for mode in report["modes"].values():
        assert mode["floor"]["us_per_commit"] > 0
        assert mode["floor"]["commits_per_s"] > 0
        seq = mode["sequential"]
        for key in ("us_per_step", "us_per_step_median", "steps_per_s", "ratio_to_floor_commit"):
            assert seq[key] > 0, key
        assert seq["chain_verified"] is True
        conc = mode["concurrent"]
        for key in (
            "steps_per_s",
            "ratio_to_single_commit_rate",
            "commits",
            "appends",
            "appends_per_commit",
        ):
            assert conc[key] > 0, key
        assert conc["appends"] >= conc["commits"]
        assert conc["chain_verified"] is True
