"""``perdure schedules`` and ``perdure start --delay/--at`` through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.engine_support import REPO_ROOT


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "perdure", "--store", f"sqlite:///{tmp_path / 's.db'}",
         "--key-dir", str(tmp_path / "keys"), "--app",
         "tests.integration.schedule_support:app", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_schedules_from_the_command_line(tmp_path: Path) -> None:
    made = _cli(tmp_path, "schedules", "create", "nightly", "tick", "--cron", "30 2 * * *",
                "--tz", "Europe/Paris", "--overlap", "buffer_one", "--args", '["m"]')
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("nightly  active  cron '30 2 * * *' (Europe/Paris)  tick")
    bad = _cli(tmp_path, "schedules", "create", "bad", "tick", "--cron", "61 * * * *",
               "--args", '["m"]')
    assert bad.returncode == 1
    assert bad.stderr == "error: cron '61 * * * *': 61 is out of range for the minute (0-59)\n"
    listed = _cli(tmp_path, "schedules", "--json")
    assert listed.returncode == 0, listed.stderr
    [doc] = json.loads(listed.stdout)
    assert doc["name"] == "nightly" and doc["overlap"] == "buffer_one"
    assert doc["state"] == "active" and doc["next_fire"] is not None
    paused = _cli(tmp_path, "schedules", "pause", "nightly")
    assert paused.returncode == 0 and paused.stdout == "pause sent to schedule nightly\n"
    back = _cli(tmp_path, "schedules", "backfill", "nightly", "--from", "2024-01-01T00:00:00Z",
                "--to", "2024-01-02T00:00:00Z")
    assert back.stdout == "backfill of 1 fire(s) sent to schedule nightly\n", back.stderr
    missing = _cli(tmp_path, "schedules", "trigger", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error: no schedule 'nope'")


def test_start_later_from_the_command_line(tmp_path: Path) -> None:
    started = _cli(tmp_path, "start", "clock", "--id", "d-1", "--delay", "3600")
    assert started.returncode == 0 and started.stdout == "d-1\n", started.stderr
    shown = _cli(tmp_path, "show", "d-1", "--json")
    obj = json.loads(shown.stdout)["object"]
    assert obj["status"] == "dormant" and obj["note"].startswith("waits to start at ")
    at = _cli(tmp_path, "start", "clock", "--id", "d-2", "--at", "2031-01-01T00:00:00+01:00")
    assert at.returncode == 0, at.stderr
    both = _cli(tmp_path, "start", "clock", "--id", "d-3", "--at", "1", "--delay", "1")
    assert both.returncode == 1 and both.stderr == "error: give --delay or --at, not both\n"
    naive = _cli(tmp_path, "start", "clock", "--id", "d-3", "--at", "2031-01-01T00:00:00")
    assert naive.returncode == 1 and "has no zone" in naive.stderr
    listed = json.loads(_cli(tmp_path, "ls", "--json").stdout)
    assert sorted(o["object_id"] for o in listed) == ["d-1", "d-2"]
