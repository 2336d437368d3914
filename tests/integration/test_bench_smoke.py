"""The benchmarks run end to end in quick mode and print the figures they promise.

Speed is never checked: only that each figure is there, for every backend under test
(``PERDURE_TEST_BACKENDS``, see ``tests/pg.py``), and is a positive number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.pg import ADMIN_URL, BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def _bench_backends() -> list[str]:
    # SQLite NORMAL is the FULL code path with another pragma: the smoke run leaves it
    # out to stay short.
    names = []
    if "sqlite" in BACKENDS:
        names.append("sqlite_full")
    if "postgresql" in BACKENDS:
        names.append("postgresql")
    return names


def _run(args: list[str], tmp_path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [*args, "--quick", "--dir", str(tmp_path), "--pg", ADMIN_URL,
         "--backends", ",".join(_bench_backends())],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["quick"] is True
    assert set(report["backends"]) == set(_bench_backends())
    assert {"cpus", "python", "sqlite", "db_dir", "disk"} <= set(report["machine"])
    if "postgresql" in report["backends"]:
        assert "server_version" in report["machine"]["postgresql"]
    return report


def _check_steps(figures: dict[str, Any]) -> None:
    assert figures["floor"]["us_per_commit"] > 0
    assert figures["floor"]["commits_per_s"] > 0
    seq = figures["sequential"]
    for key in ("us_per_step", "us_per_step_median", "steps_per_s", "ratio_to_floor_commit"):
        assert seq[key] > 0, key
    assert seq["chain_verified"] is True
    conc = figures["concurrent"]
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


def _check_e2e(figures: dict[str, Any]) -> None:
    """The end-to-end part: every figure beside its floor and goal (the lag: ms or n/a)."""
    e2e = figures["e2e"]
    assert e2e["worker_options"] == "defaults"
    assert e2e["floor"]["us_per_commit"] > 0 and e2e["floor"]["commits_per_s"] > 0
    assert set(e2e["goals"]) == {"sequential_ratio_max", "concurrent_ratio_min",
                                 "start_result_p50_ms_max", "start_result_p99_ms_max",
                                 "idle_cpu_percent_max"}
    for name, agent in (("sequential", "sync_steps"), ("sequential_def_agent",
                                                       "sync_steps_def")):
        seq = e2e[name]
        assert seq["agent"] == agent
        for key in ("us_per_step", "us_per_step_median", "steps_per_s",
                    "ratio_to_floor_commit", "ms_start_to_first_step"):
            assert seq[key] > 0, (name, key)
        assert seq["chain_verified"] is True
    conc = e2e["concurrent"]
    for key in ("steps_per_s", "client_steps_per_s", "ratio_to_single_commit_rate"):
        assert conc[key] > 0, key
    assert conc["chain_verified"] is True
    lat = e2e["start_result"]
    assert lat["pairs"] > 0
    for key in ("ms_p50", "ms_p90", "ms_p99", "ms_max", "start_call_ms_median",
                "start_to_step_ms_median", "floor_ms"):
        assert lat[key] > 0, key
    assert lat["ms_p50"] <= lat["ms_p99"] <= lat["ms_max"]
    assert lat["chain_verified"] is True
    queued = e2e["queued_start_result"]
    assert queued["pairs"] > 0 and 0 < queued["ms_p50"] <= queued["ms_p99"]
    assert queued["chain_verified"] is True
    idle = e2e["idle_cpu"]
    assert idle["seconds"] > 0 and idle["percent_of_core"] >= 0
    lag = e2e["loop_lag"]
    assert ("ms" in lag and lag["ms"] >= 0) or lag["na"]


def test_steps_bench_quick_prints_every_figure_per_backend(tmp_path: Path) -> None:
    """``bench/steps.py --quick`` still runs as a script: floor, sequential, concurrent."""
    report = _run([sys.executable, str(ROOT / "bench" / "steps.py")], tmp_path)
    assert report["baseline"]["us_per_call"] > 0
    for figures in report["backends"].values():
        _check_steps(figures)


def test_all_benchmarks_quick_print_every_figure_per_backend(tmp_path: Path) -> None:
    """``python -m bench --quick --no-peers``: every perdure part per backend.

    The peers (DBOS, LangGraph) are left out to keep this fast and free of optional
    packages; ``test_peers_quick_print_figures_or_na`` covers them.
    """
    parts = ["steps", "wake", "claims", "recovery", "history", "model", "resources", "ui",
             "e2e", "dormant"]
    # Every part but quota, whose worker processes and provider window take half a
    # minute of their own (test_bench_quota_smoke.py); the parts are the bench's own list.
    from bench.run import PARTS
    assert [*parts, "quota"] == list(PARTS)
    report = _run([sys.executable, "-m", "bench", "--no-peers", "--only", ",".join(parts)],
                  tmp_path)
    assert report["parts"] == parts
    # (resources, dormant: test_bench_resources_smoke.py, test_bench_dormant_smoke.py)
    ui = report["ui"]  # the dashboard's list, on SQLite whatever the backends
    assert ui["objects"] > 0 and ui["verdict"] in ("PASS", "FAIL")
    for case in ("first_page", "deep_pages", "status", "agent", "label", "id_search",
                 "http_page"):
        assert ui[case]["median_ms"] > 0
    # model calls run once, on SQLite, whatever the backends (test_bench_model_smoke.py)
    if "na" not in report["model"]:
        assert report["model"]["stream"]["run_model_tokens_per_s"] > 0
        assert "langgraph" not in report["model"]["conversation"]["10"]
    assert "peers" not in report
    for name, figures in report["backends"].items():
        _check_steps(figures)
        wake = figures["wake"]
        expected = {"notify"} if name == "postgresql" else {"push"}
        assert set(wake) == expected
        for how in wake.values():
            for key in ("ms_p50", "ms_p90", "ms_p99", "ms_max", "send_call_ms_median"):
                assert how[key] > 0, key
            assert how["wakes"] > 0
            assert how["chain_verified"] is True
        claims = figures["claims"]
        assert set(claims) == {"1", "2", "4"}
        for workers, got in claims.items():
            assert got["workers"] == int(workers)
            assert got["objects_per_s"] > 0
            assert sum(got["objects_per_worker"]) == got["objects"]
            assert got["chain_verified"] is True
        rec = figures["recovery"]
        assert rec["reexecuted_finished_steps"] >= 0 and rec["reexecuted_steps"] >= 0
        assert rec["ms_to_first_resumed_step"] > 0 and rec["ms_to_completion"] > 0
        assert rec["chain_verified"] is True
        for got in figures["resume"].values():
            assert got["ms_claim_to_next_step"] > 0 and got["store_bytes"] > 0
            assert got["chain_verified"] is True
        assert any(k.startswith("marginal") for k in figures["storage"]["perdure"])
        _check_e2e(figures)
        assert set(figures["seconds"]) == set(report["parts"]) - {"model", "ui"}
    from bench.render import render

    tables = render(report)
    for title in ("Durable steps", "Wake latency", "Claim throughput", "Crash recovery",
                  "Resume cost and storage", "Model calls", "Dashboard: the objects list",
                  "Through a worker process"):
        assert title in tables


def test_peers_quick_print_figures_or_na(tmp_path: Path) -> None:
    """The peers in quick mode on SQLite: a figure, or "n/a" with its reason, per workload
    (steps, and the end-to-end part beside perdure's through a worker process).

    Without ``perdure[bench]`` installed every peer workload is "n/a: ... not installed".
    """
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--dir", str(tmp_path),
         "--backends", "sqlite_full", "--only", "steps,e2e"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["peers"]) == {"dbos_sqlite", "langgraph_sqlite",
                                    "langgraph_stategraph_sqlite"}
    for peer in report["peers"].values():
        got = peer["steps"]
        if "na" in got:
            assert got["na"]
        else:
            assert got["sequential"]["us_per_step"] > 0
            assert got["concurrent"]["steps_per_s"] > 0
        e2e = peer["e2e"]
        if "na" in e2e:
            assert e2e["na"]
        else:
            assert peer["peer"] == "dbos"
            assert e2e["sequential"]["us_per_step"] > 0
            assert e2e["concurrent"]["steps_per_s"] > 0
            assert 0 < e2e["start_result"]["ms_p50"] <= e2e["start_result"]["ms_p99"]
            assert e2e["idle_cpu"]["percent_of_core"] >= 0
    _check_e2e(report["backends"]["sqlite_full"])
    from bench.render import render

    assert "Steps: perdure and peers" in render(report)
    assert "Through a worker process" in render(report)
    assert "Time taken by each part" in render(report)


def test_peer_history_skips_a_length_predicted_too_slow() -> None:
    """How long a peer's next history length is predicted to take (beyond the limit: n/a)."""
    from bench.peers import _predict

    guess, growth = _predict({10: 1.0, 1000: 10.0}, 10000)  # fixed 1 s, then linear
    assert guess == 91.0 and "N^1.00" in growth
    guess, growth = _predict({10: 1.0, 100: 2.0, 1000: 101.0}, 10000)  # quadratic
    assert round(guess) == 10001 and "N^2.00" in growth
