"""``perdure demo --agent`` end to end: low-risk tools run alone, a risky call waits for a
person while its worker is SIGKILLed, approval from the CLI's API, another worker goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

import perdure
from perdure.core.records import Kind


def test_agent_demo_asks_a_person_and_survives_the_kill(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERDURE_", "OPENAI_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "demo", "--agent", "--dir", str(folder), "--fresh"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for line in ("kill worker A with SIGKILL", "lease held by: nobody", "approvals",
                 "left in tmp: ['notes.txt']", "messages posted: 1", "verify ok",
                 "agent demo passed"):
        assert line in output, (line, output)
    app = perdure.App(store=f"sqlite:///{folder / 'demo.db'}", key_dir=folder / "keys")
    try:
        records = app.history("agent-demo-1")
        decided = [r for r in records if r.kind == Kind.TOOL_DECIDED]
        assert [r.body["name"] for r in decided] == ["delete_files", "send_message"]
        assert all(r.body["identity"] == "demo-operator" for r in decided)
        assert {r.node_id for r in records if r.kind == Kind.TOOL_RESULT} >= {"demo-node-b"}
        assert app.verify("agent-demo-1").ok
    finally:
        app.close()


def test_the_approvals_example_runs_offline_and_replays_from_memory(tmp_path: Path) -> None:
    """``examples/approvals.py``: the safe call runs, the risky one is approved, the answer
    is printed; run again, the finished object answers from memory."""
    example = Path(__file__).resolve().parents[2] / "examples" / "approvals.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERDURE_", "OPENAI_"))}
    runs = [subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                           timeout=90, env=env, cwd=tmp_path) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Done: it is sunny in Oslo and the team knows." in proc.stdout
    assert "approving 3:0" in runs[0].stdout and "approving" not in runs[1].stdout
