"""The coding-agent example end to end: clone, dev server, migration, SIGKILL, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_example(tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "coding_agent.py"), str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=150, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_coding_agent_example_comes_back_after_a_kill(tmp_path: Path) -> None:
    """The example's second worker restores the directory, environment and dev server,
    resumes the migration at statement 13 and serves the clone's page; the restore
    report is printed, and the secret token is not. Run again in the same folder, it
    does it all again (a new object, in a working directory of its own)."""
    for _ in range(2):
        _check(_run_example(tmp_path), tmp_path)


def _check(out: str, tmp_path: Path) -> None:
    assert "worker killed after migration statement 12" in out
    assert "'resumed_at': 13" in out and "'applied': 20" in out
    assert "hello from the clone" in out
    assert "restore_report: restore restored" in out
    for name in ("work", "repo", "env", "server"):
        assert f"{name} restored" in out
    assert "tok-" not in out
    # The token went from the Environment into the dev server's descriptor: still a
    # Secret there, so neither the store's files nor `perdure show --json` hold it.
    demo = tmp_path / "demo"
    token = b"tok-" + b"x" * 16
    stored = [p for p in demo.glob("store.db*") if p.is_file()]
    assert stored and all(token not in p.read_bytes() for p in stored)
    listed = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", f"sqlite:///{demo / 'store.db'}",
         "--key-dir", str(demo / "keys"), "ls", "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=True)
    oids = [o["object_id"] for o in json.loads(listed.stdout)]
    assert oids
    for oid in oids:
        shown = subprocess.run(
            [sys.executable, "-m", "perdure", "--store", f"sqlite:///{demo / 'store.db'}",
             "--key-dir", str(demo / "keys"), "show", oid, "--json"],
            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=True)
        assert '"server"' in shown.stdout and token.decode() not in shown.stdout
