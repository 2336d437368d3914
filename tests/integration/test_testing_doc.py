"""docs/howto/testing.md's examples, copied as the page says and run as a user would.

Every ``python`` block of the page names its file in its first line; the blocks are
written to an empty folder in order, ``python record_histories.py`` runs once, then
``pytest`` runs there (child processes, with this interpreter). Then the agent is
changed as the page describes (``lookup_order`` moved after the sleep) and the kept
history must fail to replay with the error the page shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "howto" / "testing.md"

pytestmark = pytest.mark.timeout(240)


def _files(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        first, _, rest = block.partition("\n")
        match = re.fullmatch(r"# (\w+\.py)", first.strip())
        assert match, f"a python block of {DOC.name} does not name its file: {first!r}"
        files[match.group(1)] = files.get(match.group(1), "") + rest + "\n"
    return files


def _run(args: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, *args], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=200, check=False)


def test_the_testing_howto_runs_as_written(tmp_path: Path) -> None:
    files = _files(DOC.read_text())
    assert set(files) == {"support_bot.py", "test_support_bot.py", "record_histories.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    recorded = _run(["record_histories.py"], tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    assert (tmp_path / "histories" / "follow-up-answered.json").exists()
    tests = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                  "test_support_bot.py"], tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert re.search(r"\b8 passed\b", tests.stdout), tests.stdout

    bot = tmp_path / "support_bot.py"
    moved = bot.read_text().replace(
        "    order = await run.step(lookup_order, order_id)\n    await run.sleep(DAY)\n",
        "    await run.sleep(DAY)\n    order = await run.step(lookup_order, order_id)\n")
    assert moved != bot.read_text()
    bot.write_text(moved)
    changed = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "test_support_bot.py", "-k", "replays_the_kept"], tmp_path)
    assert changed.returncode == 1, changed.stdout
    said = " ".join(changed.stdout.split())
    assert ("diverges: at command #0: recorded step('lookup_order'), code asks for "
            "sleep(None)") in said, changed.stdout
    assert "ReplayFailedError" in said
