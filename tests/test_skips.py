"""The skip account (``tests/skips.py``): under CI a skip nobody expected fails the run.

Each case runs pytest in a child process (under pytest-xdist as CI does, once) on a folder of
two tests: one skipped for a reason ``tests/expected_skips.txt`` lists, one for a reason
it does not (as a missing browser or extra would).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skips import Expected, load

REPO_ROOT = Path(__file__).resolve().parents[1]

SAMPLE = '''
import pytest

@pytest.mark.skip(reason="soak variant: run with -m slow or PERDURE_RUN_SLOW=1")
def test_soak():
    pass

def test_browser():
    pytest.skip("no system chromium here")

def test_runs():
    assert True
'''

ONLY_EXPECTED = '''
import pytest

@pytest.mark.skip(reason="soak variant: run with -m slow or PERDURE_RUN_SLOW=1")
def test_soak():
    pass

@pytest.mark.xfail(reason="not a skip", strict=True)
def test_known_bug():
    raise AssertionError
'''


def _pytest(folder: Path, source: str, ci: str, workers: str = "0"
            ) -> subprocess.CompletedProcess[str]:
    (folder / "tests").mkdir()
    (folder / "tests" / "test_sample.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CI": ci,
           "PERDURE_TEST_BACKENDS": "sqlite,postgresql"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skips", "-p", "no:cacheprovider",
         "-n", workers, "tests"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_under_ci_an_unexpected_skip_fails_the_run_naming_test_and_reason(
        tmp_path: Path) -> None:
    done = _pytest(tmp_path, SAMPLE, ci="true", workers="2")  # reports reach the controller
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("UNEXPECTED SKIP tests/test_sample.py::test_browser: no system chromium here"
            in done.stdout), done.stdout
    assert "test_soak" not in done.stdout.split("skips:")[1].split("short test summary")[0]
    assert "1 passed, 2 skipped" in done.stdout


def test_locally_the_same_run_passes_and_says_what_did_not_run(tmp_path: Path) -> None:
    done = _pytest(tmp_path, SAMPLE, ci="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skips: 1 expected (expected_skips.txt), 1 not" in done.stdout
    assert "not run here: no system chromium here: tests/test_sample.py::test_browser" \
        in done.stdout


def test_under_ci_expected_skips_and_xfails_keep_the_run_green(tmp_path: Path) -> None:
    done = _pytest(tmp_path, ONLY_EXPECTED, ci="true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UNEXPECTED" not in done.stdout


def test_under_ci_a_backend_left_out_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_sample.py").write_text("def test_runs():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CI": "true",
           "PERDURE_TEST_BACKENDS": "sqlite"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skips", "-p", "no:cacheprovider",
         "-n", "0", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT RUN: PERDURE_TEST_BACKENDS leaves out postgresql" in done.stdout


def test_the_allow_list_parses_and_names_existing_places() -> None:
    """Every entry names a test file or folder that exists, so none goes stale unseen."""
    entries = load()
    assert entries and all(isinstance(e, Expected) for e in entries)
    for entry in entries:
        assert (REPO_ROOT / entry.where.rstrip("/")).exists(), entry


def test_a_malformed_allow_list_line_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "list.txt"
    bad.write_text("tests/ no bar here\n")
    with pytest.raises(ValueError, match=re.escape("expected 'PATH | REASON'")):
        load(bad)
